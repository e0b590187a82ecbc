"""The real fleet for :class:`evals.runs.EvalRun`: tasks queued through ``worker.submit.enqueue`` (Redis, Celery),
their progress read from this host's context store. The runner and the workers share a filesystem: the bare remotes
are local paths (a one-host install, or workers on hosts that mount the run directory at the same path)."""

from __future__ import annotations

from typing import Any

import redis

from contexts.names import FINAL_STATUSES
from contexts.state import read_state
from contexts.store import ContextStore
from evals.runs import Fleet
from worker.settings_models import Settings


def final_state(store: ContextStore, uuid: str) -> dict[str, Any] | None:
    """The task's state once its context is under ``completed/`` with a final status, else None."""
    directory = store.completed_path(uuid)
    if not directory.is_dir():
        return None
    try:
        state = read_state(directory)
    except (FileNotFoundError, ValueError):
        return None
    return state if state.get("status") in FINAL_STATUSES else None


def local_fleet(settings: Settings, *, app: Any = None, client: redis.Redis | None = None) -> Fleet:
    """Enqueue on the configured broker (the process's Celery app and Redis client unless given: a benchmark
    brings its own); read contexts under ``contexts.base_dir``."""
    from worker.runtime import context_store, redis_client
    from worker.submit import enqueue

    if app is None:
        from worker.celery import app
    store = context_store(settings, index=False)
    broker = client if client is not None else redis_client()

    def send(request: dict[str, Any], uuid: str) -> None:
        enqueue(app, broker, settings, request, uuid=uuid)

    def started(uuid: str) -> bool:
        return store.running_path(uuid).is_dir() or store.completed_path(uuid).is_dir()

    return Fleet(enqueue=send, final_state=lambda uuid: final_state(store, uuid), started=started)
