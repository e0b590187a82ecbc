"""Memory that outlives a task (SPEC §13): episodes, thread and repository memories, hybrid recall.

Pure Python like ``contexts``: never imports Celery or Redis.  The worker makes the model calls.
"""

from memory.errors import EmbeddingError, MemoryUnavailable
from memory.recall import Hit, Ranks
from memory.records import Episode, Memory, RepositoryCount, StoreStatus, parse_repository, repository_key, thread_key
from memory.store import MemoryStore

__all__ = [
    "EmbeddingError",
    "Episode",
    "Hit",
    "Memory",
    "MemoryStore",
    "MemoryUnavailable",
    "Ranks",
    "RepositoryCount",
    "StoreStatus",
    "parse_repository",
    "repository_key",
    "thread_key",
]
