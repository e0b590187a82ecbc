"""The Celery app (SPEC §5): ``celery -A worker ...`` finds ``worker.celery.app``.

Long tasks are the normal case: late acks, reject on worker loss, one message prefetched at a time,
and a Redis ``visibility_timeout`` longer than the hard time limit.  The context lock — not Celery —
is what prevents a task from running twice.
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery
from celery.signals import setup_logging

from contexts.masking import mask
from worker.names import (
    ALERTS,
    COMPRESS_CONTEXT,
    COMPRESSION_QUEUE,
    MAINTENANCE_QUEUE,
    REAP_STALE,
    RETENTION,
    RUN_TASK,
    TASKS_QUEUE,
    UPDATE_MEMORY,
)
from worker.runtime import settings
from worker.settings import ConfigError
from worker.settings_models import Settings


def celery_config(s: Settings) -> dict[str, Any]:
    """Celery settings derived from Tasuki's settings."""
    transport = {"visibility_timeout": s.broker.visibility_timeout_s}
    return {
        "broker_url": s.broker.url,
        "result_backend": s.broker.url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 86400,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A Redis blip must not cost a running task its attempt: the task runs on through the reconnection.
        # If Redis put its message back meanwhile, the redelivery finds the context held and is dropped.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_track_started": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "worker_hijack_root_logger": False,
        "task_default_queue": TASKS_QUEUE,
        "task_routes": {
            RUN_TASK: {"queue": TASKS_QUEUE},
            COMPRESS_CONTEXT: {"queue": COMPRESSION_QUEUE},
            REAP_STALE: {"queue": MAINTENANCE_QUEUE},
            RETENTION: {"queue": MAINTENANCE_QUEUE},
            ALERTS: {"queue": MAINTENANCE_QUEUE},
            UPDATE_MEMORY: {"queue": MAINTENANCE_QUEUE},
        },
        "task_soft_time_limit": s.agent.soft_time_limit_s,
        "task_time_limit": s.agent.time_limit_s,
        "worker_soft_shutdown_timeout": float(s.agent.shutdown_grace_s),
        "worker_enable_soft_shutdown_on_idle": True,
        # The scheduler's beat: its schedule, and a Redis lock so that only one of several beats sends it.
        "beat_scheduler": "scheduler.beat:LockedScheduler",
    }


@setup_logging.connect
def _configure_logging(loglevel: str | int | None = None, **_: object) -> None:
    """Celery's own lines and Tasuki's go through the same structlog chain (masking, JSON, uuid)."""
    from worker.logging import configure_logging

    configure_logging(loglevel or "INFO")


def _settings_or_exit() -> Settings:
    """The process's settings; a bad configuration ends ``celery -A worker ...`` with the CLI's one-line error."""
    try:
        return settings()
    except ConfigError as exc:
        for line in mask(str(exc)).splitlines():
            sys.stderr.write(f"tasuki: error: {line}\n")
        raise SystemExit(2) from None


app = Celery("tasuki", include=["worker.tasks", "worker.memory_tasks", "worker.followup_tasks", "worker.outcome_tasks",
                                "scheduler.tasks"])
app.conf.update(celery_config(_settings_or_exit()))
