"""Enqueueing tasks (CLI, webhooks and the HTTP API all come through here) and cancelling them."""

from __future__ import annotations

import contextlib
import json
import uuid as uuid_module
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
import structlog

from contexts import ContextCompletedError, ContextNotFoundError, ContextStore, validate_uuid
from contexts.errors import StoreUnavailable
from contexts.names import FINAL_STATUSES
from contexts.state import update_state
from worker.admission import Admission, admit
from worker.attempts import attempt_uuid
from worker.bookkeeping import release
from worker.names import ACTIVE_PREFIX, ATTEMPTS_GROUP_PREFIX, CANCEL_PREFIX, RUN_TASK, TASK_PREFIX, TASKS_QUEUE
from worker.settings_models import Settings
from worker.task_message import run_task_arguments, run_task_message

CANCEL_FLAG_TTL_S = 8 * 24 * 3600
log = structlog.get_logger(__name__)


def task_key_id(task_key: dict[str, str]) -> str:
    """The task key as one string: ``source/owner/repo/type/id``."""
    return "/".join(str(task_key[f]) for f in ("task_source", "owner", "repo", "task_type", "task_id"))


@dataclass(frozen=True)
class Enqueued:
    """The answer to a submission: the task's UUID, and whether it was already active."""

    uuid: str
    already_active: bool


def send_run_task(app: Any, uuid: str, request: dict[str, Any], *, eta: datetime | None = None) -> None:
    """Put ``tasuki.run_task(uuid, request)`` on the tasks queue under its UUID through Celery (the monitor, a
    hand-back, the demo), with the arguments ``run_task_arguments`` makes; not to run before ``eta``. Submissions go
    through ``enqueue``, which pushes the same message itself."""
    args, shown = run_task_arguments(uuid, request)
    app.send_task(RUN_TASK, args=args, task_id=uuid, queue=TASKS_QUEUE, eta=eta, **shown)


def run_task_admission(
    app: Any, settings: Settings, request: dict[str, Any], uuid: str, *, delivery_key: str | None = None,
    delivery_ttl_s: int = 0,
) -> Admission:
    """What admitting ``tasuki.run_task(uuid, request)`` takes: its task key claimed for as long as the task may
    be queued or retried, its task key remembered by UUID (the API answers for a queued task with it, a cancel
    knows the task exists), its message, and the webhook delivery it answers, if any."""
    ttl = settings.broker.visibility_timeout_s * settings.monitor.max_attempts
    return Admission(
        uuid=uuid, active_key=ACTIVE_PREFIX + task_key_id(request["task_key"]), task_record_key=TASK_PREFIX + uuid,
        task_key_json=json.dumps(request["task_key"]), ttl_s=ttl, message=run_task_message(app, uuid, request),
        delivery_key=delivery_key, delivery_ttl_s=delivery_ttl_s,
    )


def enqueue(
    app: Any, client: redis.Redis, settings: Settings, request: dict[str, Any], *, uuid: str | None = None
) -> Enqueued:
    """Queue ``tasuki.run_task`` unless a task for the same task key is queued or running (SPEC §2)."""
    uuid = validate_uuid(uuid) if uuid else str(uuid_module.uuid4())
    admitted = admit(client, run_task_admission(app, settings, request, uuid))
    return Enqueued(admitted.uuid, admitted.outcome == "active")


def release_active(client: redis.Redis, task_key: dict[str, str], uuid: str) -> None:
    """Forget the active task of a task key (only if it is still this task), in one step."""
    release(client, task_key, uuid)


def request_cancel(app: Any, client: redis.Redis, store: ContextStore, uuid: str) -> str:
    """Flag the task to stop at its next step (or never start); returns what was done, for the operator.

    In a fleet the request goes into the durable copy too, under no lease: the holder on whatever host reads it at
    its next step's commit, a host that takes the task next finds it in the state it rebuilds, and ``tasuki context
    show`` shows it on every host. An unknown UUID (no context, never enqueued here) raises ContextNotFoundError and
    writes nothing.
    """
    uuid = validate_uuid(uuid)
    of, finished = client.hmget(ATTEMPTS_GROUP_PREFIX + uuid, ["of", "finished"])
    if finished:
        raise ContextCompletedError(f"task {uuid} is already finished (its attempts were picked)")
    attempts = int(of or 0)
    if attempts:  # a task run as several attempts (docs/attempts.md): each is cancelled, and the parent ends so
        for number in range(1, attempts + 1):
            with contextlib.suppress(ContextCompletedError, ContextNotFoundError):
                request_cancel(app, client, store, attempt_uuid(uuid, number))
        return f"cancel requested for its {attempts} attempts; each stops at its next step"
    running = store.running_path(uuid)
    try:
        committed = store.durable.amend(uuid, _asking_to_cancel)
    except StoreUnavailable as exc:  # the Redis flag still reaches the holder
        log.warning("cancel not written to the fleet's store", uuid=uuid, error=str(exc)[:300])
        committed = None
    known = running.is_dir() or store.completed_path(uuid).is_dir() or committed is not None
    if not (known or client.exists(TASK_PREFIX + uuid)):
        raise ContextNotFoundError(f"no such task {uuid} (no context under {store.base_dir}, nothing queued)")
    client.set(CANCEL_PREFIX + uuid, "1", ex=CANCEL_FLAG_TTL_S)
    if running.is_dir():
        update_state(running, store.clock(), fsync=True, set_fields={"cancel_requested": True})
        return "cancel requested; the task stops at its next step"
    status = committed.get("status") if committed is not None else None
    if store.completed_path(uuid).is_dir() or status in FINAL_STATUSES:
        raise ContextCompletedError(f"context {uuid} is already finished")
    if status == "completing":
        raise ContextCompletedError(f"context {uuid} is finishing on another host")
    if committed is not None:
        return "cancel requested; the task stops at its next step, on whichever host holds it"
    app.control.revoke(uuid)
    try:
        store.locate(uuid)
    except ContextNotFoundError:
        return "task revoked before it started"
    return "cancel requested"


def _asking_to_cancel(state: dict[str, Any]) -> dict[str, Any] | None:
    """The committed state with the cancel request; nothing for a task that is finished or finishing."""
    if state.get("status") in (*FINAL_STATUSES, "completing") or state.get("cancel_requested"):
        return None
    return {**state, "cancel_requested": True}
