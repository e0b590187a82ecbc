"""Tasuki's one error hierarchy.

Every error Tasuki raises on purpose derives from :class:`TasukiError`.  Celery pickles exceptions
across processes, so each error is constructed from a single message string (``args == (message,)``)
and survives ``pickle`` round trips unchanged.
"""

from __future__ import annotations


class TasukiError(Exception):
    """Base of every error Tasuki raises on purpose; its message is one line meant for an operator."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ContextError(TasukiError):
    """Something is wrong with a context directory or how it is used."""


class InvalidUUIDError(ContextError):
    """A string that should be a context UUID is not one (or would leave the contexts root)."""


class ContextNotFoundError(ContextError):
    """No context with that UUID exists under ``running/`` or ``completed/``."""


class ContextExistsError(ContextError):
    """``create`` was asked for a UUID that already has a context."""


class ContextCompletedError(ContextError):
    """The context is already finished; it can be read but no longer written or resumed."""


class LockHeldError(ContextError):
    """Another live holder has the context's ``.lock``."""


class FencedError(ContextError):
    """This holder's lock was taken over; it must not write to the context again."""


class StoreUnavailable(ContextError):
    """The durable copy's store (many hosts: the fleet's database) cannot be reached; nothing was written, and the
    same call may succeed later."""


class CorruptRecordError(ContextError):
    """A file of the context cannot be parsed (other than a torn last JSONL line, which is expected)."""


# What reading a damaged or hand-edited record can raise (a null where a number belongs, 1e999, a list where
# an object belongs): bad data to report and skip, never a reason to stop a pass over every context.
BAD_DATA_ERRORS: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, AttributeError, OverflowError)
