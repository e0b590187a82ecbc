"""A task's ending is one event, whoever ends it (SPEC §14): its worker — completed, failed, cancelled, timed
out, or unable to start — or the monitor — failed after ``monitor.max_attempts``, or an interrupted
completion it repaired.

The modules that act on an ending subscribe to it, like dramatiq's middleware hooks, instead of being called
from every place a task can end: the Redis bookkeeping (:mod:`worker.tasks`), memory
(:mod:`worker.memory_tasks`), the forge (:mod:`worker.forges.reporter`, for endings no worker reported). Each
subscriber runs once per ending, after the ending is on disk; one that fails is logged and never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from contexts.masking import mask

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Ending:
    """How one task ended."""

    uuid: str
    task_key: dict[str, str]
    status: str  # completed, failed, timeout or cancelled
    by: str  # "worker" or "monitor"
    request: dict[str, Any] | None = None  # stands in for a context the task never got
    reported: bool = False  # its forge was already told (a worker reports with the state it holds)


Subscriber = Callable[[Ending], None]
SUBSCRIBERS: dict[str, Subscriber] = {}


def on_ending(name: str) -> Callable[[Subscriber], Subscriber]:
    """Register ``name``'s subscriber (registering the same name again replaces it: modules may be reloaded)."""

    def register(subscriber: Subscriber) -> Subscriber:
        SUBSCRIBERS[name] = subscriber
        return subscriber

    return register


def announce(ending: Ending) -> None:
    """Tell every subscriber, in the order they registered; a failure is logged, never raised."""
    for name, subscriber in list(SUBSCRIBERS.items()):
        try:
            subscriber(ending)
        except Exception as exc:
            log.warning("a subscriber to task endings failed", subscriber=name, uuid=ending.uuid,
                        status=ending.status, error=mask(str(exc))[:300])
