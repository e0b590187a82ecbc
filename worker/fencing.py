"""One owner check for every effect outside the context (SPEC §4 "Fencing", §12 "Fenced at the edges too").

The token that fences the context's own files (the ``.lock``'s owner) also guards what a task does elsewhere:
the worker calls :data:`OwnerCheck` — ``Context.assert_owner`` — right before a model call, a tool run, a git
push and a forge write, and a holder that lost its lock raises :class:`~contexts.FencedError` there instead of
acting. A check cannot close the moment between itself and the effect (a holder paused right after it), so
git and the checkout are fenced by the remote and the file system too: pushes carry a lease on the
checkpoint branch that every takeover moves (worker/checkout.py), and a takeover sets the previous holder's
checkout aside before it works in that directory. A lease epoch in PostgreSQL can replace the check behind
the same call.
"""

from __future__ import annotations

from collections.abc import Callable

OwnerCheck = Callable[[], None]
"""Raises :class:`~contexts.FencedError` when this process no longer holds the task."""

# Only the benchmark turns this off (bench/unfenced_worker.py), to price the check against the code path
# without it in the same run: no check, plain --force pushes, no claim, no checkout set aside.
ENFORCED = True


def unchecked() -> None:
    """The check of a caller that holds no context (tests of the checkout alone, tools run by hand)."""


def owner_check(check: OwnerCheck) -> OwnerCheck:
    """``check`` itself, or :func:`unchecked` while the benchmark has fencing off."""
    return check if ENFORCED else unchecked
