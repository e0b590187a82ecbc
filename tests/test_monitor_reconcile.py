"""The monitor's repair of Redis bookkeeping from the context files (scheduler.reconcile), piece by piece on real
Redis and a real context store: idempotent, counted once, never over a later task's records, and only for
contexts that are finished and quiet. The end-to-end case (a cut between a worker and Redis over the finish) is
tests/test_worker_redis_cut_finish.py."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from contexts import ContextStore
from scheduler.reconcile import reconcile
from tests.helpers.context_support import CONFIG, TASK_KEY
from worker import bookkeeping
from worker.names import ACTIVE_PREFIX, HEARTBEATS_KEY, LAST_TASK_PREFIX, RUNNING_STATUS_PREFIX, STATS_KEY
from worker.run import TaskRequest
from worker.submit import task_key_id

ACTIVE = ACTIVE_PREFIX + task_key_id(TASK_KEY)
LAST = LAST_TASK_PREFIX + task_key_id(TASK_KEY)


def finished_task(store: ContextStore, status: str = "completed") -> str:
    """A context finished on disk whose worker told Redis nothing: still indexed, its task key still active."""
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False,
                       extra_metadata={"request": asdict(TaskRequest(TASK_KEY, prompt="the task"))})
    ctx.append_message("user", "the task")
    ctx.finish(status, error=None if status == "completed" else "boom", result={"summary": "done", "branch": "b"})
    return ctx.uuid


def left_behind(client: redis.Redis, uuid: str) -> None:
    client.zadd(HEARTBEATS_KEY, {uuid: 1.0})
    client.zadd(RUNNING_STATUS_PREFIX + "processing", {uuid: 1.0})
    client.set(ACTIVE, uuid)


def later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=60)


def test_a_finished_tasks_leftovers_are_repaired_once_and_counted_once(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    uuid = finished_task(store)
    left_behind(redis_client, uuid)

    first = reconcile(store, redis_client, None, later(), quiet_s=3)
    again = reconcile(store, redis_client, None, later(), quiet_s=3)
    bookkeeping.release(redis_client, TASK_KEY, uuid, "completed")  # the worker's own bookkeeping, late

    assert [r.repaired for r in first] == [("index", "active", "last_task")]
    assert again == []  # nothing held any more: nothing read, nothing written
    assert redis_client.zscore(HEARTBEATS_KEY, uuid) is None
    assert redis_client.zscore(RUNNING_STATUS_PREFIX + "processing", uuid) is None
    assert not redis_client.exists(ACTIVE)
    assert redis_client.get(LAST) == uuid
    assert redis_client.hget(STATS_KEY, "finished:completed") == "1"


def test_a_task_finished_moments_ago_is_left_to_its_worker(tmp_path: Path, redis_client: redis.Redis) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    uuid = finished_task(store)
    left_behind(redis_client, uuid)

    assert reconcile(store, redis_client, None, datetime.now(UTC), quiet_s=30) == []
    assert redis_client.get(ACTIVE) == uuid


def test_a_later_tasks_records_are_never_replaced(tmp_path: Path, redis_client: redis.Redis) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    uuid = finished_task(store, "failed")
    redis_client.zadd(RUNNING_STATUS_PREFIX + "processing", {uuid: 1.0})
    redis_client.set(ACTIVE, "a-later-task")  # the old key expired; a later trigger's task holds it now
    redis_client.set(LAST, "a-later-task")

    [repaired] = reconcile(store, redis_client, None, later(), quiet_s=3)

    assert repaired.repaired == ("index", "last_task")
    assert redis_client.get(ACTIVE) == "a-later-task"
    assert redis_client.get(LAST) == "a-later-task"
    assert redis_client.hget(STATS_KEY, "finished:failed") == "1"


def test_running_and_queued_tasks_are_left_alone(tmp_path: Path, redis_client: redis.Redis) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    running = store.create(TASK_KEY, CONFIG, heartbeat=False)
    left_behind(redis_client, running.uuid)
    redis_client.set(ACTIVE_PREFIX + "github/o/r/issue/9", "0f0e0d0c-0b0a-4908-8706-050403020100")  # queued

    assert reconcile(store, redis_client, None, later(), quiet_s=3) == []
    assert redis_client.get(ACTIVE) == running.uuid
    assert redis_client.zscore(RUNNING_STATUS_PREFIX + "processing", running.uuid) is not None
    running.detach()
