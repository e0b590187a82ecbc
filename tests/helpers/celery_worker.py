"""Real ``celery -A worker worker`` processes for integration, crash and resume tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


@contextlib.contextmanager
def celery_client(redis_url: str) -> Iterator[Celery]:
    """A Celery app on the broker at ``redis_url`` for a test that sends or revokes (``request_cancel``'s)."""
    app = Celery(broker=redis_url)
    try:
        yield app
    finally:
        app.close()


@dataclass
class WorkerProcess:
    """One worker subprocess in its own process group (so a kill takes its pool children too)."""

    name: str
    env: dict[str, str]
    log_path: Path
    concurrency: int = 1
    queues: str = "tasks,compression,maintenance"
    pool: str = "prefork"
    tasuki: bool = False  # run `tasuki worker` (the task worker and its compression worker) instead of celery's
    # A host of its own: the worker runs in a UTS namespace with this hostname (``unshare --uts``, root only), so
    # its locks name another machine and only their heartbeat says whether they are stale (SPEC §4).
    hostname: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> WorkerProcess:
        """Start the worker and wait until it answers a ping."""
        quiet = ["--without-gossip", "--without-mingle", "-E", "-l", "INFO"]
        if self.tasuki:
            cmd = [sys.executable, "-m", "cli.main", "worker", "-n", f"{self.name}@%h", "-c", str(self.concurrency),
                   *quiet]
        else:
            cmd = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-n", f"{self.name}@%h",
                   "-Q", self.queues, "-c", str(self.concurrency), "-P", self.pool, *quiet]
        if self.hostname is not None:  # unshare execs: the worker keeps the pid, the session and the group
            cmd = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname, *cmd]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        self.process = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for_ping(self.env["TASUKI__BROKER__URL"], self.hostname_prefix, self.process, self.log_path)
        return self

    @property
    def hostname_prefix(self) -> str:
        return f"{self.name}@"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the whole process group (the machine died) and reap it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (warm shutdown) and wait for the worker to exit; returns its exit code."""
        self.ask_to_stop()
        return self.wait(timeout_s)

    def ask_to_stop(self) -> None:
        """SIGTERM (warm shutdown) without waiting: the test decides what happens before the worker exits."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)

    def wait(self, timeout_s: float = 60.0) -> int:
        """Wait for the worker to exit (SIGKILL past ``timeout_s``, answering -9); returns its exit code."""
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def stop(self) -> None:
        """Stop it whatever state it is in (test teardown)."""
        if self.process is not None and self.process.poll() is None:
            self.terminate(timeout_s=20)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_for_ping(broker_url: str, prefix: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    """Poll ``control.ping`` until a worker whose name starts with ``prefix`` answers."""
    probe = Celery(broker=broker_url)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            replies = probe.control.ping(timeout=0.5) or []
            if any(name.startswith(prefix) for reply in replies for name in reply):
                return
        raise RuntimeError(f"worker {prefix} did not answer a ping:\n{log_path.read_text()[-3000:]}")
    finally:
        probe.close()


# Scripted trajectories written before the finish gate end with one finish; the gate's own tests turn it on.
LEGACY_FINISH = {"TASUKI__AGENT__FINISH_GATE": "false"}


def worker_env(base: Mapping[str, str], **overrides: str) -> dict[str, str]:
    """The environment of a worker subprocess: the test's settings as TASUKI__ variables (the finish gate off unless
    ``base`` or ``overrides`` turn it on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update(LEGACY_FINISH)
    env.update(base)
    env.update(overrides)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env
