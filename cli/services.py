"""Child processes of ``tasuki worker``, ``up`` and ``demo``: the workers, the beat, the webhook intake."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cli.children import dies_with_this_process
from worker.names import COMPRESSION_QUEUE, QUEUES

STOP_TIMEOUT_S = 30.0
LAST_LINES = 20
POLL_S = 0.2


def worker_argv(extra: Sequence[str] = (), *, name: str = "tasuki", node: str | None = None) -> list[str]:
    """``celery -A worker worker`` on Tasuki's queues (``-Q`` in ``extra`` narrows them)."""
    argv = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-n", node or f"{name}@%h"]
    if not any(a == "-Q" or a.startswith(("--queues", "-Q")) for a in extra):
        argv += ["-Q", ",".join(QUEUES)]
    if not any(a.startswith(("-E", "--task-events")) for a in extra):
        argv.append("-E")  # task events for Flower
    return argv + list(extra)


TASK_QUEUES = ("tasks", "compression")
QUEUE_OPTIONS = ("-Q", "--queues")
NAME_OPTIONS = ("-n", "--hostname")
POOL_OPTIONS = ("-P", "--pool", "-c", "--concurrency", "--autoscale")


def option_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value given to one of the options ``names`` (``-Q a``, ``-Qa``, ``--queues=a``), or None."""
    found = None
    for n, arg in enumerate(argv):
        for name in names:
            if arg == name and n + 1 < len(argv):
                found = argv[n + 1]
            elif arg.startswith(name + "=") or (len(name) == 2 and arg.startswith(name) and len(arg) > 2):
                found = arg[len(name):].lstrip("=")
    return found


def without_options(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """``argv`` without the options ``names`` and their values."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not any(arg.startswith(name + "=") or (len(name) == 2 and arg.startswith(name)) for name in names):
            kept.append(arg)
    return kept


def worker_processes(extra: Sequence[str], compression_concurrency: int) -> list[tuple[str, list[str]]]:
    """What ``tasuki worker`` runs: the task worker (prefork) on its queues, and, when the compression queue is
    among them, a compression worker of its own (threads: a summary is a wait on the model), so that a
    compression never waits for a free task process (SPEC §6)."""
    given = option_value(extra, QUEUE_OPTIONS)
    queues = given.split(",") if given else list(QUEUES)
    rest = without_options(extra, QUEUE_OPTIONS)
    processes = []
    others = [q for q in queues if q != COMPRESSION_QUEUE]
    if others:
        processes.append(("worker", worker_argv(["-Q", ",".join(others), *rest])))
    if COMPRESSION_QUEUE in queues:
        node = option_value(rest, NAME_OPTIONS) or "tasuki@%h"
        threads = ["-Q", COMPRESSION_QUEUE, "-P", "threads", "-c", str(compression_concurrency)]
        own = without_options(rest, NAME_OPTIONS + POOL_OPTIONS)
        processes.append(("compression", worker_argv([*threads, *own], node=f"compression-{node}")))
    return processes


def maintenance_argv(extra: Sequence[str] = ()) -> list[str]:
    """A worker of its own for the monitor, retention and alerts: they never wait behind long tasks."""
    return worker_argv(["-Q", "maintenance", "-P", "solo", *extra], name="maintenance")


def schedule_file(var_dir: Path) -> Path:
    """Where the beat keeps its schedule: under ``local.var_dir``, never the working directory."""
    directory = var_dir / "beat"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / "beat-schedule"


def with_schedule_file(argv: Sequence[str], var_dir: Path) -> list[str]:
    """``celery beat`` options with ``-s`` under ``var_dir`` unless the operator gave one."""
    if any(a == "-s" or a.startswith(("--schedule", "-s")) for a in argv):
        return list(argv)
    return ["-s", str(schedule_file(var_dir)), *argv]


def beat_argv(var_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """``celery -A worker beat`` with its schedule file under ``var_dir``."""
    return [sys.executable, "-m", "celery", "-A", "worker", "beat", *with_schedule_file(extra, var_dir)]


@dataclass
class Service:
    """One child process with a name, started in its own process group.

    With ``say`` its output is read line by line and passed on prefixed with the name, and the last lines
    are kept to show when it dies; with ``log`` it goes to that file; with neither it is inherited.
    """

    name: str
    argv: list[str]
    env: Mapping[str, str]
    log: IO[bytes] | None = None
    say: Callable[[str], None] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    last_lines: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_LINES), repr=False)
    _reader: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Service:
        """Start the child."""
        stdout: IO[bytes] | int | None = subprocess.PIPE if self.say is not None else self.log
        self.process = subprocess.Popen(
            self.argv, env=dict(self.env), stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
            start_new_session=True, preexec_fn=dies_with_this_process(),  # noqa: PLW1509 - one prctl, see cli.children
        )
        if self.say is not None and self.process.stdout is not None:
            self._reader = threading.Thread(
                target=self._pass_on, args=(self.process.stdout,), name=f"{self.name}-output", daemon=True
            )
            self._reader.start()
        return self

    def _pass_on(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.last_lines.append(line)
            if self.say is not None:
                self.say(f"{self.name:<11}| {line}")

    def alive(self) -> bool:
        """True while the child runs."""
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        """The child's exit code once it ended (negative: killed by that signal)."""
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        """Ask the child to stop (SIGTERM: Celery's warm shutdown)."""
        if self.alive() and self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL of the whole group after ``timeout_s``; waits until it is gone."""
        if self.process is None:
            return
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)


def stop_all(services: Sequence[Service], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Ask every service to stop at once, then wait for each (a stuck one is killed after ``timeout_s``)."""
    for service in services:
        service.terminate()
    deadline = time.monotonic() + timeout_s
    for service in services:
        service.stop(max(deadline - time.monotonic(), 0.0))


def child_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``TASUKI__`` overrides for a child."""
    env = dict(os.environ)
    env.update(overrides)
    return env


def first_to_exit(services: Sequence[Service], stopping: threading.Event) -> Service | None:
    """Block until one child exits (that service) or ``stopping`` is set (None)."""
    while not stopping.wait(POLL_S):
        for service in services:
            if service.exit_code() is not None:
                return service
    return None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals(stopping: threading.Event) -> Iterator[None]:
    """Ctrl-C, SIGTERM (an init system, Docker, ``kill``) and SIGHUP (a closed terminal) all set ``stopping``."""
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def until_one_exits(services: Sequence[Service], stopping: threading.Event, tell: Callable[[str], None]) -> int:
    """Wait until ``stopping`` (0) or until one service dies: say which, its exit code and last lines (its
    code, at least 1). The caller stops the rest."""
    dead = first_to_exit(services, stopping)
    if dead is None:
        tell("stopping ...")
        return 0
    code = dead.exit_code() or 1
    tell(f"{dead.name} exited with code {dead.exit_code()}; stopping the others. Its last lines:")
    for line in dead.last_lines:
        tell(f"{dead.name:<11}| {line}")
    return code if code > 0 else 1
