"""Redis bookkeeping a task's finisher could not do, repaired from the context files (SPEC §7).

A worker ends a task on disk first, then tells Redis (:mod:`worker.bookkeeping`, ``remember_thread``) and Celery's
result backend. When Redis does not answer then (a cut over the finish), the task is done but Redis still says it
runs: its UUID stays in the heartbeat index and the running-status set ``/metrics`` counts, its task key stays
active (a new trigger is answered ``active``), no thread or last task is recorded, and Celery's state is FAILURE
(the result could not be stored). Each monitor pass looks at what Redis holds as running or active — a handful of
entries, never every context — and, for a context finished and quiet for ``quiet_s``, does its bookkeeping again.
Every write is idempotent, so a pass that meets the finisher's own bookkeeping changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import redis
import structlog

from contexts import ContextStore
from contexts.atomic import read_json
from contexts.clock import parse_iso
from contexts.errors import BAD_DATA_ERRORS, ContextError, StoreUnavailable
from contexts.masking import mask, mask_value
from contexts.names import ACTIVE_STATUSES, FINAL_STATUSES, METADATA_FILE
from contexts.state import read_state
from worker import bookkeeping
from worker.followup_tasks import record_last_task, thread_of
from worker.names import ACTIVE_PREFIX, HEARTBEATS_KEY, RUNNING_STATUS_PREFIX
from worker.run import TaskRequest
from worker.tasks import TaskEnded
from worker.threads import record_thread

log = structlog.get_logger(__name__)
SCAN_COUNT = 500
UNREADABLE: tuple[type[Exception], ...] = (ContextError, OSError, *BAD_DATA_ERRORS)


class ResultBackend(Protocol):
    """The part of Celery's result backend the repair uses (``app.backend``)."""

    def get_task_meta(self, task_id: str, cache: bool = True) -> dict[str, Any]:
        """The stored state of a task."""
        ...

    def store_result(self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None,
                     **kwargs: Any) -> Any:
        """Store a state and result."""
        ...


@dataclass(frozen=True)
class Reconciled:
    """What one finished task's repair did."""

    uuid: str
    repaired: tuple[str, ...]


@dataclass(frozen=True)
class Finished:
    """A finished context, as its files say."""

    uuid: str
    state: dict[str, Any]
    metadata: dict[str, Any]


def held_as_running(client: redis.Redis) -> tuple[set[str], set[str]]:
    """The UUIDs Redis holds as running (heartbeat index, running-status sets) and those it holds as a task key's
    active task."""
    running = _members(client, HEARTBEATS_KEY)
    for status in ACTIVE_STATUSES:
        running |= _members(client, RUNNING_STATUS_PREFIX + status)
    active = set()
    for key in client.scan_iter(match=ACTIVE_PREFIX + "*", count=SCAN_COUNT):
        value = client.get(key)
        if value is not None:
            active.add(_text(value))
    return running, active


def finished(store: ContextStore, uuid: str, now: datetime, quiet_s: float) -> Finished | None:
    """The context if it is finished (under ``completed/``, final status) and was quiet for ``quiet_s``."""
    try:
        directory = store.completed_path(uuid)
        if not directory.is_dir():
            return None
        state = read_state(directory)
        metadata = read_json(directory / METADATA_FILE)
        moment = parse_iso(str(state.get("completed_at") or state["updated_at"]))
    except UNREADABLE:
        return None  # not a context (a UUID a test or a person put there), or unreadable: the monitor reports those
    if state.get("status") not in FINAL_STATUSES or (now - moment).total_seconds() < quiet_s:
        return None  # its finisher may still be doing its bookkeeping
    return Finished(uuid, state, metadata)


def reconcile(store: ContextStore, client: redis.Redis, backend: ResultBackend | None, now: datetime,
              quiet_s: float) -> list[Reconciled]:
    """Repair the bookkeeping of every task Redis holds as running or active whose context is finished."""
    running, active = held_as_running(client)
    done = []
    for uuid in sorted(running | active):
        task = finished(store, uuid, now, quiet_s)
        if task is None:
            if uuid in running and _gone(store, uuid):
                bookkeeping.unindex(client, uuid)  # its context was deleted (retention, by hand): nothing runs
                done.append(Reconciled(uuid, ("index",)))
            continue
        repaired = repair(task, client, backend, indexed=uuid in running)
        if repaired:
            log.info("monitor reconciled a finished task's Redis bookkeeping", uuid=uuid, repaired=list(repaired))
            done.append(Reconciled(uuid, repaired))
    return done


def repair(task: Finished, client: redis.Redis, backend: ResultBackend | None, *, indexed: bool) -> tuple[str, ...]:
    """Do one finished task's bookkeeping again; what it changed."""
    repaired = []
    status = str(task.state["status"])
    if indexed:
        bookkeeping.unindex(client, task.uuid)
        repaired.append("index")
    task_key = task.metadata.get("task_key")
    request = task.metadata.get("request")
    released = isinstance(task_key, dict) and bookkeeping.release(client, task_key, task.uuid, status)
    if released:
        repaired.append("active")
    if isinstance(request, dict):
        # While the key was still this task's no later task of the key can exist: what it writes is the newest.
        # Otherwise (its key expired, say) only what is missing is written, never over a later task's.
        parsed = TaskRequest.from_json(request)
        record_last_task(client, parsed, task.uuid, only_if_absent=not released)
        thread = thread_of(parsed, task.uuid, {"status": status, **(task.state.get("result") or {})})
        if thread is not None:
            record_thread(client, thread, only_if_absent=not released)
        repaired.append("last_task")
    if backend is not None and _result_repaired(backend, task):
        repaired.append("celery")
    return tuple(repaired)


def celery_outcome(task: Finished) -> tuple[str, Any]:
    """The state and result ``tasuki.run_task`` stores for a task that ended as ``task`` did."""
    status = str(task.state["status"])
    if status == "completed":
        return "SUCCESS", mask_value({"uuid": task.uuid, "status": status, "error": None,
                                      **(task.state.get("result") or {})})
    return "FAILURE", TaskEnded(mask(f"{status}: {task.state.get('error') or 'no error recorded'}"))


def _result_repaired(backend: ResultBackend, task: Finished) -> bool:
    """Store Celery's state of the task if what is stored disagrees with its context (a FAILURE recorded because
    the result could not be stored, say); True when it stored."""
    state, result = celery_outcome(task)
    meta = backend.get_task_meta(task.uuid, cache=False)
    stored = meta.get("status")
    if stored == state and (state == "SUCCESS" or type(meta.get("result")).__name__ == TaskEnded.__name__):
        return False
    backend.store_result(task.uuid, result, state)
    log.info("monitor stored the task's Celery state from its context", uuid=task.uuid, state=state, was=stored)
    return True


def _gone(store: ContextStore, uuid: str) -> bool:
    """No context of that UUID anywhere: not on this host's disk, nor (fleet mode) another host's in the durable
    copy — whose holder may be alive, or dead and waiting for the monitor, which finds it by this index."""
    try:
        here = store.running_path(uuid).exists() or store.completed_path(uuid).exists()
    except ContextError:
        return True  # not even a valid UUID: nothing can run under it
    if here:
        return False
    try:
        return not store.durable.knows(uuid)
    except StoreUnavailable:  # the fleet's store out of reach: not known to be gone
        return False


def _members(client: redis.Redis, key: str) -> set[str]:
    members: list[bytes | str] = client.zrange(key, 0, -1)  # type: ignore[assignment]
    return {_text(member) for member in members}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

