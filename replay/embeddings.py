"""The replay model's embeddings: deterministic vectors from hashed character trigrams and words.

No model ships with Tasuki, so these vectors only know surface form; they are real vectors all the
same (unit length, cosine-comparable), so the demo and the tests run memory's vector path offline.
"""

from __future__ import annotations

import hashlib
import math
import re

DIMENSIONS = 64
_WORD = re.compile(r"[^\W_]+")


def _bucket(feature: str) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "big") % DIMENSIONS, 1.0 if digest[4] & 1 else -1.0


def embed_text(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector of ``dimensions`` floats for ``text`` (all zeros but one for an empty text)."""
    vector = [0.0] * dimensions
    lowered = " ".join(text.lower().split())
    features = [lowered[i : i + 3] for i in range(max(len(lowered) - 2, 0))] + _WORD.findall(lowered)
    for feature in features:
        index, sign = _bucket(feature)
        vector[index % dimensions] += sign
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]
