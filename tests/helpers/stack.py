"""A Tasuki stack for integration tests: real Redis, real celery workers, the replay model over HTTP."""

from __future__ import annotations

import json
import subprocess
import time
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from contexts.names import FINAL_STATUSES
from tests.helpers.celery_worker import WorkerProcess, worker_env
from worker.names import PERMISSION_PREFIX, RUN_TASK, TASK_PREFIX, TASKS_QUEUE

BUGGY_CALC = "def add(a, b):\n    return a - b\n"
FIXED_CALC = "def add(a, b):\n    return a + b\n"
CALC_TEST = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(cwd),
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_buggy_repo(path: Path) -> Path:
    """A git repository whose one test fails until ``calc.add`` is fixed."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(BUGGY_CALC)
    (path / "test_calc.py").write_text(CALC_TEST)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "calc with a bug")
    return path


def fix_calc_trajectory() -> list[dict[str, Any]]:
    """The scripted model's turns for fixing the calc repository."""
    return [
        {
            "content": "Run the tests first.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "python -m unittest -q"}}],
        },
        {"content": None, "tool_calls": [{"name": "read_file", "arguments": {"path": "calc.py"}}]},
        {
            "content": "add subtracts.",
            "tool_calls": [
                {
                    "name": "edit_file",
                    "arguments": {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"},
                }
            ],
        },
        {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "python -m unittest -q"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Fix add(): it subtracted."}}]},
    ]


@dataclass
class Stack:
    """Directories, settings environment and worker processes of one test."""

    root: Path
    redis_url: str
    model_url: str
    env_overrides: dict[str, str] = field(default_factory=dict)
    workers: list[WorkerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A new stack talks to a fake forge of its own: what an earlier test's forge said of a person on a repository
        # of the same name (the published payloads' gogits/hello-world, …) is not this one's, and the intake's cache
        # of it outlives that test in the session's database (CI: a Gitea labeller refused by this forge was let in
        # on another's "write").
        client = redis.Redis.from_url(self.redis_url)
        try:
            doomed = list(client.scan_iter(match=f"{PERMISSION_PREFIX}*", count=500))
            if doomed:
                client.delete(*doomed)
        except redis.RedisError:
            pass  # a test that starts no Redis-backed part: nothing cached to forget
        finally:
            client.close()

    @property
    def contexts_dir(self) -> Path:
        return self.root / "contexts"

    def env(self) -> dict[str, str]:
        base = {
            "TASUKI_CONFIG": str(self.root / "config.yaml"),
            "TASUKI__BROKER__URL": self.redis_url,
            "TASUKI__CONTEXTS__BASE_DIR": str(self.contexts_dir),
            "TASUKI__CONTEXTS__WORKSPACES_DIR": str(self.root / "workspaces"),
            "TASUKI__CONTEXTS__GIT_CACHE_DIR": str(self.root / "git-cache"),
            "TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S": "1",
            "TASUKI__CONTEXTS__STALE_AFTER_S": "3",
            "TASUKI__LLM__PROVIDER": "openai",
            "TASUKI__LLM__OPENAI__BASE_URL": f"{self.model_url}/v1",
            "TASUKI__LLM__OPENAI__MODEL": "scripted",
            "TASUKI__LLM__BACKOFF_BASE_S": "0.01",
            "TASUKI__COMPRESSION__START_TIMEOUT_S": "5",
        }
        (self.root / "config.yaml").write_text("")
        return worker_env(base, **self.env_overrides)

    def start_worker(self, name: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(name, self.env(), self.root / f"{name}.log", **kwargs).start()
        self.workers.append(worker)
        return worker

    def send(self, request: dict[str, Any], uuid: str | None = None) -> str:
        """Send ``tasuki.run_task`` the way the monitor and ``tasuki submit`` do (without the one-active-task
        rule, so a test can send the same task again), and record the task by UUID as every enqueue does."""
        uuid = uuid or str(uuid_module.uuid4())
        app = Celery(broker=self.redis_url)
        try:
            with redis.Redis.from_url(self.redis_url) as client:
                client.set(TASK_PREFIX + uuid, json.dumps(request["task_key"]), ex=3600)
            app.send_task(RUN_TASK, args=[uuid, request], task_id=uuid, queue=TASKS_QUEUE)
        finally:
            app.close()
        return uuid

    def celery_state(self, uuid: str, timeout_s: float = 30.0) -> tuple[str, Any]:
        """The state and result Celery recorded for ``uuid`` once it is final (what Flower shows)."""
        app = Celery(broker=self.redis_url, backend=self.redis_url)
        try:
            def final() -> tuple[str, Any] | None:
                result = app.AsyncResult(uuid)
                return (result.state, result.result) if result.state in ("SUCCESS", "FAILURE", "REVOKED") else None

            found: tuple[str, Any] = self.wait_until(final, timeout_s, f"Celery's final state of {uuid}")
            return found
        finally:
            app.close()

    def completed_state(self, uuid: str) -> dict[str, Any] | None:
        return final_state(self.contexts_dir, uuid)

    def wait_until(self, predicate: Callable[[], Any], timeout_s: float = 90.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        logs = "\n".join(f"--- {w.name}\n{w.log_text()[-4000:]}" for w in self.workers)
        raise AssertionError(f"timed out waiting for {what}\n{logs}")

    def wait_finished(self, uuid: str, timeout_s: float = 90.0) -> dict[str, Any]:
        state: dict[str, Any] = self.wait_until(lambda: self.completed_state(uuid), timeout_s, f"{uuid} to finish")
        return state

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def final_state(contexts_dir: Path, uuid: str) -> dict[str, Any] | None:
    """The state of a context once it is under ``completed/`` with its final status, else ``None``."""
    path = contexts_dir / "completed" / uuid / "state.json"
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state if state["status"] in FINAL_STATUSES else None


def local_request(repo: Path, prompt: str = "Make the tests pass.", task_id: str = "1") -> dict[str, Any]:
    return {
        "task_key": {
            "task_source": "local",
            "owner": "local",
            "repo": repo.name,
            "task_type": "prompt",
            "task_id": task_id,
        },
        "repo_path": str(repo),
        "prompt": prompt,
        "user": "tester",
    }
