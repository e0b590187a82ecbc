"""The seam between memory and where it is kept: the :class:`MemoryStore` Protocol (SPEC §13).

The embedded default is :class:`memory.sqlite.SQLiteMemoryStore`; a fleet beyond one host puts a
server-backed store behind the same methods, so nothing here assumes one file.  Every read takes the
repository it is for: a task never sees another repository's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from memory.records import Episode, Match, Memory, RepositoryCount, StoreStatus


class MemoryStore(Protocol):
    """Episodes, thread memories and repository memories, searchable by BM25 and by vector."""

    def add_episode(self, episode: Episode, vector: Sequence[float] | None = None) -> None:
        """Record (or replace) the episode of a task; a vector of the wrong dimension raises EmbeddingError
        and writes nothing."""
        ...

    def episode(self, uuid: str) -> Episode | None:
        """One episode by its task's UUID."""
        ...

    def episodes(self, repository: str, limit: int = 100) -> list[Episode]:
        """A repository's episodes, newest first."""
        ...

    def vector(self, uuid: str) -> list[float] | None:
        """The episode's stored vector, or None (no such episode, or it has none)."""
        ...

    def fetch(self, repository: str, uuids: Sequence[str]) -> dict[str, Episode]:
        """The episodes of ``uuids`` that belong to ``repository``."""
        ...

    def bm25(self, repository: str, query: str, k: int) -> list[str]:
        """UUIDs of the repository's episodes best matching ``query`` by BM25, best first."""
        ...

    def knn(self, repository: str, vector: Sequence[float], k: int) -> list[str]:
        """UUIDs of the repository's episodes nearest to ``vector`` (cosine), nearest first."""
        ...

    def bm25_scored(self, repository: str, query: str, k: int) -> list[Match]:
        """:meth:`bm25` with each episode's BM25 score (higher is better, 0 or more), for score fusion."""
        ...

    def knn_scored(self, repository: str, vector: Sequence[float], k: int) -> list[Match]:
        """:meth:`knn` with each episode's cosine similarity, for score fusion."""
        ...

    def memory(self, scope: str, key: str) -> Memory | None:
        """The thread (``scope="thread"``) or repository memory of ``key``."""
        ...

    def thread_memories(self, repository: str) -> list[Memory]:
        """Every thread memory of a repository, newest first."""
        ...

    def put_memory(self, memory: Memory, repository: str) -> None:
        """Replace a thread or repository memory."""
        ...

    def repositories(self) -> list[RepositoryCount]:
        """Repositories that have episodes or memories."""
        ...

    def forget_episode(self, uuid: str) -> int:
        """Delete one episode (row, full-text entry, vector); how many were deleted."""
        ...

    def forget_thread(self, thread: str) -> int:
        """Delete a thread's episodes and its memory; how many episodes were deleted."""
        ...

    def forget_repository(self, repository: str) -> int:
        """Delete everything of a repository; how many episodes were deleted."""
        ...

    def prune(self, before: datetime, *, dry_run: bool = False) -> list[str]:
        """Delete (or with ``dry_run`` only list) episodes that ended before ``before``."""
        ...

    def note_problem(self, problem: str | None) -> None:
        """Remember the latest problem (an embedding failure, say) for ``tasuki memory status``."""
        ...

    def status(self) -> StoreStatus:
        """Counts, vector dimension and the latest problem."""
        ...

    def close(self) -> None:
        """Let go of the store's resources."""
        ...
