"""The replay model's embeddings: deterministic vectors from hashed character trigrams and words.

No model ships with Tasuki, so these vectors only know surface form; they are real vectors all the
same (unit length, cosine-comparable), so the demo and the tests run memory's vector path offline.
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import lru_cache

DIMENSIONS = 64
_WORD = re.compile(r"[^\W_]+")


@lru_cache(maxsize=1 << 16)  # text repeats its trigrams and words: hash each once (recall embeds per query)
def _bucket(feature: str, dimensions: int) -> tuple[int, float]:
    """The index (over all ``dimensions``) and sign a feature adds to: the feature hashing trick."""
    digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "big") % dimensions, 1.0 if digest[4] & 1 else -1.0


def embed_text(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector of ``dimensions`` floats for ``text`` (all zeros but one for an empty text). Features spread
    over every dimension (until issue 29 they fell in the first 64 only, whatever the size asked)."""
    vector = [0.0] * dimensions
    lowered = " ".join(text.lower().split())
    features = [lowered[i : i + 3] for i in range(max(len(lowered) - 2, 0))] + _WORD.findall(lowered)
    for feature in features:
        index, sign = _bucket(feature, dimensions)
        vector[index] += sign
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


def dimensions_for(model: str) -> int:
    """Vectors have :data:`DIMENSIONS` floats, or N for a model named ``...-N`` (tests change dimension so)."""
    tail = model.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() and 0 < int(tail) <= 4096 else DIMENSIONS


def embedding_inputs(body: object) -> list[str] | None:
    """The texts of an embeddings request (``input``, a string or a list of strings); None if malformed."""
    if not isinstance(body, dict):
        return None
    given = body.get("input")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and all(isinstance(t, str) for t in given):
        return list(given)
    return None


def openai_embeddings(texts: list[str], model: str) -> dict[str, object]:
    """A ``/v1/embeddings`` answer as the OpenAI API gives it (``encoding_format`` float)."""
    size = dimensions_for(model)
    tokens = sum(max(len(t.encode()) // 4, 1) for t in texts)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": embed_text(t, size)} for i, t in enumerate(texts)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def ollama_embeddings(texts: list[str], model: str) -> dict[str, object]:
    """An ``/api/embed`` answer as Ollama gives it."""
    size = dimensions_for(model)
    return {
        "model": model,
        "embeddings": [embed_text(t, size) for t in texts],
        "total_duration": 0,
        "load_duration": 0,
        "prompt_eval_count": sum(max(len(t.encode()) // 4, 1) for t in texts),
    }
