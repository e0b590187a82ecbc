"""How a worker waits on a model (a ``Retry-After``, a backoff, the fleet's rate limit): in short slices, ready to
stop at once when the worker shuts down or the task is cancelled, so that minutes of patience never delay a
rolling restart or a ``tasuki cancel``.

Stopping raises :class:`agent.loop.Cancelled` out of the model call: the task runner hands the task back on a
shutdown (another worker resumes it) and ends it as cancelled on a cancel, exactly as at a step boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

SLICE_S = 1.0
"""Longest stretch of a wait between two looks at the shutdown and cancel flags."""


def stop_requested() -> str | None:
    """Why the running task must stop waiting (None: it may wait on): this worker is shutting down, or the task
    (the one this process runs, as ``run_task`` binds it for the log) was cancelled."""
    # Imported here: both modules import worker.runtime, which builds the providers that wait through this one.
    from worker import lifecycle

    if lifecycle.shutting_down():
        return "the worker is shutting down"
    uuid = structlog.contextvars.get_contextvars().get("uuid")
    if isinstance(uuid, str) and lifecycle.cancel_flagged(uuid):
        return "cancelled on request"
    return None


def interruptible_sleep(
    seconds: float,
    *,
    stop: Callable[[], str | None] = stop_requested,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait ``seconds``, looking at ``stop`` before each slice of at most :data:`SLICE_S`; raise
    :class:`agent.loop.Cancelled` with its reason when it gives one."""
    from agent.loop import Cancelled  # agent.loop imports worker.runtime, which imports this module

    deadline = clock() + seconds
    while True:
        reason = stop()
        if reason is not None:
            raise Cancelled(f"{reason} while waiting for the model")
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(left, SLICE_S))
