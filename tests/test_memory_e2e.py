"""A second task on the same thread starts with what the first one learned: real worker, Redis, replay model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memory.sqlite import SQLiteMemoryStore
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, fix_calc_trajectory, git, local_request, make_buggy_repo

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object) -> Iterator[Stack]:
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url, {"TASUKI__MEMORY__EMBEDDING_MODEL": "tasuki-replay-embed"})
        s.model = server  # type: ignore[attr-defined]
        try:
            yield s
        finally:
            s.stop()


def first_user_message(stack: Stack, uuid: str) -> str:
    lines = (stack.contexts_dir / "completed" / uuid / "messages.jsonl").read_text().splitlines()
    return str(next(r for r in map(json.loads, lines) if r["role"] == "user")["content"])


def opening_messages(stack: Stack, uuid: str) -> list[dict[str, Any]]:
    lines = (stack.contexts_dir / "completed" / uuid / "messages.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:3]]


def thread_memory_of(path: Path, thread: str, scope: str = "thread") -> str | None:
    if not path.exists():
        return None
    store = SQLiteMemoryStore(path)
    try:
        memory = store.memory(scope, thread)
        return memory.text if memory else None
    finally:
        store.close()


def _memory_calls(stack: Stack, uuid: str) -> dict[str, Any] | None:
    """The task's usage by call once its memory jobs' model call is counted, else None: a thread's first episode is
    its memory as written (no call), the repository merge is one call."""
    state = json.loads((stack.contexts_dir / "completed" / uuid / "state.json").read_text())
    by_call: dict[str, Any] = state["usage"]["by_call"]
    memory = [bucket for bucket in by_call.values() if bucket["kind"] == "memory"]
    return by_call if memory and memory[0]["calls"] == 1 else None


def test_the_second_task_on_a_thread_starts_with_the_first_ones_memory(stack: Stack, tmp_path: Path) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    (repo / "AGENTS.md").write_text("Run the tests with python -m unittest.\n")
    git(repo, "add", "AGENTS.md")
    git(repo, "commit", "-q", "-m", "instructions for agents")
    stack.start_worker("w1")
    first = stack.send(local_request(repo))
    assert stack.wait_finished(first)["status"] == "completed"
    thread = f"{repo}#prompt/1"
    memory_db = tmp_path / "memory.db"
    remembered = stack.wait_until(lambda: thread_memory_of(memory_db, thread), what="the thread memory update")
    assert first in remembered
    merged = stack.wait_until(lambda: thread_memory_of(memory_db, str(repo), "repository"), what="the merge job")
    assert first in merged

    second = stack.send(local_request(repo))
    state = stack.wait_finished(second)

    assert state["status"] == "completed"
    prompt = first_user_message(stack, second)
    assert "Memory of this thread" in prompt
    assert first in prompt  # the earlier task's UUID, from the thread memory and the recalled episode
    owner = opening_messages(stack, second)[1]  # the owner's instructions: a system message, not memory
    assert owner["role"] == "system"
    assert "Run the tests with python -m unittest." in owner["content"]
    assert state["memory"]["instruction_files"] == ["AGENTS.md"]
    assert state["memory"]["thread_memory"] is True
    assert state["memory"]["repository_memory"] is True
    assert first in state["memory"]["episodes"]
    assert state["memory"]["note"] is None  # the vector path ran: no BM25-only note
    paths = [r["path"] for r in stack.model.requests]  # type: ignore[attr-defined]
    assert "/v1/embeddings" in paths
    first_state = json.loads((stack.contexts_dir / "completed" / first / "state.json").read_text())
    assert first_state["memory"]["episodes"] == []  # the first task had nothing to recall
    # Memory's model calls are metered for the task they serve: the second task's recall embedded its query;
    # the first task's memory update embedded its episode (its thread memory needed no model) and the repository
    # merge asked the model once.
    assert state["usage"]["by_call"]["embedding tasuki-replay-embed"]["prompt_tokens"] > 0
    calls = stack.wait_until(lambda: _memory_calls(stack, first), what="the memory update metered")
    assert calls["embedding tasuki-replay-embed"]["calls"] == 2  # its own first prompt's recall, its episode

    # The follow-up's first prompt carries the earlier task's facts, for a measured number of tokens more.
    assert "Fix add(): it subtracted." in prompt  # the first task's finish summary
    assert "Fix add(): it subtracted." not in first_user_message(stack, first)
    openers = {}
    for r in stack.model.requests:  # type: ignore[attr-defined]
        if r["kind"] == "agent" and r["turn"] == 0:
            task = next(m["content"] for m in r["body"]["messages"] if m["role"] == "user")
            openers[second if "Memory of this thread" in task else first] = r["prompt_tokens"]
    print(f"first prompt tokens: without memory {openers[first]}, with memory {openers[second]}")
    assert openers[second] > openers[first]
    # The second task's update runs too (and no message is left for another test's worker).
    stack.wait_until(lambda: second in (thread_memory_of(memory_db, thread) or ""), what="the second memory update")
