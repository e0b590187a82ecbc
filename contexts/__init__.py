"""Tasuki's durable context store: one directory per task, written so that another worker can resume it.

Pure Python: this package never imports Celery or Redis (SPEC §1).
"""

from contexts.compression import CompressionPolicy, Summarizer, SummaryRejectedError
from contexts.context import Context
from contexts.errors import (
    ContextCompletedError,
    ContextError,
    ContextExistsError,
    ContextNotFoundError,
    CorruptRecordError,
    FencedError,
    InvalidUUIDError,
    LockHeldError,
    TasukiError,
)
from contexts.lock import LockInfo, is_stale
from contexts.store import ContextStore, validate_uuid

__all__ = [
    "CompressionPolicy",
    "Context",
    "ContextCompletedError",
    "ContextError",
    "ContextExistsError",
    "ContextNotFoundError",
    "ContextStore",
    "CorruptRecordError",
    "FencedError",
    "InvalidUUIDError",
    "LockHeldError",
    "LockInfo",
    "Summarizer",
    "SummaryRejectedError",
    "TasukiError",
    "is_stale",
    "validate_uuid",
]
