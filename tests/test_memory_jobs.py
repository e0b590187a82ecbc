"""The scheduler's jobs and memory, run as real processes on real settings and Redis: a task the monitor fails
leaves an episode, and the daily retention job prunes old episodes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from contexts import ContextStore
from contexts.clock import utc_now
from memory.sqlite import SQLiteMemoryStore
from tests.helpers.celery_worker import REPO_ROOT, worker_env
from tests.helpers.context_support import CONFIG, TASK_KEY
from tests.helpers.memory_support import episode
from worker.names import HEARTBEATS_KEY, MAINTENANCE_QUEUE, MERGE_WAITING_PREFIX

pytestmark = pytest.mark.integration
REQUEST = {"task_key": TASK_KEY, "repo_path": "/nowhere", "prompt": "fix the parser"}


def run_job(code: str, tmp_path: Path, redis_url: str) -> str:
    (tmp_path / "config.yaml").write_text("")
    env = worker_env({
        "TASUKI_CONFIG": str(tmp_path / "config.yaml"),
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts"),
    })
    setup = "from worker.logging import configure_logging; configure_logging('WARNING'); "
    done = subprocess.run([sys.executable, "-c", setup + code], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_task_the_monitor_fails_leaves_an_episode(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    ghost = ContextStore(tmp_path / "contexts", hostname="ghost-host", clock=lambda: utc_now() - timedelta(minutes=10))
    ctx = ghost.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": REQUEST})
    ctx.append_message("user", "<task>\nfix the parser\n</task>")
    ctx.update_state(status="processing", attempt=3)
    ctx.detach()
    redis_client.zadd(HEARTBEATS_KEY, {ctx.uuid: (utc_now() - timedelta(minutes=10)).timestamp()})

    run_job("from scheduler.jobs import reap; reap()", tmp_path, redis_url)

    store = SQLiteMemoryStore(tmp_path / "memory.db")
    recorded = store.episode(ctx.uuid)
    thread = store.memory("thread", recorded.thread) if recorded else None
    store.close()
    assert recorded is not None
    assert recorded.status == "failed"
    assert recorded.task == "fix the parser"
    assert recorded.error is not None
    assert recorded.error.startswith("worker lost: heartbeat stale since ")
    # A thread's first episode is its memory as written, by the process that recorded it (no model, no job);
    # only the repository merge waits for a maintenance worker (the message is removed: no worker runs here).
    assert thread is not None
    assert thread.text.startswith(f"Task {ctx.uuid} (failed")
    assert thread.sources == (ctx.uuid,)
    repository = recorded.repository
    queued = [m for m in redis_client.lrange(MAINTENANCE_QUEUE, 0, -1) if repository in message_body(m)]
    for message in queued:
        redis_client.lrem(MAINTENANCE_QUEUE, 0, message)
    assert len(queued) == 1
    assert '"task": "tasuki.merge_memory"' in queued[0]
    assert redis_client.hgetall(MERGE_WAITING_PREFIX + repository) == {recorded.thread: ctx.uuid}


def message_body(message: str) -> str:
    """The decoded arguments of a Celery message as kombu's Redis transport stores it."""
    return base64.b64decode(json.loads(message)["body"]).decode()


def test_the_retention_job_prunes_episodes_older_than_prune_after_days(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    (tmp_path / "contexts").mkdir()
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    now = utc_now()
    for uuid, age in (("old", 91), ("new", 1)):
        store.add_episode(replace(episode(uuid, task=f"{uuid} work"), ended_at=now - timedelta(days=age)))
    store.close()

    run_job("from scheduler.jobs import retention; retention()", tmp_path, redis_url)

    store = SQLiteMemoryStore(tmp_path / "memory.db")
    assert store.episode("old") is None
    assert store.episode("new") is not None
    store.close()
