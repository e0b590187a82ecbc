"""Failures a running task meets: a flaky or broken model, tool paths that leave the checkout, cancellation.

A task cancelled while still queued is finished as ``cancelled`` without running: no worker may have been
listening when it was revoked (Celery keeps revocations in worker memory), so the worker that later takes
the message finds the cancel flag in Redis and records a ``cancelled`` context — no model call, no
checkout — so the operator can see what became of the task.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from contexts import ContextStore
from contexts.names import MESSAGES_FILE, TOOLS_FILE
from tests.helpers.celery_worker import celery_client
from tests.helpers.model_server import wait_for_request
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    PROVIDERS,
    agent_requests,
    bash_turn,
    context_records,
    finish_turn,
    running_stack,
    tool,
)
from worker.names import ACTIVE_PREFIX, CANCEL_PREFIX, TASKS_QUEUE
from worker.settings import load_settings
from worker.submit import enqueue, request_cancel, task_key_id

pytestmark = pytest.mark.integration

SECRET = "the-secret-outside-the-checkout"


def cancel(stack: Stack, client: redis.Redis, uuid: str) -> str:
    """What ``tasuki cancel UUID`` does."""
    with celery_client(stack.redis_url) as app:
        return request_cancel(app, client, ContextStore(stack.contexts_dir), uuid)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_errors_are_retried_and_the_task_completes(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, provider: str
) -> None:
    turns = [{"fail": 500}, bash_turn(0), {"fail": 503, "times": 2}, finish_turn()]
    with running_stack(tmp_path, redis_url, turns, provider=provider) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        assert state["llm_call_count"] == 2
        assert [(r["turn"], r["status"]) for r in agent_requests(server.requests)] == [
            (0, 500),
            (0, 200),
            (1, 503),
            (1, 503),
            (1, 200),
        ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_model_that_keeps_failing_fails_the_task_with_a_one_line_error_naming_the_status(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, provider: str
) -> None:
    turns = [{"fail": 500, "times": 50}, bash_turn(0)]
    env = {"TASUKI__LLM__MAX_RETRIES": "2"}
    with running_stack(tmp_path, redis_url, turns, provider=provider, env=env) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        state = stack.wait_finished(uuid)

        assert state["status"] == "failed", state
        error = state["error"]
        assert "HTTP 500" in error, error
        assert provider in error, error
        assert "\n" not in error
        assert "Traceback" not in error
        assert state["llm_call_count"] == 0
        assert [r["status"] for r in agent_requests(server.requests)] == [500, 500, 500]  # 1 try + 2 retries
        directory = stack.contexts_dir / "completed" / uuid
        validate_context_dir(directory)
        assert [m["role"] for m in context_records(directory, MESSAGES_FILE)] == ["system", "user"]
        celery_state, celery_result = stack.celery_state(uuid)  # what Flower shows
        assert celery_state == "FAILURE"
        assert "HTTP 500" in str(celery_result)


def test_tool_paths_leaving_the_checkout_are_refused_and_the_task_goes_on(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    repo = make_buggy_repo(tmp_path / "repo")
    os.symlink(outside, repo / "escape")  # committed: every clone of the repository has the link
    git(repo, "add", "escape")
    git(repo, "commit", "-q", "-m", "a link out of the repository")
    turns = [
        {"content": None, "tool_calls": [tool("read_file", path="../outside/secret.txt")]},
        {"content": None, "tool_calls": [tool("read_file", path="escape/secret.txt")]},
        {"content": None, "tool_calls": [tool("write_file", path="escape/planted.txt", content="x")]},
        {"content": None, "tool_calls": [tool("read_file", path=str(outside / "secret.txt"))]},
        {"content": None, "tool_calls": [tool("read_file", path="calc.py")]},
        finish_turn("Could not read outside the checkout."),
    ]
    with running_stack(tmp_path, redis_url, turns) as (stack, _):
        stack.start_worker("w1")
        uuid = stack.send(local_request(repo))
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        directory = stack.contexts_dir / "completed" / uuid
        tools = context_records(directory, TOOLS_FILE)
        assert [t["status"] for t in tools] == ["error"] * 4 + ["success"] * 2
        errors = [t["error"] for t in tools[:4]]
        assert "'..' is not allowed" in errors[0]
        assert "outside the repository through a symlink" in errors[1]
        assert "outside the repository through a symlink" in errors[2]
        assert "absolute paths are not allowed" in errors[3]
        replies = [m for m in context_records(directory, MESSAGES_FILE) if m["role"] == "tool"]
        assert all(m["content"].startswith("error: ") for m in replies[:4])
        assert not (outside / "planted.txt").exists()
        for name in (MESSAGES_FILE, TOOLS_FILE):
            assert SECRET not in (directory / name).read_text()


def test_a_running_task_cancelled_stops_with_status_cancelled_at_the_next_step(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(0), {"delay_s": 300}, bash_turn(1), bash_turn(2), finish_turn()]
    with running_stack(tmp_path, redis_url, turns) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == 1 and r["status"] is None, 60)

        assert "stops at its next step" in cancel(stack, redis_client, uuid)
        server.model.stop()  # the slow answer arrives now (a model's reply cannot be cut short)
        state = stack.wait_finished(uuid)

        assert state["status"] == "cancelled", state
        assert state["error"] == "cancelled on request"
        assert state["llm_call_count"] == 2  # the step in flight finished; no further model call
        assert [r["turn"] for r in agent_requests(server.requests)] == [0, 1]
        directory = stack.contexts_dir / "completed" / uuid
        validate_context_dir(directory)
        assert len(context_records(directory, TOOLS_FILE)) == 2
        assert stack.celery_state(uuid)[0] in ("FAILURE", "REVOKED")  # never SUCCESS in Flower
        stack.wait_until(lambda: not (tmp_path / "workspaces" / uuid).exists(), what="workspace removal")


def test_a_task_cancelled_while_queued_never_runs_and_is_recorded_as_cancelled(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, [finish_turn()]) as (stack, server):
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))  # no worker is running yet

        assert cancel(stack, redis_client, uuid) == "task revoked before it started"
        assert redis_client.exists(CANCEL_PREFIX + uuid)
        stack.start_worker("w1")
        state = stack.wait_finished(uuid)

        assert state["status"] == "cancelled", state
        assert state["llm_call_count"] == 0
        assert server.requests == []  # the model was never asked
        directory = stack.contexts_dir / "completed" / uuid
        validate_context_dir(directory)
        assert context_records(directory, MESSAGES_FILE) == []
        assert not (tmp_path / "workspaces" / uuid).exists()  # never checked out
        assert redis_client.llen(TASKS_QUEUE) == 0


def test_a_task_past_its_soft_time_limit_ends_as_timeout_even_inside_a_slow_model_call(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(0), {"delay_s": 300}, bash_turn(1), finish_turn()]
    env = {"TASUKI__AGENT__SOFT_TIME_LIMIT_S": "3", "TASUKI__AGENT__TIME_LIMIT_S": "120"}
    with running_stack(tmp_path, redis_url, turns, env=env) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        state = stack.wait_finished(uuid, timeout_s=60)
        server.model.stop()  # release the held answer so the server can stop

        assert state["status"] == "timeout", state
        assert state["error"] == "soft time limit reached"
        assert stack.celery_state(uuid)[0] == "FAILURE"
        directory = stack.contexts_dir / "completed" / uuid
        validate_context_dir(directory)
        stack.wait_until(lambda: not (tmp_path / "workspaces" / uuid).exists(), what="workspace removal")


def test_a_task_whose_contexts_root_cannot_be_made_fails_visibly_and_frees_its_issue(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the contexts root should go\n")
    env = {"TASUKI__CONTEXTS__BASE_DIR": str(blocker / "contexts")}  # even root cannot make this directory
    with running_stack(tmp_path, redis_url, [finish_turn()], env=env) as (stack, _server):
        stack.start_worker("w1")
        request = local_request(make_buggy_repo(tmp_path / "repo"))
        with celery_client(redis_url) as app:
            settings = load_settings(env={"TASUKI__BROKER__URL": redis_url})
            uuid = enqueue(app, redis_client, settings, request).uuid
        state, result = stack.celery_state(uuid, timeout_s=60)

    assert state == "FAILURE"
    assert "cannot create the context under" in str(result)
    assert redis_client.get(ACTIVE_PREFIX + task_key_id(request["task_key"])) is None  # the issue is free again
