"""What the monitor does about each context it looked at — a pure function of what it saw and ``now``.

The shape of rq's ``StartedJobRegistry.cleanup``: find the expired entries, then retry or fail each one.
Here the entries are contexts whose holder stopped heartbeating (SPEC §4, §7), plus interrupted
completions (SPEC §3 rule 9).  :func:`plan` decides; :mod:`scheduler.monitor` observes and carries out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from contexts.clock import iso
from contexts.lock import LockInfo, is_stale
from contexts.repair import final_status_of

ActionKind = Literal["resume", "fail", "repair", "skip"]
Repair = Literal["finish_move", "finish_status", "remove_completed_lock", "drop_running_copy", "unindex"]
LOST_ERROR = "worker lost: heartbeat stale since {since}"


@dataclass(frozen=True)
class Copy:
    """One directory of a context as the monitor read it (``running/`` or ``completed/``)."""

    status: str
    updated_at: datetime
    attempt: int = 1
    handbacks: int = 0  # attempts that ended in a clean hand-back (warm shutdown): they do not count as lost
    cancel_requested: bool = False
    error: str | None = None
    final_status: str | None = None
    lock: LockInfo | None = None
    holder_alive: bool = False
    """``kill -0`` of the lock's process succeeded on this host (always false for another host's lock)."""
    lease_live: bool | None = None
    """Fleet mode, a context this host has no directory of: the durable copy's last committed state, whose lease
    (not a ``.lock``) says whether its holder lives — by the store's clock. None: this host's own directory."""
    lease_owner: str | None = None
    """That lease's holder and epoch, so a resume can tell that someone took the context over meanwhile."""


@dataclass(frozen=True)
class Seen:
    """A context the monitor looked at: its copies, and whether the heartbeat index lists it."""

    uuid: str
    running: Copy | None = None
    completed: Copy | None = None
    indexed: bool = False
    unreadable: str | None = None
    """Why a copy could not be read (an operator's edit, a disk error); such a context is only reported."""


@dataclass(frozen=True)
class Policy:
    """The settings :func:`plan` needs (``monitor.*``, ``contexts.stale_after_s``) and this host's name."""

    stale_after_s: float
    max_attempts: int
    resume: bool
    hostname: str
    hung_after_s: float | None = None
    """A live holder of this host silent this long is taken over (and killed) all the same (None: never)."""


@dataclass(frozen=True)
class Action:
    """One thing to do to one context; ``reason`` is for the operator and the log."""

    uuid: str
    kind: ActionKind
    reason: str
    repair: Repair | None = None
    attempt: int = 0
    error: str | None = None
    """The error a ``fail`` records."""
    owner: str | None = None
    """The stale lock's owner token, so a resume can tell that someone took the context over meanwhile."""


def plan(contexts_seen: list[Seen], now: datetime, policy: Policy) -> list[Action]:
    """Every action for ``contexts_seen``, in order; contexts that need nothing get none."""
    actions: list[Action] = []
    for seen in contexts_seen:
        actions.extend(_plan_one(seen, now, policy))
    return actions


def _plan_one(seen: Seen, now: datetime, policy: Policy) -> list[Action]:
    if seen.unreadable is not None:
        return [Action(seen.uuid, "skip", f"unreadable: {seen.unreadable}")]
    running, completed = seen.running, seen.completed
    if running is None and completed is None:
        return [_repair(seen.uuid, "unindex", "no context on disk any more")] if seen.indexed else []
    actions = _plan_completed(seen.uuid, completed, now, policy) if completed is not None else []
    if running is None:
        if seen.indexed and completed is not None and completed.status != "completing":
            actions.append(_left_in_the_index(seen.uuid, completed, now, policy))
        return actions
    if _live(running, now, policy):
        return [*actions, Action(seen.uuid, "skip", f"held by a live worker ({_holder(running)})")]
    if completed is not None:
        return [*actions, _repair(seen.uuid, "drop_running_copy", "in both running/ and completed/")]
    return [*actions, *_plan_running(seen.uuid, running, now, policy)]


def _plan_completed(uuid: str, copy: Copy, now: datetime, policy: Policy) -> list[Action]:
    actions = []
    if copy.lock is not None:
        if _live(copy, now, policy):
            actions.append(Action(uuid, "skip", f"completed copy has a live lock ({_holder(copy)})"))
        else:
            actions.append(_repair(uuid, "remove_completed_lock", "leftover .lock in completed/"))
    if copy.status == "completing" and _quiet(copy, now, policy):
        status = copy.final_status or final_status_of({"error": copy.error})
        actions.append(_repair(uuid, "finish_status", f"completed/ copy still completing; becomes {status}"))
    return actions


def _plan_running(uuid: str, copy: Copy, now: datetime, policy: Policy) -> list[Action]:
    if copy.lease_live is not None and copy.status == "completing":
        return [Action(uuid, "skip", "completing on another host: not repaired from here (yet)")]
    if not _quiet(copy, now, policy) and copy.lock is None:
        # No lock and recent activity: finishing, or just handed back and requeued by its worker.
        return [Action(uuid, "skip", f"no lock but active {_age(copy.updated_at, now):.0f}s ago")]
    if copy.status == "completing":
        return [_repair(uuid, "finish_move", "completion interrupted before the move to completed/")]
    since = copy.lock.heartbeat_at if copy.lock is not None else copy.updated_at
    owner = copy.lock.owner if copy.lock is not None else copy.lease_owner
    error = LOST_ERROR.format(since=iso(since))  # recorded if it fails (a resume falls back to failing)
    if policy.resume and copy.attempt - copy.handbacks < policy.max_attempts and not copy.cancel_requested:
        reason = f"heartbeat stale since {iso(since)}; attempt {copy.attempt} of {policy.max_attempts}"
        return [Action(uuid, "resume", reason, attempt=copy.attempt, error=error, owner=owner)]
    reason = f"heartbeat stale since {iso(since)}; {_why_not_resumed(copy, policy)}"
    return [Action(uuid, "fail", reason, attempt=copy.attempt, error=error)]


def _why_not_resumed(copy: Copy, policy: Policy) -> str:
    if not policy.resume:
        return "monitor.resume is off"
    if copy.cancel_requested:
        return "cancel requested"
    return f"attempt {copy.attempt} of {policy.max_attempts} used"


def _live(copy: Copy, now: datetime, policy: Policy) -> bool:
    if copy.lease_live is not None:
        return copy.lease_live
    if copy.lock is None:
        return False
    return not is_stale(copy.lock, now, policy.stale_after_s, policy.hostname, copy.holder_alive, policy.hung_after_s)


def _left_in_the_index(uuid: str, completed: Copy, now: datetime, policy: Policy) -> Action:
    """A finished context still in the heartbeat index: its finisher (a worker, or another monitor that just failed
    it) unindexes it right after the move, so only one that has been quiet for a while is repaired here."""
    if not _quiet(completed, now, policy):
        return Action(uuid, "skip", f"finished moments ago ({completed.status})")
    return _repair(uuid, "unindex", f"finished ({completed.status})")


def _quiet(copy: Copy, now: datetime, policy: Policy) -> bool:
    return _age(copy.updated_at, now) > policy.stale_after_s


def _age(moment: datetime, now: datetime) -> float:
    return (now - moment).total_seconds()


def _holder(copy: Copy) -> str:
    if copy.lease_live is not None:
        return f"lease {copy.lease_owner}"
    return copy.lock.worker if copy.lock is not None else "no lock"


def _repair(uuid: str, repair: Repair, reason: str) -> Action:
    return Action(uuid, "repair", reason, repair=repair)
