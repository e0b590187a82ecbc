"""One owner token for every effect outside the context (SPEC §4 "Fencing", §12 "Fenced at the edges too").

The token that fences the context's own files also guards what a task does elsewhere. Model calls and tool runs
are preceded by :data:`OwnerCheck` (``Context.assert_owner``): a holder that lost the task raises
:class:`~contexts.FencedError` there instead of acting. The effects that land outside the host — a git push, a
forge write — run inside :meth:`Fence.holding` (``Context.holding``): the same check, and in fleet mode the lease
row of the holder's epoch held in PostgreSQL until the effect is over, so an effect lands only while the epoch is
current and a takeover waits for one in flight (fleet/durable.py). Git is fenced at the remote too: pushes carry a
lease on the checkpoint branch that every takeover moves, against the commit recorded under the epoch
(worker/checkout.py), and a takeover sets the previous holder's checkout aside before it works in that directory.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

OwnerCheck = Callable[[], None]
"""Raises :class:`~contexts.FencedError` when this process no longer holds the task."""

# Only the benchmark turns this off (bench/unfenced_worker.py), to price the check against the code path
# without it in the same run: no check, plain --force pushes, no claim, no checkout set aside.
ENFORCED = True


class Fence(Protocol):
    """What an effect outside the context is fenced by: ``contexts.Context`` is one."""

    def holding(self, checkpoint: str | None = None) -> AbstractContextManager[str | None]:
        """Raise :class:`~contexts.FencedError` when this process no longer holds the task; else the effect in the
        block lands only while it does. Yields the checkpoint commit recorded under its lease (None: nothing records
        one), and records ``checkpoint`` when given."""


class _Unfenced:
    """The fence of a caller that holds no context (tests of the checkout alone, tools run by hand)."""

    def holding(self, checkpoint: str | None = None) -> AbstractContextManager[str | None]:
        return nullcontext(None)


UNFENCED: Fence = _Unfenced()


def unchecked() -> None:
    """The check of a caller that holds no context."""


def owner_check(check: OwnerCheck) -> OwnerCheck:
    """``check`` itself, or :func:`unchecked` while the benchmark has fencing off."""
    return check if ENFORCED else unchecked


def fence_of(holder: Fence) -> Fence:
    """``holder`` itself, or :data:`UNFENCED` while the benchmark has fencing off."""
    return holder if ENFORCED else UNFENCED
