"""The monitor (SPEC §7): find contexts whose worker died, resume or fail them, repair interrupted completions.

``observe`` finds candidates through the Redis heartbeat index (entries older than ``stale_after_s``), a
listing of ``running/`` (contexts the index lacks: a Redis restart, a heartbeat that never registered) and, in
fleet mode, the leases that ran out unreleased (another host's lost holder that the index lacks) — it reads only
those, never every context.  :func:`scheduler.plan.plan` decides; ``carry_out`` does it,
re-checking under the context's lock so that two monitors at once take one action per context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
import structlog

from contexts import ContextCompletedError, ContextNotFoundError, ContextStore, LockHeldError, TasukiError
from contexts.atomic import read_json
from contexts.clock import iso, parse_iso
from contexts.durable import Committed
from contexts.errors import BAD_DATA_ERRORS, ContextError
from contexts.lock import LockInfo, holder_alive, is_hung, read_lock, stop_hung_holder
from contexts.masking import mask
from contexts.names import FINAL_STATUSES, LOCK_FILE, METADATA_FILE
from contexts.repair import RepairSkipped, drop_running_copy, finish_move, finish_status, remove_completed_lock
from contexts.state import read_state
from scheduler.plan import Action, Copy, Policy, Seen, plan
from worker import bookkeeping
from worker.names import HEARTBEATS_KEY, REAPED_PREFIX, RESENT_PREFIX, TASKS_QUEUE

RESENT_TTL_S = 8 * 24 * 3600  # longer than any task may live (visibility timeout x attempts at the defaults)
# A copy that cannot be read (ContextError includes StoreUnavailable: in fleet mode, the fleet's store out of reach).
UNREADABLE: tuple[type[Exception], ...] = (ContextError, OSError, *BAD_DATA_ERRORS)
log = structlog.get_logger(__name__)

Send = Callable[[str, dict[str, Any]], None]
"""Enqueue ``tasuki.run_task(uuid, request)`` under ``task_id=uuid``."""
Ended = Callable[[str, dict[str, str], str], None]
"""A task the monitor ended (uuid, task key, final status), its end on disk: the task-ending event (the beat's
monitor announces it: the heartbeat index and task key, memory and the forge hear of it)."""

REPAIRS = {
    "finish_move": finish_move,
    "finish_status": finish_status,
    "remove_completed_lock": remove_completed_lock,
    "drop_running_copy": drop_running_copy,
}


@dataclass(frozen=True)
class Outcome:
    """What became of one action: ``done`` (or, in a dry run, what would be done) and what happened."""

    action: Action
    done: bool
    detail: str


@dataclass(frozen=True)
class Monitor:
    """Everything one monitor run touches."""

    store: ContextStore
    client: redis.Redis
    policy: Policy
    send: Send
    ended: Ended
    dedupe_s: int = 300

    # -- observe ------------------------------------------------------------------------------------

    def observe(self, now: datetime, *, deep: bool = False) -> list[Seen]:
        """Contexts that may need the monitor; ``deep`` also reads every completed context (slow, thorough)."""
        entries: list[tuple[bytes | str, float]] = self.client.zrange(HEARTBEATS_KEY, 0, -1, withscores=True)  # type: ignore[assignment]
        indexed = {_text(member) for member, _score in entries}
        cutoff = now.timestamp() - self.policy.stale_after_s
        stale = {_text(member) for member, score in entries if score < cutoff}
        candidates = stale | (set(self.store.running_uuids()) - indexed)
        # Fleet mode: a lease that ran out unreleased is a lost holder on some host, found even where its heartbeat
        # never reached the index or Redis lost it (one host: none).
        candidates |= self._expired_leases()
        if deep:
            candidates |= set(self.store.completed_uuids())
        return [self.inspect(uuid, indexed=uuid in indexed) for uuid in sorted(candidates)]

    def _expired_leases(self) -> set[str]:
        try:
            return set(self.store.durable.expired())
        except UNREADABLE as exc:  # the fleet's store out of reach: the heartbeat index's candidates still count
            log.warning("monitor: expired leases not read", error=str(exc)[:300])
            return set()

    def inspect(self, uuid: str, *, indexed: bool = False) -> Seen:
        """Read both possible copies of one context (in fleet mode, the durable copy's where it decides)."""
        try:
            running = self._copy(self.store.running_path(uuid))
            completed = self._copy(self.store.completed_path(uuid))
            if completed is None and not _interrupted_here(running):
                found = self._fleet_view(uuid, running.lock if running else None, local=running is not None)
                if found is not None:
                    running, completed = _fleet_copy(found)
        except UNREADABLE as exc:  # reported and skipped, never fatal to the pass
            return Seen(uuid, indexed=indexed, unreadable=f"{type(exc).__name__}: {exc}"[:200])
        return Seen(uuid, running=running, completed=completed, indexed=indexed)

    def _copy(self, directory: Path) -> Copy | None:
        try:
            state = read_state(directory)
        except FileNotFoundError:
            return None  # not there, or moved away between the listing and the read
        lock = read_lock(directory / LOCK_FILE)
        alive = lock is not None and holder_alive(lock, self.policy.hostname)
        return Copy(
            status=str(state.get("status")),
            updated_at=parse_iso(state["updated_at"]),
            attempt=int(state.get("attempt", 1)),
            handbacks=int(state.get("handbacks", 0) or 0),
            cancel_requested=bool(state.get("cancel_requested")),
            error=state.get("error"),
            final_status=state.get("final_status"),
            lock=lock,
            holder_alive=alive,
        )

    def _fleet_view(self, uuid: str, lock: LockInfo | None, *, local: bool) -> Committed | None:
        """Fleet mode: the durable copy's record of the context where it, not this host's directory, says who holds
        it — this host has no directory of it, or the fleet finished it, or the lease names another holder than the
        directory's ``.lock`` (a fenced holder's leftover). None: one host, or this host's own holder's."""
        found = self.store.durable.committed(uuid)
        if found is None or not local:
            return found
        holder = found.owner.rsplit("#", 1)[0] if found.owner else None
        if found.state.get("status") in FINAL_STATUSES or holder != (lock.worker if lock is not None else None):
            return found
        return None

    def _owner_and_request(self, uuid: str) -> tuple[LockInfo | None, str | None, dict[str, Any] | None]:
        """Who holds the context now (its ``.lock``, or the fleet's lease where that decides) and its task request."""
        local = self.store.running_path(uuid).is_dir()
        holder = self.store.read_lock(uuid) if local else None
        found = self._fleet_view(uuid, holder, local=local)
        if found is None:
            return holder, holder.owner if holder is not None else None, _request(self.store.running_path(uuid))
        request = found.metadata.get("request")
        return None, found.owner, request if isinstance(request, dict) else None

    # -- carry out ----------------------------------------------------------------------------------

    def run(self, now: datetime, *, dry_run: bool = False, deep: bool = False) -> list[Outcome]:
        """Observe, plan and (unless ``dry_run``) carry out; every outcome is logged."""
        actions = plan(self.observe(now, deep=deep), now, self.policy)
        outcomes = [Outcome(a, a.kind != "skip", "dry run") if dry_run else self.carry_out(a, now) for a in actions]
        for outcome in outcomes:
            a = outcome.action
            event = "monitor " + (a.repair or a.kind) + ("" if outcome.done else " not done")
            emit = log.debug if a.kind == "skip" else log.info  # live holders are the normal case
            emit(event, uuid=a.uuid, reason=a.reason, detail=outcome.detail, dry_run=dry_run)
        return outcomes

    def carry_out(self, action: Action, now: datetime) -> Outcome:
        """Do one action; a context that changed since it was observed is left alone."""
        try:
            if action.kind == "resume":
                return self._resume(action, now)
            if action.kind == "fail":
                return self._fail(action, now)
            if action.kind == "repair" and action.repair is not None:
                return self._repair(action, now)
        except RepairSkipped as exc:
            return Outcome(action, False, str(exc))
        except (TasukiError, OSError, redis.RedisError) as exc:
            log.warning("monitor action failed", uuid=action.uuid, action=action.kind, error=str(exc))
            return Outcome(action, False, f"error: {exc}")
        return Outcome(action, False, action.reason)

    def _repair(self, action: Action, now: datetime) -> Outcome:
        if action.repair == "unindex":
            bookkeeping.unindex(self.client, action.uuid)  # the running-status sets too: /metrics counts them
            return Outcome(action, True, "removed from the heartbeat index")
        assert action.repair is not None  # noqa: S101 - carry_out checked it
        detail = REPAIRS[action.repair](self.store, action.uuid, now)
        if action.repair in ("finish_move", "finish_status"):
            self._ended(action.uuid, self.store.completed_path(action.uuid))  # the finisher never got to it
        return Outcome(action, True, detail)

    def _resume(self, action: Action, now: datetime) -> Outcome:
        holder, owner, request = self._owner_and_request(action.uuid)
        if owner != action.owner:
            return Outcome(action, False, "taken over meanwhile")
        self._stop_if_hung(action.uuid, holder, now)
        if request is None:
            return self._fail(action, now, "no task request recorded in metadata.json")
        # A delivery sent before still waits in the tasks queue (no worker is up, or all are busy): nothing was
        # refused, so nothing more is sent and nothing counts towards giving up. Without this, a fleet whose
        # workers were all stopped a while (a rolling restart, `docker compose stop worker`) had its handed-back
        # tasks failed by the monitor after max_attempts re-enqueues no worker could have taken.
        if self.client.get(RESENT_PREFIX + action.uuid) and self.client.llen(TASKS_QUEUE):
            return Outcome(action, False, "a delivery is waiting in the tasks queue")
        # One re-enqueue per lost attempt at a time, however many monitors saw it; the guard expires, so a
        # delivery that was dropped, lost or never consumed is sent again while the context stays stale.
        key = f"{REAPED_PREFIX}{action.uuid}:{action.attempt}"
        if not self.client.set(key, "1", nx=True, ex=self.dedupe_s):
            return Outcome(action, False, "already re-enqueued")
        sent = int(self.client.incr(RESENT_PREFIX + action.uuid))
        self.client.expire(RESENT_PREFIX + action.uuid, RESENT_TTL_S)
        if sent > self.policy.max_attempts:  # bounded: a task no worker ever takes up ends failed, reported
            return self._fail(action, now, f"{sent - 1} re-enqueued deliveries were not taken up")
        self.send(action.uuid, request)
        return Outcome(action, True, f"re-enqueued for attempt {action.attempt + 1} (delivery {sent})")

    def _fail(self, action: Action, now: datetime, why: str | None = None) -> Outcome:
        error = action.error or f"worker lost: {action.reason}"
        if why:  # a resume that cannot be carried out
            error = f"{error}; {why}"
        self._stop_if_hung(action.uuid, self.store.read_lock(action.uuid), now)
        try:
            ctx = self.store.open(action.uuid, resume=False, heartbeat=False)
        except LockHeldError as exc:
            return Outcome(action, False, f"taken over meanwhile: {exc}")
        except (ContextCompletedError, ContextNotFoundError) as exc:
            return Outcome(action, False, f"finished meanwhile: {exc}")
        # A worker that ended the task without room to finish its context said how it ended: that, not "lost".
        stop = bookkeeping.stopped(self.client, action.uuid) or {"status": "failed", "error": error}
        status, told = str(stop["status"]), stop.get("error")
        try:
            ctx.update_state(last_activity=f"monitor:{status}")
            target = ctx.finish(status, error=told, **({"result": stop["result"]} if stop.get("result") else {}))
        except (TasukiError, OSError):
            ctx.release()  # a full disk: never leave this live process's lock behind (the next pass tries again)
            raise
        self._ended(action.uuid, target)
        return Outcome(action, True, f"{status}: {told}")

    def _stop_if_hung(self, uuid: str, holder: LockInfo | None, now: datetime) -> None:
        """A holder of this host that is alive but has not beaten for ``hung_after_s`` is stopped or wedged: it is
        killed (only when provably the same incarnation) before its task moves on; it would be fenced anyway."""
        if holder is None or not is_hung(holder, now, self.policy.hung_after_s):
            return
        if not holder_alive(holder, self.policy.hostname):
            return
        if stop_hung_holder(holder, self.policy.hostname):
            log.warning("monitor killed a hung holder", uuid=uuid, worker=holder.worker,
                        heartbeat_at=iso(holder.heartbeat_at))

    def _ended(self, uuid: str, directory: Path) -> None:
        """A task the monitor ended, announced only once its end is on disk; whatever a subscriber does wrong
        never stops the pass (the state on disk is final)."""
        try:
            task_key = read_json(directory / METADATA_FILE)["task_key"]
            status = str(read_state(directory)["status"])
        except (OSError, ValueError, KeyError, ContextError):
            self.client.zrem(HEARTBEATS_KEY, uuid)
            return
        try:
            self.ended(uuid, task_key, status)
        except Exception as exc:
            log.warning("monitor: the task's ending was not announced", uuid=uuid, error=mask(str(exc))[:300])


def _interrupted_here(running: Copy | None) -> bool:
    """A directory of this host whose completion stopped between its lock's removal and the move to ``completed/``:
    only its holder gets there (the lock's removal checks the owner), so it is this host's to repair, in a fleet too
    (the repair takes a lease of its own, and waits while the dead holder's is live: contexts/repair.py)."""
    return running is not None and running.status == "completing" and running.lock is None


def _fleet_copy(found: Committed) -> tuple[Copy | None, Copy | None]:
    """The durable copy's record as the running or the completed copy that :func:`scheduler.plan.plan` judges, its
    lease for a lock."""
    state = found.state
    copy = Copy(
        status=str(state.get("status")),
        updated_at=parse_iso(str(state["updated_at"])),
        attempt=int(state.get("attempt", 1)),
        handbacks=int(state.get("handbacks", 0) or 0),
        cancel_requested=bool(state.get("cancel_requested")),
        error=state.get("error"),
        final_status=state.get("final_status"),
        lease_live=found.live,
        lease_owner=found.owner,
    )
    return (None, copy) if copy.status in FINAL_STATUSES else (copy, None)


def _request(directory: Path) -> dict[str, Any] | None:
    try:
        request = read_json(directory / METADATA_FILE).get("request")
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
