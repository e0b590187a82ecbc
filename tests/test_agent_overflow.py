"""A prompt the model refuses as too long for its window (agent/loop.py ``Agent.ask``), in-process: a real context
store and git checkout in tmp_path, the replay model over HTTP with a context window, the ``openai`` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.llm import make_provider
from agent.llm.base import ContextOverflow
from agent.loop import OVERFLOW_RETRIES, Agent, AgentLimits
from agent.prompts import SYSTEM_PROMPT, task_message
from contexts import ContextStore
from contexts.compression import CompressionPolicy
from contexts.names import MESSAGES_FILE
from contexts.prompt import OMITTED_MARKER
from replay import ReplayServer
from tests.helpers.model_server import model_server
from tests.helpers.stack import make_buggy_repo
from tests.helpers.worker_scenarios import bash_turn, context_records, finish_turn, replayed_turn
from worker.checkout import Checkout

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}
CONTEXT_LENGTH = 32768
LONG_LOG = 300  # lines of the first step's output: some 4,000 tokens


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with model_server([bash_turn(0, lines=LONG_LOG), bash_turn(1), bash_turn(2), finish_turn()]) as replay:
        yield replay


def agent_for(tmp_path: Path, server: ReplayServer) -> Agent:
    """An agent without a compressor over a new task on the buggy calc repository."""
    store = ContextStore(tmp_path / "contexts", stale_after_s=60)
    ctx = store.create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
    ctx.append_message("system", SYSTEM_PROMPT)
    ctx.append_message("user", task_message("Print the logs."))
    ctx.step_done()
    checkout = Checkout(tmp_path / "workspace", str(make_buggy_repo(tmp_path / "repo")), "tasuki/1-overflow")
    checkout.prepare()
    provider = make_provider("openai", "scripted", CONTEXT_LENGTH, server.openai_base_url, None, max_retries=0)
    return Agent(ctx, provider, checkout, AgentLimits(20, CONTEXT_LENGTH, 20000, bash_timeout_s=30),
                 CompressionPolicy())


def chats(server: ReplayServer) -> list[dict[str, Any]]:
    return [r for r in server.requests if r["path"].endswith("/chat/completions")]


def test_without_a_compressor_the_emergency_rule_cuts_the_prompt_and_the_smaller_window_is_kept(
    tmp_path: Path, server: ReplayServer
) -> None:
    agent = agent_for(tmp_path, server)
    agent.step()  # the long log
    agent.step()
    window = chats(server)[-1]["prompt_tokens"] - 1000  # the long log does not fit any more
    server.model.context_window = window

    summary = agent.run()

    assert summary == "Printed every log block."
    requests = chats(server)[2:]
    assert [r["status"] for r in requests] == [400, 200, 200]  # refused once; the same step sent again, then on
    assert requests[1]["prompt_tokens"] <= window < requests[0]["prompt_tokens"]
    resent = [m.get("content") or "" for m in requests[1]["body"]["messages"]]
    assert not any("step 0 line 1:" in text for text in resent)  # the long log is what was left out
    assert any(text.startswith(OMITTED_MARKER.split("{")[0]) for text in resent)
    assert requests[2]["prompt_tokens"] <= window  # the smaller budget stays for the task's later steps
    replies = [m for m in context_records(agent.ctx.path, MESSAGES_FILE) if m["role"] == "assistant"]
    assert [replayed_turn(m) for m in replies] == [0, 1, 2, 3]  # each turn once: the refusal is no step


def test_a_prompt_that_never_fits_raises_after_a_bounded_number_of_smaller_tries(
    tmp_path: Path, server: ReplayServer
) -> None:
    agent = agent_for(tmp_path, server)
    agent.step()
    server.model.context_window = 100  # less than the pinned task alone

    with pytest.raises(ContextOverflow, match=f"after {OVERFLOW_RETRIES} tries to shrink it"):
        agent.step()

    assert [r["status"] for r in chats(server)[1:]] == [400] * (OVERFLOW_RETRIES + 1)
    assert agent.ctx.read_state()["llm_call_count"] == 1
    assert [m["role"] for m in context_records(agent.ctx.path, MESSAGES_FILE)][-1] == "tool"  # nothing written
