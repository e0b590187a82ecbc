"""The finish gate end to end (docs/finish-gate.md): a real celery worker, the replay model over HTTP, the fake GitHub
over real HTTP and git, and a repository whose check is real (``python3 -m unittest`` over a failing test) run in the
task's sandbox. The model finishes, reads the gate's failing check, fixes the code and finishes again: the pull
request carries the evidence and is ready for review; a task whose check still fails opens a draft — even when the
agent rewrote ``.tasuki/checks`` to ``true``, because the checks are the base commit's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts.names import MESSAGES_FILE
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack
from tests.helpers.worker_scenarios import context_records, provider_env, tool
from tests.test_finish_gate import CHECK, FIX, make_checked_repo
from worker.settings_models import LabelSettings

pytestmark = pytest.mark.integration

TOKEN = "gate-forge-token-7c2d"
OWNER, REPO = "octo", "calc"
CONSOLE = "https://tasuki.example.com/console"
SCRATCH = tool("write_file", path="reproduce_add.py", content="from calc import add\nprint(add(2, 3))\n")
MODULE = tool("write_file", path="mathutil.py", content="def double(x):\n    return 2 * x\n")


@contextmanager
def gated_forge(tmp_path: Path, redis_url: str, entries: list[dict[str, Any]]) -> Iterator[tuple[Stack, FakeForge]]:
    """The replay model answering ``entries``; the fake GitHub with the checked calc repository and issue 1, labelled;
    a worker with the finish gate on (its default) and a public console address."""
    server = serve(ReplayModel(turns_from_entries(entries)))
    try:
        with FakeForge(tmp_path / "forge", TOKEN).serve() as forge:
            forge.add_repo(OWNER, REPO, make_checked_repo(tmp_path / "source"))
            forge.add_item(OWNER, REPO, 1, "add() is wrong", "add(2, 3) gives -1.", labels=[LabelSettings().trigger])
            stack = Stack(tmp_path, redis_url, server.url, {
                **provider_env("openai", server.url, 32768),
                "TASUKI__GITHUB__API_URL": forge.github_api_url,
                "GITHUB_TOKEN": TOKEN,
                "TASUKI__AGENT__FINISH_GATE": "true",
                "TASUKI__CONSOLE__PUBLIC_URL": CONSOLE,
            })
            try:
                yield stack, forge
            finally:
                stack.stop()
    finally:
        server.stop()


def run_issue(stack: Stack, forge: FakeForge) -> tuple[str, dict[str, Any], FakeChange]:
    """Issue 1's task run to its end: its UUID, final state and pull request."""
    stack.start_worker("w1")
    key = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": "1"}
    uuid = stack.send({"task_key": key, "prompt": "", "user": "alice", "trigger": {"kind": "label", "user": "alice"}})
    state = stack.wait_finished(uuid, timeout_s=120)
    assert state["status"] == "completed", state
    return uuid, state, forge.change(OWNER, REPO, f"tasuki/1-{uuid[:8]}")


def on_branch(forge: FakeForge, branch: str, path: str) -> bool:
    bare = forge.git_root / OWNER / f"{REPO}.git"
    return subprocess.run(["git", "cat-file", "-e", f"{branch}:{path}"], cwd=bare, check=False).returncode == 0


def finish_answers(stack: Stack, uuid: str) -> list[str]:
    messages = context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
    return [str(m["content"]) for m in messages if m.get("tool_name") == "finish"]


def test_the_agent_fixes_what_the_gate_showed_failing_and_the_pull_request_carries_the_evidence(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [
        {"content": "Reproduce, and add a helper.", "tool_calls": [SCRATCH, MODULE]},
        {"content": "Done?", "tool_calls": [tool("finish", summary="Add mathutil.")]},
        {"content": "The gate's check fails: add() subtracts.", "tool_calls": [FIX]},
        {"content": "Now it passes.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
    ]
    with gated_forge(tmp_path, redis_url, turns) as (stack, forge):
        uuid, state, change = run_issue(stack, forge)

        validate_context_dir(stack.contexts_dir / "completed" / uuid)  # the gate's records fit the schemas
        review, accepted = finish_answers(stack, uuid)
        assert review.startswith("Not finished yet")
        assert f"$ {CHECK}\nexit 1 (failed)" in review  # run in the sandbox, on the unfixed code
        assert "AssertionError: -1 != 5" in review
        assert "reproduce_add.py  <- looks like scratch" in review
        assert accepted.startswith("task finished\nchecks: all 1 checks pass")
        assert not change.draft
        body = change.body
        assert body.startswith("Fix add(): it subtracted.")
        assert "All 1 checks pass (declared by .tasuki/checks;" in body
        assert f"`{CHECK}` — exit status 0 (passed)" in body
        assert "\nOK" in body  # the check's result lines
        assert "- `calc.py` (modified)\n- `mathutil.py` (added)" in body
        assert "Scratch files removed before the commit: `reproduce_add.py`" in body
        assert f"- Steps: {state['llm_call_count']} model calls" in body
        assert f"- Its page in the console: {CONSOLE}/tasks/{uuid}" in body
        assert "Closes #1" in body
        branch = change.head
        assert on_branch(forge, branch, "mathutil.py")
        assert not on_branch(forge, branch, "reproduce_add.py")  # scratch never reaches the branch
        assert forge.branch_file(OWNER, REPO, branch, "calc.py").endswith("return a + b\n")


def test_checks_that_still_fail_open_a_draft_though_the_agent_rewrote_its_checks_to_true(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [
        {"content": "Make the checks pass the easy way.", "tool_calls": [
            tool("write_file", path=".tasuki/checks", content="true\n"), MODULE, SCRATCH]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Add mathutil.")]},
        {"content": "Done anyway.", "tool_calls": [tool("finish", summary="Add mathutil.")]},
    ]
    with gated_forge(tmp_path, redis_url, turns) as (stack, forge):
        uuid, state, change = run_issue(stack, forge)

        review, accepted = finish_answers(stack, uuid)
        assert f"$ {CHECK}\nexit 1 (failed)" in review  # the base's check, not the agent's `true`
        assert "$ true" not in review
        assert accepted.startswith("task finished\nchecks: 1 of 1 checks fail")
        assert change.draft
        assert (state.get("result") or {}).get("checks") == "failed"
        assert "**1 of 1 checks fail**" in change.body
        assert f"`{CHECK}` — exit status 1 (failed)" in change.body
        assert "FAILED (failures=1)" in change.body
        item = forge.item(OWNER, REPO, 1)  # the final comment comes after the context is finished
        final = stack.wait_until(lambda: [c.body for c in item.comments if c.body.startswith("**Tasuki finished")],
                                 30, "the issue's final comment")
        assert "checks fail on this change, so the pull request is a draft" in final[-1]
        assert not on_branch(forge, change.head, "reproduce_add.py")
        assert on_branch(forge, change.head, "mathutil.py")
