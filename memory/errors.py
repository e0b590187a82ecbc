"""Errors of the memory store; each one line for an operator, and picklable like every Tasuki error."""

from __future__ import annotations

from contexts.errors import TasukiError


class MemoryUnavailable(TasukiError):
    """The memory store cannot be used (locked, damaged, unwritable): the task goes on without memory."""


class EmbeddingError(TasukiError):
    """The embedding model failed (timeout, an error, vectors of the wrong dimension): recall is BM25 only."""
