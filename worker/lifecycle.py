"""Worker lifecycle hooks: shutdown requests and cancellation flags seen by running tasks."""

from __future__ import annotations

import threading

import redis
import structlog
from celery.signals import worker_process_init, worker_shutting_down

from worker.names import CANCEL_PREFIX
from worker.runtime import redis_client

log = structlog.get_logger(__name__)

_shutdown = threading.Event()


def shutting_down() -> bool:
    """True once this worker was asked to stop (running tasks hand their context back)."""
    return _shutdown.is_set()


@worker_shutting_down.connect
def _on_shutdown(sig: str = "", how: str = "", exitcode: int = 0, **_: object) -> None:
    _shutdown.set()
    log.info("worker shutting down; running tasks hand back at the next step", how=how)


@worker_process_init.connect
def _on_child_start(**_: object) -> None:
    _shutdown.clear()


def cancel_flagged(uuid: str) -> bool:
    """True when ``tasuki cancel`` flagged a task before its context existed."""
    try:
        return bool(redis_client().exists(CANCEL_PREFIX + uuid))
    except redis.RedisError:
        return False
