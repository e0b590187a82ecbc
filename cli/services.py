"""Child processes of ``tasuki up`` and ``tasuki demo``: the worker, the beat, the webhook intake."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from worker.names import QUEUES

STOP_TIMEOUT_S = 30.0


def worker_argv(extra: Sequence[str] = (), *, name: str = "tasuki") -> list[str]:
    """``celery -A worker worker`` on Tasuki's queues (``-Q`` in ``extra`` narrows them)."""
    argv = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-n", f"{name}@%h"]
    if not any(a == "-Q" or a.startswith(("--queues", "-Q")) for a in extra):
        argv += ["-Q", ",".join(QUEUES)]
    if not any(a.startswith(("-E", "--task-events")) for a in extra):
        argv.append("-E")  # task events for Flower
    return argv + list(extra)


TASK_QUEUES = ("tasks", "compression")


def maintenance_argv(extra: Sequence[str] = ()) -> list[str]:
    """A worker of its own for the monitor, retention and alerts: they never wait behind long tasks."""
    return worker_argv(["-Q", "maintenance", "-P", "solo", *extra], name="maintenance")


def beat_argv(schedule_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """``celery -A worker beat`` with its schedule file under ``schedule_dir``."""
    schedule_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [sys.executable, "-m", "celery", "-A", "worker", "beat", "-s", str(schedule_dir / "beat-schedule"), *extra]


@dataclass
class Service:
    """One child process with a name, started in its own process group."""

    name: str
    argv: list[str]
    env: Mapping[str, str]
    log: IO[bytes] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Service:
        """Start the child; its output goes to ``log`` (or is inherited)."""
        self.process = subprocess.Popen(
            self.argv, env=dict(self.env), stdout=self.log, stderr=subprocess.STDOUT if self.log else None,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        """True while the child runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL of the group after a grace period."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def child_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``TASUKI__`` overrides for a child."""
    env = dict(os.environ)
    env.update(overrides)
    return env


def wait_all(services: Sequence[Service]) -> int:
    """Block until one child exits (or Ctrl-C); return the first exit code."""
    while True:
        for service in services:
            if service.process is not None and service.process.poll() is not None:
                return service.process.returncode
        time.sleep(0.5)
