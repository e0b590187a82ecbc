"""Enqueueing tasks (CLI, webhooks and the HTTP API all come through here) and cancelling them."""

from __future__ import annotations

import json
import uuid as uuid_module
from dataclasses import dataclass
from typing import Any, cast

import redis

from contexts import ContextCompletedError, ContextNotFoundError, ContextStore, validate_uuid
from contexts.masking import mask_value
from contexts.state import update_state
from worker.names import ACTIVE_PREFIX, CANCEL_PREFIX, RUN_TASK, TASK_PREFIX, TASKS_QUEUE
from worker.settings_models import Settings

CANCEL_FLAG_TTL_S = 8 * 24 * 3600


def task_key_id(task_key: dict[str, str]) -> str:
    """The task key as one string: ``source/owner/repo/type/id``."""
    return "/".join(str(task_key[f]) for f in ("task_source", "owner", "repo", "task_type", "task_id"))


@dataclass(frozen=True)
class Enqueued:
    """The answer to a submission: the task's UUID, and whether it was already active."""

    uuid: str
    already_active: bool


def send_run_task(app: Any, uuid: str, request: dict[str, Any], *, countdown_s: float | None = None) -> None:
    """Put ``tasuki.run_task(uuid, request)`` on the tasks queue under its UUID: the one place every sender
    (submit, the intake, the monitor, a hand-back, the demo) goes through.

    The request is masked first: Celery's arguments are kept in Redis and shown by Flower, and issue text is
    untrusted input that may carry a token. (The context records the request masked anyway.) A local
    ``repo_path`` is a path on the worker's host, kept as it is so that the clone finds it.
    """
    masked = cast(dict[str, Any], mask_value({k: v for k, v in request.items() if k != "repo_path"}))
    if "repo_path" in request:
        masked["repo_path"] = request["repo_path"]
    app.send_task(RUN_TASK, args=[uuid, masked], task_id=uuid, queue=TASKS_QUEUE, countdown=countdown_s or None)


def enqueue(
    app: Any, client: redis.Redis, settings: Settings, request: dict[str, Any], *, uuid: str | None = None
) -> Enqueued:
    """Send ``tasuki.run_task`` unless a task for the same task key is queued or running (SPEC §2)."""
    uuid = validate_uuid(uuid) if uuid else str(uuid_module.uuid4())
    key = ACTIVE_PREFIX + task_key_id(request["task_key"])
    ttl = settings.broker.visibility_timeout_s * settings.monitor.max_attempts
    if not client.set(key, uuid, nx=True, ex=ttl):
        existing = client.get(key)
        return Enqueued(existing.decode() if isinstance(existing, bytes) else str(existing), True)
    # The task key by UUID: the API answers for a queued task with it, and a cancel knows the task exists.
    client.set(TASK_PREFIX + uuid, json.dumps(request["task_key"]), ex=ttl)
    try:
        send_run_task(app, uuid, request)
    except Exception:
        client.delete(key, TASK_PREFIX + uuid)
        raise
    return Enqueued(uuid, False)


def release_active(client: redis.Redis, task_key: dict[str, str], uuid: str) -> None:
    """Forget the active task of a task key once it finished (only if it is still this task)."""
    key = ACTIVE_PREFIX + task_key_id(task_key)
    current = client.get(key)
    if current is not None and (current.decode() if isinstance(current, bytes) else str(current)) == uuid:
        client.delete(key)


def request_cancel(app: Any, client: redis.Redis, store: ContextStore, uuid: str) -> str:
    """Flag the task to stop at its next step (or never start); returns what was done, for the operator.

    An unknown UUID (no context, never enqueued here) raises ContextNotFoundError and writes nothing.
    """
    uuid = validate_uuid(uuid)
    running = store.running_path(uuid)
    known = running.is_dir() or store.completed_path(uuid).is_dir() or client.exists(TASK_PREFIX + uuid)
    if not known:
        raise ContextNotFoundError(f"no such task {uuid} (no context under {store.base_dir}, nothing queued)")
    client.set(CANCEL_PREFIX + uuid, "1", ex=CANCEL_FLAG_TTL_S)
    if running.is_dir():
        update_state(running, store.clock(), fsync=True, set_fields={"cancel_requested": True})
        return "cancel requested; the task stops at its next step"
    if store.completed_path(uuid).is_dir():
        raise ContextCompletedError(f"context {uuid} is already finished")
    app.control.revoke(uuid)
    try:
        store.locate(uuid)
    except ContextNotFoundError:
        return "task revoked before it started"
    return "cancel requested"
