"""Metering and the task budget (SPEC §16): the scripted model reports usage in both APIs, a task's totals match
what the model answered (also across a SIGKILL and resume), and a task stops at the first step over its cap."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis

from agent.llm import make_provider
from contexts import ContextStore
from contexts.names import MESSAGES_FILE
from replay import ReplayServer
from tests.helpers.model_server import model_server, wait_for_request
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    PROVIDERS,
    bash_turn,
    context_records,
    finish_turn,
    running_stack,
    tool,
)
from webhooks.metrics import Metrics
from worker.settings import load_settings

pytestmark = pytest.mark.integration

NOTE = "work so far\n"
SLOW_TURN = 3


def served_usage(requests: list[dict[str, Any]]) -> dict[str, int]:
    """What the replay model's log says it answered: calls and tokens of every answer it gave."""
    answered = [r["usage"] for r in requests if r.get("usage")]
    return {
        "calls": len(answered),
        "prompt_tokens": sum(u["prompt_tokens"] for u in answered),
        "completion_tokens": sum(u["completion_tokens"] for u in answered),
        "cached_tokens": sum(u["cached_tokens"] for u in answered),
    }


def counted_usage(state: dict[str, Any]) -> dict[str, int]:
    usage = state["usage"]
    return {name: usage[name] for name in ("calls", "prompt_tokens", "completion_tokens", "cached_tokens")}


def settled(stack: Stack, server: ReplayServer, uuid: str) -> dict[str, Any]:
    """The finished task's state once it counts every call the model server answered for it: the memory
    update after the task's end (on the maintenance queue) is metered for the task too, a moment later."""
    path = stack.contexts_dir / "completed" / uuid / "state.json"

    def agreed() -> dict[str, Any] | None:
        state: dict[str, Any] = json.loads(path.read_text())
        return state if counted_usage(state) == served_usage(server.requests) else None

    result: dict[str, Any] = stack.wait_until(agreed, 60, "the task's totals to match the model server's log")
    return result


def cost_metric(text: str) -> float | None:
    counted = re.search(r'tasuki_cost_total\{model="scripted"\} ([0-9.e-]+)', text)
    return float(counted.group(1)) if counted else None


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_scripted_model_reports_usage_that_the_provider_reads(provider: str) -> None:
    turns = [bash_turn(0), finish_turn()]
    with model_server(turns) as server:
        base = f"{server.url}/v1" if provider == "openai" else server.url
        chat = make_provider(provider, "scripted", 8192, base, None)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."},
                                          {"role": "user", "content": "Print the log block."}]
        first = chat.chat(messages)
        call = first.tool_calls[0]
        messages += [first.to_message(), {"role": "tool", "tool_call_id": call.id, "content": "step 0 printed"}]
        second = chat.chat(messages)
        log = [r["usage"] for r in server.requests if r.get("usage")]
    assert len(log) == 2
    for reply, usage in zip((first, second), log, strict=True):
        assert reply.prompt_tokens == usage["prompt_tokens"] > 0
        assert reply.completion_tokens == usage["completion_tokens"] > 0
    # A later turn's pinned prefix is what a prompt cache serves; only the OpenAI API reports it.
    assert (second.cached_tokens or 0) == log[1]["cached_tokens"]
    assert (log[1]["cached_tokens"] > 0) == (provider == "openai")
    assert first.cached_tokens in (0, None)


