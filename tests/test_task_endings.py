"""How a task ends and what it leaves (docs/endings.md): a task stopped by a limit — its steps, its time, its budget, a
model that stays down — delivers what it changed as a draft pull/merge request that says why, and tells its issue;
a task that ends with nothing to deliver leaves no branch behind.

Real celery worker processes, the replay model over HTTP, bare git remotes (local tasks) and the fake forge over
real HTTP and git (GitHub, GitLab, Gitea)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis

from tests.helpers.stack import git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import bash_turn, running_stack

pytestmark = pytest.mark.integration


def bare_repo(tmp_path: Path) -> Path:
    """A bare repository holding the buggy calc project: the remote a local task clones and pushes to."""
    bare = tmp_path / "calc.git"
    source = make_buggy_repo(tmp_path / "calc-source")
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True, capture_output=True)
    return bare


def heads(bare: Path) -> set[str]:
    """Every branch of a bare remote."""
    return set(git(bare, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def test_a_local_task_stopped_at_its_step_limit_without_a_change_leaves_no_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(step) for step in range(3)]
    env = {"TASUKI__AGENT__MAX_STEPS": "2"}
    with running_stack(tmp_path, redis_url, turns, env=env) as (stack, _server):
        bare = bare_repo(tmp_path)
        stack.start_worker("w1")
        uuid = stack.send(local_request(bare, prompt="Print the log."))
        state = stack.wait_finished(uuid)

    assert state["status"] == "failed", state
    assert state["reason"] == "steps"
    assert state["llm_call_count"] == 2
    assert heads(bare) == {"main"}  # no task branch, no checkpoint branch
    assert not (state.get("result") or {}).get("branch")
