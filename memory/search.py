"""Recall as a task (and ``tasuki memory search``) runs it: the store's searches, then :mod:`memory.recall`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Protocol

from memory.errors import EmbeddingError
from memory.recall import BM25_K, KNN_K, VECTOR_WEIGHT, Hit, fuse, queries, reachable, rerank
from memory.records import Match
from memory.store import MemoryStore


class Embedder(Protocol):
    """Turns texts into vectors (the worker's: OpenAI ``/v1/embeddings``, Ollama's embed API, the local model)."""

    model: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text; raises EmbeddingError when the model cannot answer."""
        ...


@dataclass(frozen=True)
class Recall:
    """What recall found, and how: ``mode`` is ``hybrid`` or ``bm25``; ``note`` says why BM25 only; ``embedder``
    names the embedding model whose vectors were searched (None: BM25 only)."""

    hits: list[Hit]
    mode: str
    note: str | None = None
    embedder: str | None = None


def embed_checked(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """The embedder's vectors, refused unless one per text, all of one non-zero dimension, all finite."""
    vectors = embedder.embed(list(texts))
    if len(vectors) != len(texts):
        raise EmbeddingError(f"embedding model answered {len(vectors)} vectors for {len(texts)} texts")
    sizes = {len(v) for v in vectors}
    if len(sizes) != 1 or 0 in sizes:
        raise EmbeddingError(f"embedding model answered vectors of dimensions {sorted(sizes)}")
    if not all(map(math.isfinite, chain.from_iterable(vectors))):
        raise EmbeddingError("embedding model answered a vector that is not finite")
    return vectors


def recall(
    store: MemoryStore,
    repository: str,
    text: str,
    *,
    recent_messages: Sequence[str] = (),
    embedder: Embedder | None = None,
    now: datetime,
    limit: int = 5,
    vector_weight: float = VECTOR_WEIGHT,
) -> Recall:
    """SPEC §13's pipeline over one repository's episodes; with no (working) embedder, BM25 + rerank.
    ``vector_weight``: how far the vectors are trusted against BM25 (``memory.vector_weight``)."""
    asked = queries(text, recent_messages)
    bm25_lists = [store.bm25_scored(repository, q, BM25_K) for q in asked]
    vector_lists: list[list[Match]] = []
    note: str | None = None if embedder is not None else "no embedding model configured: BM25 only"
    if embedder is not None:
        try:
            vector_lists = [store.knn_scored(repository, v, KNN_K) for v in embed_checked(embedder, asked)]
        except EmbeddingError as exc:
            note = f"embedding failed, BM25 only: {exc}"
    candidates = fuse(bm25_lists, vector_lists, vector_weight)
    vectors = any(vector_lists)
    episodes = store.fetch(repository, reachable(candidates, vectors=vectors))
    hits = rerank(text, candidates, episodes, now, limit, vectors=vectors)
    used = embedder.model if embedder is not None and not note else None
    return Recall(hits, "bm25" if note else "hybrid", note, used)
