"""A model that writes its tool calls as text (issue 37 item 4): the calls run like native ones and the task
finishes; a model that never writes a usable call fails after ``agent.max_format_errors`` replies, not at its step
limit.

Whole tasks run on a real celery worker against the replay model over HTTP, whose turns carry no native call, only
text; the count's reset and its survival across a resume are checked on the agent loop in-process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.llm import make_provider
from agent.loop import Agent, AgentLimits, FormatErrors
from agent.prompts import NUDGE, SYSTEM_PROMPT, task_message
from contexts import Context, ContextStore
from contexts.clock import utc_now
from contexts.compression import CompressionPolicy
from contexts.names import MESSAGES_FILE, TOOLS_FILE
from replay import ReplayServer
from tests.helpers.model_server import model_server
from tests.helpers.stack import git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import agent_requests, context_records, running_stack
from worker.checkout import Checkout

TESTS = "python -m unittest -q"
FIX_IN_TEXT = [  # the calc fix, each call in a way small models write it (the first as the recorded Qwen did)
    {"content": f'I will run the tests first.\n```json\n{{\n  "name": "bash",\n  "arguments": {{\n'
                f'    "command": "{TESTS}"\n  }}\n}}\n```\n'},
    {"content": '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>'},
    {"content": 'add subtracts. {"name": "edit_file", "parameters": {"path": "calc.py", '
                '"old_string": "return a - b", "new_string": "return a + b"}}'},
    {"content": f'```\n{{"name": "bash", "arguments": {{"command": "{TESTS}"}}}}\n```'},
    {"content": '```json\n{"name": "finish", "arguments": {"summary": "add() subtracted; it adds now."}}\n```'},
]
NONSENSE = [
    {"content": "The bug is probably in calc.py. I hope this helps!"},
    {"content": "```python\ndef add(a, b):\n    return a + b\n```"},
    {"content": 'Call {"name": "run_tests", "arguments": {}} to check.'},  # a tool Tasuki does not have
]
EXHAUSTED = "the model answered 3 times in a row without a tool call Tasuki could run"

pytestmark = pytest.mark.integration


def bare_repo(tmp_path: Path) -> Path:
    """A bare repository holding the buggy calc project: the remote a local task clones and pushes to."""
    bare = tmp_path / "calc.git"
    source = make_buggy_repo(tmp_path / "calc-source")
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True, capture_output=True)
    return bare


def test_a_model_that_writes_every_call_as_text_gets_the_task_done(tmp_path: Path, redis_url: str) -> None:
    with running_stack(tmp_path, redis_url, FIX_IN_TEXT) as (stack, server):
        bare = bare_repo(tmp_path)
        stack.start_worker("w1")
        uuid = stack.send(local_request(bare))
        state = stack.wait_finished(uuid)
        asked = len(agent_requests(server.requests))

    assert state["status"] == "completed", state
    assert state["llm_call_count"] == asked == len(FIX_IN_TEXT)
    directory = stack.contexts_dir / "completed" / uuid
    tools = context_records(directory, TOOLS_FILE)
    assert [t["tool_name"] for t in tools] == ["bash", "read_file", "edit_file", "bash", "finish"]
    assert "FAILED" in tools[0]["result"]
    assert tools[3]["result"].endswith("OK\nexit code: 0")
    replies = [m for m in context_records(directory, MESSAGES_FILE) if m["role"] == "assistant"]
    assert all(m["tool_calls_from"] == "text" for m in replies)
    assert all(m["content"].endswith(turn["content"].strip()) for m, turn in zip(replies, FIX_IN_TEXT, strict=True))
    assert not any(m["role"] == "user" and m["content"] == NUDGE for m in context_records(directory, MESSAGES_FILE))
    branch = state["result"]["branch"]
    assert git(bare, "show", f"{branch}:calc.py") == "def add(a, b):\n    return a + b\n"


def test_a_model_that_never_writes_a_usable_call_fails_after_three_replies(tmp_path: Path, redis_url: str) -> None:
    usable_after = {"content": '{"name": "bash", "arguments": {"command": "echo never asked"}}'}
    with running_stack(tmp_path, redis_url, [*NONSENSE, usable_after]) as (stack, server):
        bare = bare_repo(tmp_path)
        stack.start_worker("w1")
        uuid = stack.send(local_request(bare))
        state = stack.wait_finished(uuid)
        asked = [r["turn"] for r in agent_requests(server.requests)]

    assert (state["status"], state["error"]) == ("failed", EXHAUSTED)
    assert asked == [0, 1, 2]  # no step after the third: the usable turn behind them was never asked for
    assert state["llm_call_count"] == 3
    messages = context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
    assert [m["role"] for m in messages[2:]] == ["assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in messages[2:] if m["role"] == "user"] == [NUDGE, NUDGE]
    assert context_records(stack.contexts_dir / "completed" / uuid, TOOLS_FILE) == []


# -- the count, in-process ------------------------------------------------------------------------------------------

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}
CONTEXT_LENGTH = 32768
STALE_AFTER_S = 60


class Bench:
    """A held context, a checkout of the calc repository and the replay model: what one agent loop runs over."""

    def __init__(self, root: Path, server: ReplayServer) -> None:
        self.server = server
        self.store = ContextStore(root / "contexts", stale_after_s=STALE_AFTER_S)
        self.ctx: Context = self.store.create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
        self.ctx.append_message("system", SYSTEM_PROMPT)
        self.ctx.append_message("user", task_message("Fix add()."))
        self.ctx.step_done()
        self.checkout = Checkout(root / "workspace", str(make_buggy_repo(root / "repo")), "tasuki/1-text")
        self.checkout.prepare()

    def agent(self) -> Agent:
        provider = make_provider("openai", "scripted", CONTEXT_LENGTH, self.server.openai_base_url, None, max_retries=0)
        limits = AgentLimits(20, CONTEXT_LENGTH, 20000, bash_timeout_s=30, max_format_errors=3)
        return Agent(self.ctx, provider, self.checkout, limits, CompressionPolicy())

    def resume_elsewhere(self) -> None:
        """Leave the context as a crashed worker would; another host takes it over once it is stale."""
        self.ctx.detach()
        later = utc_now() + timedelta(seconds=STALE_AFTER_S + 1)
        store = ContextStore(self.store.base_dir, stale_after_s=STALE_AFTER_S, hostname="other", clock=lambda: later)
        self.ctx = store.open(self.ctx.uuid, heartbeat=False)


@pytest.fixture
def bench(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Bench]:
    with model_server(request.param) as server:
        b = Bench(tmp_path, server)
        yield b
        if not b.ctx.closed:
            b.ctx.detach()


def turns(*entries: dict[str, Any]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("bench", [list(entries)], indirect=True)


@turns(NONSENSE[0], NONSENSE[1], FIX_IN_TEXT[0], NONSENSE[0], NONSENSE[2], FIX_IN_TEXT[-1])
def test_a_usable_call_starts_the_count_again(bench: Bench) -> None:
    agent = bench.agent()
    for _ in range(2):
        agent.step()
    assert bench.ctx.read_state()["format_errors"] == 2

    agent.step()  # a call written as text: the tests run, the count starts again
    assert bench.ctx.read_state()["format_errors"] == 0

    assert agent.run() == "add() subtracted; it adds now."  # two more without a call, then finish: no failure
    assert [r["turn"] for r in agent_requests(bench.server.requests)] == [0, 1, 2, 3, 4, 5]


@turns(*NONSENSE, FIX_IN_TEXT[-1])
def test_a_resumed_task_goes_on_counting(bench: Bench) -> None:
    agent = bench.agent()
    agent.step()
    agent.step()
    bench.resume_elsewhere()

    assert bench.ctx.read_state()["format_errors"] == 2
    with pytest.raises(FormatErrors, match=EXHAUSTED):
        bench.agent().step()
    assert [r["turn"] for r in agent_requests(bench.server.requests)] == [0, 1, 2]
