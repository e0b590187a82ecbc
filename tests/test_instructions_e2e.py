"""The owner's instructions end to end: a real worker, Redis and the replay model; a repository with a root
AGENTS.md and a nested pkg/AGENTS.md, which reaches the model once, as a system message, after its first touch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import agent_requests, tool

pytestmark = pytest.mark.integration

ROOT_RULE = "Run the tests with python -m unittest."
PKG_RULE = "Inside pkg/, every function gets a one-line docstring."
TRAJECTORY = [
    {"content": "The code first.", "tool_calls": [tool("read_file", path="calc.py")]},
    {"content": "And the helper.", "tool_calls": [tool("read_file", path="pkg/util.py")]},
    {"content": "Once more.", "tool_calls": [tool("read_file", path="pkg/util.py")]},
    {"content": "Fix it.", "tool_calls": [
        tool("edit_file", path="calc.py", old_string="return a - b", new_string="return a + b")]},
    {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
    {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},  # after a finish gate
]


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object) -> Iterator[Stack]:
    with model_server(TRAJECTORY) as server:
        s = Stack(tmp_path, redis_url, server.url)
        s.model = server  # type: ignore[attr-defined]
        try:
            yield s
        finally:
            s.stop()


def owner_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if str(m.get("content") or "").startswith("Repository instructions")]


def test_a_nested_agents_md_reaches_the_model_once_with_the_owners_authority_after_its_first_touch(
    stack: Stack, tmp_path: Path
) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    (repo / "AGENTS.md").write_text(ROOT_RULE + "\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "AGENTS.md").write_text(PKG_RULE + "\n")
    (repo / "pkg" / "util.py").write_text("def double(x):\n    return 2 * x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "instructions for agents")
    stack.start_worker("w1")

    state = stack.wait_finished(stack.send(local_request(repo)))

    assert state["status"] == "completed"
    bodies = [r["body"] for r in agent_requests(stack.model.requests)]  # type: ignore[attr-defined]
    first, before, after, *rest = bodies
    root = owner_messages(first)
    assert len(root) == 1
    assert root[0]["role"] == "system"  # the owner's authority: a system message, not the task's quoted data
    assert ROOT_RULE in root[0]["content"]
    assert first["messages"][0]["content"].startswith("You are Tasuki")  # Tasuki's rules stay above it
    assert first["messages"][1] == root[0]
    assert PKG_RULE not in str(first) + str(before)  # nothing below pkg/ was touched yet
    nested = [m for m in owner_messages(after) if PKG_RULE in m["content"]]
    assert len(nested) == 1
    assert nested[0]["role"] == "system"
    assert "for pkg/" in nested[0]["content"]
    assert after["messages"][-1] == nested[0]  # right after the result of the read below pkg/
    for body in rest:  # the second read below pkg/ adds nothing: the message stays, once
        assert [m for m in owner_messages(body) if PKG_RULE in m["content"]] == nested
        assert str(body).count(PKG_RULE) == 1
    assert state["memory"]["instruction_files"] == ["AGENTS.md"]
