"""Worker lifecycle hooks: shutdown requests and cancellation flags seen by running tasks, and the beat of a
worker that consumes the compression queue."""

from __future__ import annotations

import mmap
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import redis
import structlog
from celery.signals import worker_ready, worker_shutting_down

from sandbox.jail import Bubblewrap, Sandbox, SandboxUnavailable, backend, make_sandbox
from sandbox.settings import SandboxLimits
from sandbox.toolchains import TOOLCHAINS, Toolchain, found_toolchains, probe_toolchains, worker_path
from worker.compressors import Announcer
from worker.environment import layers_unavailable
from worker.names import CANCEL_PREFIX, COMPRESSION_QUEUE, TASKS_QUEUE
from worker.runtime import CLOCK, redis_client, settings

log = structlog.get_logger(__name__)

# Celery sends worker_shutting_down in the worker's main process only; prefork pool children, where tasks
# run, never see it.  One byte of anonymous shared memory, mapped when the main process imports this module
# (before it forks its pool), is what the main process sets and every child reads (a child forked later
# inherits it set, and hands back its task at once).
_shutdown = mmap.mmap(-1, 1)
_announcers: list[Announcer] = []


def shutting_down() -> bool:
    """True once this worker was asked to stop (running tasks hand their context back)."""
    return _shutdown[0] == 1


@worker_shutting_down.connect
def _on_shutdown(sig: str = "", how: str = "", exitcode: int = 0, **_: object) -> None:
    _shutdown[0] = 1
    log.info("worker shutting down; running tasks hand back at the next step", how=how)
    while _announcers:  # from now on, tasks summarize in their own process rather than wait for this one
        _announcers.pop().stop()


def cancel_flagged(uuid: str) -> bool:
    """True when ``tasuki cancel`` flagged a task before its context existed."""
    try:
        return bool(redis_client().exists(CANCEL_PREFIX + uuid))
    except redis.RedisError:
        return False


@worker_ready.connect
def _check_clock(**_: object) -> None:
    """Say at start when this host's clock is off Redis's by more than contexts.max_clock_skew_s (SPEC §4): the
    heartbeats are written and judged by Redis's clock all the same, but the host's clock wants fixing."""
    s = settings()
    CLOCK.measure_if_due(redis_client(), socket.gethostname(), s.contexts.max_clock_skew_s)


@worker_ready.connect
def _check_sandbox(sender: object = None, **_: object) -> None:
    """Say at start, once, when the agent's commands cannot be sandboxed: tasks will be refused, not run bare."""
    try:
        sandbox = make_sandbox(settings().sandbox)
    except SandboxUnavailable as exc:
        log.error("sandbox unavailable: this worker refuses tasks", error=str(exc))
        return
    if not backend(sandbox.name).confines:
        log.warning("sandbox.backend is none: agent commands run unsandboxed on this host")
        return
    if _runs_agents(sender):  # a few seconds of probes, beside the worker, which takes tasks meanwhile
        limits = settings().sandbox.limits
        threading.Thread(target=probe_restores, args=(sandbox, limits), name="toolchain-probe", daemon=True).start()


def _runs_agents(sender: object) -> bool:
    """Whether this worker takes tasks (not the compression worker beside it)."""
    app = getattr(sender, "app", None)
    consumed = app.amqp.queues.consume_from if app is not None else None
    return not consumed or TASKS_QUEUE in consumed


def warn_toolchains(
    sandbox: Sandbox, limits: SandboxLimits | None = None, toolchains: Sequence[Toolchain] = TOOLCHAINS
) -> None:
    """One warning line per toolchain on the agent's PATH that cannot run in the sandbox (SPEC §17)."""
    path = worker_path()
    problems = probe_toolchains(sandbox, path, limits, toolchains)
    for problem in problems:
        log.warning(str(problem), toolchain=problem.toolchain)
    failing = [problem.toolchain for problem in problems]
    usable = [name for name in found_toolchains(path, toolchains) if name not in failing]
    log.info("toolchains probed in the sandbox", usable=usable, failing=failing)


def probe_restores(sandbox: Sandbox, limits: SandboxLimits | None = None) -> None:
    """The toolchains' warnings (:func:`warn_toolchains`), then one line on how environments are restored here: by
    layers, or by copy and why (``environments.restore: auto``)."""
    warn_toolchains(sandbox, limits)
    current = settings()
    if current.environments.restore != "copy" and isinstance(sandbox, Bubblewrap):
        layers_unavailable(Path(current.contexts.workspaces_dir), sandbox)


@worker_ready.connect
def _announce_compression(sender: object = None, **_: object) -> None:
    """A worker that consumes the compression queue says so in Redis while it runs (worker.compressors)."""
    app = getattr(sender, "app", None)
    node = getattr(sender, "hostname", None)
    if app is None or node is None or COMPRESSION_QUEUE not in app.amqp.queues.consume_from:
        return
    _announcers.append(Announcer(redis_client(), str(node)).start())
