"""The main job end to end: a task in Redis, a real celery worker, the scripted model over HTTP, a git repo."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.helpers.model_server import model_server
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import FIXED_CALC, Stack, fix_calc_trajectory, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import finish_turn

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object) -> Iterator[Stack]:
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url)
        s.model = server  # type: ignore[attr-defined]
        try:
            yield s
        finally:
            s.stop()


def test_task_fixes_failing_test_and_leaves_branch_with_the_fix(stack: Stack, tmp_path: Path) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    stack.start_worker("w1")
    uuid = stack.send(local_request(repo))

    state = stack.wait_finished(uuid)

    assert state["status"] == "completed", state
    assert state["llm_call_count"] == 5
    assert state["tool_call_count"] == 5
    assert state["attempt"] == 1
    completed = stack.contexts_dir / "completed" / uuid
    validate_context_dir(completed)
    assert not (completed / ".lock").exists()
    branch = f"tasuki/1-{uuid[:8]}"
    assert git(repo, "show", f"{branch}:calc.py") == FIXED_CALC
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"  # the operator's checkout untouched
    stack.wait_until(lambda: not (tmp_path / "workspaces" / uuid).exists(), what="workspace removal")
    # The worker's own write to the context index, read as it left it (opening a ContextIndex would reconcile).
    stack.wait_until(lambda: indexed(stack.contexts_dir, uuid) == ("completed", "completed", 5), what="index row")


def indexed(contexts_dir: Path, uuid: str) -> tuple[str, str, int] | None:
    with closing(sqlite3.connect(contexts_dir / "index.sqlite3")) as db:
        row = db.execute("SELECT location, status, steps FROM contexts WHERE uuid = ?", (uuid,)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


LEAKY_SUMMARY = "Fixed it with ghp_0123456789abcdefABCDEF0123456789abcd; ask alice@example.com."


def test_the_finish_summary_is_masked_in_the_commit_message_and_the_celery_result(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    turns = [*fix_calc_trajectory()[:-1], finish_turn(LEAKY_SUMMARY)]
    with model_server(turns) as server:
        stack = Stack(tmp_path, redis_url, server.url)
        try:
            repo = make_buggy_repo(tmp_path / "repo")
            stack.start_worker("w1")
            uuid = stack.send(local_request(repo))
            assert stack.wait_finished(uuid)["status"] == "completed"
            state, result = stack.celery_state(uuid)
            assert state == "SUCCESS"
        finally:
            stack.stop()

    message = git(repo, "log", "-1", "--format=%B", f"tasuki/1-{uuid[:8]}")
    for text in (message, str(result)):
        assert "ghp_" not in text
        assert "alice@example.com" not in text
        assert "[GITHUB_TOKEN]" in text
