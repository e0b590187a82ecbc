"""What the worker benchmarks share: a private Redis, a tiny repository, the replay model, real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from cli.embedded import EmbeddedRedis
from replay import ReplayModel, ReplayServer, serve
from replay.trajectory import turns_from_entries
from worker.names import RUN_TASK, TASKS_QUEUE

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 60.0
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@b",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@b",
}


@dataclass
class CeleryWorker:
    """``celery -A {app} worker`` in its own process group, ready once it answers a ping."""

    app: str
    name: str
    broker_url: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 1
    queues: str = "tasks,compression,maintenance"
    tasuki: bool = False  # `tasuki worker`: the task worker and its compression worker (broker from env)
    module: str = "celery"  # what `python -m` runs for a plain worker (bench.unfenced_worker: fencing off)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> CeleryWorker:
        """Start the worker (broker and result backend on ``broker_url``) and wait until it answers."""
        quiet = ["--without-gossip", "--without-mingle", "-E", "-l", "INFO"]
        if self.tasuki:
            cmd = [sys.executable, "-m", "cli.main", "worker", "-n", f"{self.name}@%h", "-Q", self.queues,
                   "-c", str(self.concurrency), *quiet]
        else:
            cmd = [sys.executable, "-m", self.module, "-A", self.app, "-b", self.broker_url,
                   "--result-backend", self.broker_url, "worker", "-n", f"{self.name}@%h", "-Q", self.queues,
                   "-c", str(self.concurrency), "-P", "prefork", *quiet]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
        env["TASUKI__AGENT__FINISH_GATE"] = "false"  # scripted tasks of one finish (bench_finish_gate turns it on)
        env.update(self.env)
        env["PYTHONPATH"] = str(REPO_ROOT)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        probe = Celery(broker=self.broker_url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited:\n{self.log_path.read_text()[-3000:]}")
                replies = probe.control.ping(timeout=0.5) or []
                if any(name.startswith(f"{self.name}@") for reply in replies for name in reply):
                    return self
        finally:
            probe.close()
        raise RuntimeError(f"{self.name} did not answer a ping:\n{self.log_path.read_text()[-3000:]}")

    def pool_processes(self) -> list[int]:
        """Process ids of the prefork pool (the children that run tasks)."""
        assert self.process is not None
        pid = self.process.pid
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(child) for child in text.split()]

    def stop(self) -> None:
        """Warm shutdown, then SIGKILL of the group if it lingers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def proc_status_kb(pid: int, field_name: str) -> int:
    """A ``/proc/{pid}/status`` memory field (``VmRSS``, ``VmHWM``) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field_name}")


def tiny_repo(path: Path) -> Path:
    """A git repository with one commit of one small file."""
    path.mkdir(parents=True)
    env = {**GIT_IDENTITY, "PATH": os.environ.get("PATH", os.defpath), "HOME": str(path)}
    (path / "README.md").write_text("A tiny repository.\n")
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "start")):
        subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True)
    return path


def tasuki_env(root: Path, redis_url: str, model_url: str, **overrides: str) -> dict[str, str]:
    """Settings of a benchmark's Tasuki worker: everything under ``root``, the replay model as its LLM."""
    config = root / "config.yaml"
    config.write_text("")
    return {
        "TASUKI_CONFIG": str(config),
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__CONTEXTS__BASE_DIR": str(root / "contexts"),
        "TASUKI__CONTEXTS__WORKSPACES_DIR": str(root / "workspaces"),
        "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(root / "git-cache"),
        "TASUKI__LLM__PROVIDER": "openai",
        "TASUKI__LLM__OPENAI__BASE_URL": f"{model_url}/v1",
        "TASUKI__LLM__OPENAI__MODEL": "scripted",
        **overrides,
    }


def local_request(repo: Path, task_id: str) -> dict[str, Any]:
    """A ``tasuki.run_task`` request for a task on the local repository ``repo``."""
    key = {"task_source": "local", "owner": "bench", "repo": repo.name, "task_type": "prompt", "task_id": task_id}
    return {"task_key": key, "repo_path": str(repo), "prompt": "Benchmark task.", "user": "bench"}


def send_run_task(app: Celery, uuid: str, request: dict[str, Any]) -> Any:
    """Send ``tasuki.run_task`` as ``tasuki submit`` does; returns its ``AsyncResult``."""
    return app.send_task(RUN_TASK, args=[uuid, request], task_id=uuid, queue=TASKS_QUEUE)


@contextmanager
def private_redis(data_dir: Path) -> Iterator[str]:
    """A redis-server of the benchmark's own; yields its URL."""
    server = EmbeddedRedis(data_dir).start()
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def replay_model(entries: list[dict[str, Any]]) -> Iterator[ReplayServer]:
    """The replay model answering ``entries`` from a thread of this process."""
    server = serve(ReplayModel(turns_from_entries(entries)))
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def client(redis_url: str) -> Iterator[Celery]:
    """A Celery client with broker and result backend on ``redis_url``."""
    app = Celery(broker=redis_url, backend=redis_url)
    try:
        yield app
    finally:
        app.close()