def budget_trajectory() -> list[dict[str, Any]]:
    return [
        {"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
        *(bash_turn(step) for step in range(1, 12)),
        finish_turn("Left a note."),
    ]


def test_a_task_with_task_tokens_stops_at_the_first_step_over_it_and_reports_it(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    cap = 6000
    prices = {"scripted": {"input": 2.0, "cached_input": 1.0, "output": 8.0}}
    env = {"TASUKI__LIMITS__TASK_TOKENS": str(cap), "TASUKI__PRICING": json.dumps(prices)}
    with running_stack(tmp_path, redis_url, budget_trajectory(), context_length=32768, env=env) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        stack.start_worker("w1")
        uuid = stack.send(local_request(repo, prompt="Leave a note."))
        stopped = stack.wait_finished(uuid)
        state = settled(stack, server, uuid)
        served = served_usage(server.requests)
        cost = ((served["prompt_tokens"] - served["cached_tokens"]) * 2.0 + served["cached_tokens"] * 1.0
                + served["completion_tokens"] * 8.0) / 1_000_000
        metrics = Metrics(load_settings(env=stack.env()), redis_client)
        stack.wait_until(lambda: cost_metric(metrics.render().decode()) == pytest.approx(cost), 30,
                         "every call's cost to be counted in Redis")
        text = metrics.render().decode()

    assert stopped["status"] == "failed", state
    assert state["reason"] == "budget"
    directory = stack.contexts_dir / "completed" / uuid
    validate_context_dir(directory)
    steps = [m["usage"] for m in context_records(directory, MESSAGES_FILE) if m["role"] == "assistant"]
    running = 0
    first_over = None
    for number, usage in enumerate(steps, start=1):
        running += usage["prompt_tokens"] + usage["completion_tokens"]
        if running >= cap and first_over is None:
            first_over = number
    assert first_over is not None, steps
    assert 1 < first_over < len(budget_trajectory()), steps
    assert state["llm_call_count"] == len(steps) == first_over  # not a step later
    assert state["usage"]["by_call"]["agent scripted"]["tokens"] == running
    assert state["usage"]["tokens"] == state["total_tokens_used"]
    assert state["error"] == f"budget: the task used {running} tokens, limits.task_tokens is {cap}"
    assert state["usage"]["cost_usd"] == pytest.approx(cost)
    assert f'tasuki_tokens_total{{kind="agent",model="scripted"}} {float(running)}' in text
    # The work so far is on the remote, committed as unfinished on the task branch, for a person (or a retry) to pick
    # up; its checkpoint branch went with that push.
    branch = f"tasuki/1-{uuid[:8]}"
    assert git(repo, "show", f"{branch}:notes.txt") == NOTE
    assert git(repo, "log", "-1", "--format=%s", branch).strip() == "tasuki: unfinished, stopped at its budget"
    assert state["result"]["branch"] == branch
    assert f"tasuki-checkpoints/1-{uuid[:8]}" not in git(repo, "branch", "--list", "tasuki-checkpoints/*")


def crash_trajectory() -> list[dict[str, Any]]:
    return [
        {"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
        bash_turn(1),
        bash_turn(2),
        {"delay_s": 300},
        bash_turn(SLOW_TURN),
        bash_turn(4),
        finish_turn("Left a note."),
    ]


def test_a_worker_killed_mid_task_leaves_totals_that_match_what_the_model_answered(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, crash_trajectory(), context_length=8192) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        first = stack.start_worker("w1")
        request = local_request(repo, prompt="Leave a note.")
        uuid = stack.send(request)
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == SLOW_TURN and r["status"] is None, 60)
        first.kill()  # the machine died while the model was thinking about the slow turn
        store = ContextStore(stack.contexts_dir, stale_after_s=float(stack.env()["TASUKI__CONTEXTS__STALE_AFTER_S"]))
        stack.wait_until(lambda: not store.is_held(uuid), 30, "the dead holder's lock to go stale")
        stack.start_worker("w2")
        stack.send(request, uuid=uuid)
        assert stack.wait_finished(uuid)["status"] == "completed"
        state = settled(stack, server, uuid)  # before the server stops (that ends the abandoned request)

    assert state["attempt"] == 2
    assert state["usage"]["by_call"]["agent scripted"]["calls"] == 6  # each turn once: the abandoned one never answered
    assert state["usage"]["cost_usd"] is None  # no prices configured
