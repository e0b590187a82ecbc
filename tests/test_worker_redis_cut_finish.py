"""Redis cut between a worker and Redis over a task's finish (issue 26, point 5): the task completes on disk,
and once Redis answers again the monitor repairs from the context files what the worker could not record —
the running index, the active-task key, the thread and last task, Celery's state — so a new trigger starts a new
task instead of being answered ``active``.

Real parts: a real ``celery worker`` talking to Redis through a TCP proxy of the test's own, which the test cuts
when the replay model holds the finish turn's answer (an event, never a delay); the monitor is the real beat and a
maintenance worker on a direct connection; the fake GitHub over HTTP and git.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from contexts.names import ACTIVE_STATUSES
from tests.helpers.beat_process import BeatProcess
from tests.helpers.celery_worker import WorkerProcess
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import make_buggy_repo
from tests.helpers.tcp_proxy import TcpProxy
from tests.helpers.worker_scenarios import bash_turn, finish_turn, running_stack, tool
from worker.names import (
    ACTIVE_PREFIX,
    HEARTBEATS_KEY,
    LAST_TASK_PREFIX,
    RUNNING_STATUS_PREFIX,
    STATS_KEY,
    THREAD_PREFIX,
)
from worker.settings import load_settings
from worker.submit import enqueue, task_key_id
from worker.threads import Thread, key_id

pytestmark = pytest.mark.integration

FORGE_TOKEN = "cut-forge-token-5e1d"
OWNER, REPO = "octo", "calc"
MONITOR_ENV = {"TASUKI__MONITOR__INTERVAL_S": "1", "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2"}
TIMEOUT_S = 120.0


def issue_request(number: int) -> dict[str, Any]:
    """A label trigger on GitHub issue ``number`` (as the intake builds it)."""
    return {"task_key": {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue",
                         "task_id": str(number)},
            "issue": {"number": number, "title": "Fix add()", "body": "It subtracts."},
            "user": "octocat", "prompt": "", "trigger": {"kind": "label", "user": "octocat"}}


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[FakeForge]:
    with FakeForge(tmp_path / "forge", FORGE_TOKEN).serve() as fake:
        fake.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        fake.add_item(OWNER, REPO, 1, "Fix add()", "It subtracts.", labels=["bug"])
        yield fake


def redis_port(url: str) -> tuple[str, int, int]:
    rest = url.split("://", 1)[1]
    host, _, tail = rest.partition(":")
    port, _, db = tail.partition("/")
    return host, int(port), int(db or 0)


def held_as_running(client: redis.Redis, uuid: str) -> list[str]:
    """Where Redis still counts ``uuid`` as running."""
    keys = [HEARTBEATS_KEY, *(RUNNING_STATUS_PREFIX + status for status in ACTIVE_STATUSES)]
    return [key for key in keys if client.zscore(key, uuid) is not None]


def celery_state(redis_url: str, uuid: str) -> tuple[str, Any]:
    app = Celery(broker=redis_url, backend=redis_url)
    try:
        result = app.AsyncResult(uuid)
        return result.state, result.result
    finally:
        app.close()


def test_a_redis_cut_over_the_finish_is_repaired_by_the_monitor_from_the_context(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, forge: FakeForge
) -> None:
    host, port, db = redis_port(redis_url)
    (tmp_path / "stack").mkdir()
    # The model holds its `finish` answer at a gate until the test has cut the worker's Redis.
    # The first task changes a file (a task that changes nothing opens no pull request); the second only looks.
    note = {"content": "Note it.", "tool_calls": [tool("bash", command="echo fixed >> notes.txt")]}
    turns = [note, {"gate": "finish"}, finish_turn("Fixed add()."), bash_turn(0, lines=2),
             finish_turn("Again.")]
    env = {**MONITOR_ENV, "TASUKI__GITHUB__API_URL": forge.github_api_url, "GITHUB_TOKEN": FORGE_TOKEN}
    with TcpProxy(host, port) as proxy, running_stack(tmp_path / "stack", redis_url, turns, env=env) as (stack, server):
        through_proxy = {**stack.env(), "TASUKI__BROKER__URL": f"redis://127.0.0.1:{proxy.port}/{db}"}
        worker = WorkerProcess("w1", through_proxy, stack.root / "w1.log", queues="tasks,compression").start()
        stack.workers.append(worker)
        stack.start_worker("maint", queues="maintenance", pool="solo")  # the monitor, on a direct connection
        beat = BeatProcess("beat", stack.env(), tmp_path).start()
        try:
            settings = load_settings(env=stack.env())
            app = Celery(broker=redis_url)
            uuid = enqueue(app, redis_client, settings, issue_request(1)).uuid
            stack.wait_until(lambda: server.model.gate_reached("finish"), TIMEOUT_S, "the finish turn's request")

            proxy.cut()  # the worker's Redis goes away while the model answers `finish` ...
            server.model.open_gate("finish")
            state = stack.wait_finished(uuid, TIMEOUT_S)
            assert state["status"] == "completed", state
            stack.wait_until(lambda: "thread not recorded" in worker.log_text(), TIMEOUT_S,
                             "the worker to find Redis gone at the end of the task")
            assert "active-task key not released" in worker.log_text()
            active_key = ACTIVE_PREFIX + task_key_id(issue_request(1)["task_key"])
            assert redis_client.get(active_key) == uuid  # the cut kept the worker from releasing it
            proxy.restore()  # ... and comes back

            stack.wait_until(lambda: not redis_client.exists(active_key) and not held_as_running(redis_client, uuid),
                             TIMEOUT_S, "the monitor to release the task key and clean the running index")
            assert redis_client.get(LAST_TASK_PREFIX + task_key_id(issue_request(1)["task_key"])) == uuid
            change = forge.change(OWNER, REPO, state["result"]["branch"])
            pull_key = {**issue_request(1)["task_key"], "task_type": "pull_request", "task_id": str(change.number)}
            raw = redis_client.get(THREAD_PREFIX + key_id(pull_key))
            assert raw is not None
            assert Thread.from_json(json.loads(raw)) == Thread(
                issue_request(1)["task_key"], "pull_request", change.number, change.head, uuid)
            recorded = stack.wait_until(lambda: celery_state(redis_url, uuid)[0] == "SUCCESS" and
                                        celery_state(redis_url, uuid), TIMEOUT_S, "Celery's state to say SUCCESS")
            assert recorded[1]["status"] == "completed"
            assert recorded[1]["commit"] == state["result"]["commit"]

            again = enqueue(app, redis_client, settings, issue_request(1))  # a new trigger starts a new task
            assert not again.already_active
            assert again.uuid != uuid
            assert stack.wait_finished(again.uuid, TIMEOUT_S)["status"] == "completed"
            stack.wait_until(lambda: not held_as_running(redis_client, again.uuid), TIMEOUT_S, "the index clean")
            # Each finish counted once for /metrics, the cut one by the monitor.
            stack.wait_until(lambda: redis_client.hget(STATS_KEY, "finished:completed") == "2", TIMEOUT_S,
                             "two finished tasks counted")
            app.close()
        finally:
            beat.stop()
