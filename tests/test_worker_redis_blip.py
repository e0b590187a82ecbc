"""A Redis restart of a few seconds does not cost a running task its attempt (issue: "one outage does not
stop the fleet"). The task runs on through the outage; the context lock, not Celery, keeps it single."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from contexts.names import MESSAGES_FILE
from tests.helpers.model_server import wait_for_request
from tests.helpers.redis_server import redis_answers, start_private_redis
from tests.helpers.stack import local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    agent_requests,
    bash_turn,
    context_records,
    finish_turn,
    replayed_turn,
    running_stack,
)

pytestmark = pytest.mark.integration

SLOW_TURN = 2


def test_a_redis_restart_while_a_task_runs_costs_it_no_attempt_and_no_repeated_step(tmp_path: Path) -> None:
    redis_url, stop_redis = start_private_redis(tmp_path)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    # The model holds its answer to SLOW_TURN until Redis is back: the restart lands inside that call however
    # long it takes.
    turns = [bash_turn(0), bash_turn(1), {"gate": "redis-back"}, bash_turn(SLOW_TURN), bash_turn(3), finish_turn()]
    try:
        (tmp_path / "stack").mkdir()
        with running_stack(tmp_path / "stack", redis_url, turns) as (stack, server):
            repo = make_buggy_repo(tmp_path / "repo")
            stack.start_worker("w1")
            uuid = stack.send(local_request(repo, prompt="Print the logs."))
            wait_for_request(lambda: server.requests, lambda r: r["turn"] == SLOW_TURN and r["status"] is None, 60)

            stop_redis()  # the broker goes away while the model thinks ...
            assert not redis_answers("127.0.0.1", port)
            _, stop_redis = start_private_redis(tmp_path, port)  # ... and comes back, empty (no persistence)
            server.model.open_gate("redis-back")

            state = stack.wait_finished(uuid, timeout_s=120)

            assert state["status"] == "completed", state
            assert state["attempt"] == 1
            messages = context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
            assert [replayed_turn(m) for m in messages if m["role"] == "assistant"] == list(range(5))
            asked = Counter(r["turn"] for r in agent_requests(server.requests))
            assert asked == dict.fromkeys(range(5), 1)
    finally:
        stop_redis()
