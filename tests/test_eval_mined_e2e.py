"""``tasuki eval run`` over the set ``tasuki eval mine`` made of a real public project (issue 39): the four
pallets/itsdangerous rows of tests/fixtures/evals, each row's environment built by its own setup (pip installing the
real pytest and freezegun from a local index), the agent's work graded by the held-back tests in the sandbox, offline.

The oracle profile (the replay model applying each row's gold patch through the agent's bash) resolves every row;
the empty profile (finishing at once) resolves none, for "no change"; the comparison counts four wins. A real
repository's history makes the honest case of the bare remotes too: the tasks' remotes hold none of the commits that
came after a row's base, so the gold patch is not in the history the agent can read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evals.tasksets import load_set
from tests.helpers.celery_worker import REPO_ROOT
from tests.helpers.eval_sets import profiles_env, scripted
from tests.helpers.mined_fixture import SET, clone_bundle, mining_environment
from tests.helpers.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[tuple[dict[str, object], Path]]:
    root = tmp_path_factory.mktemp("eval-mined")
    rows = load_set(SET).rows
    assert len(rows) == 4
    assert all(row.patch for row in rows)
    clone_bundle(root / "repos" / "pallets" / "itsdangerous")
    models = {"oracle": scripted(rows, "oracle"), "empty": scripted(rows, "empty")}
    with mining_environment(root / "wheels") as served:
        stack = Stack(root, redis_url, models["empty"].url, env_overrides={**served, **profiles_env(models)})
        try:
            stack.start_worker("w1")
            stack.start_worker("w2")
            env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
            env.update({**stack.env(), "TASUKI__LOCAL__VAR_DIR": str(root / "var")})
            done = subprocess.run(
                [sys.executable, "-m", "cli.main", "eval", "run", str(SET), "--repos", str(root / "repos"),
                 "--name", "mined", "--profile", "oracle", "--profile", "empty", "--timeout", "500", "--json"],
                capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600, check=False)
            assert done.returncode == 0, done.stderr
            yield json.loads(done.stdout), root / "var" / "evals" / "mined"
        finally:
            stack.stop()
            for server in models.values():
                server.stop()


def test_the_oracle_resolves_every_mined_row_and_the_empty_agent_none(run: tuple[dict[str, object], Path]) -> None:
    report, _ = run
    profiles = report["profiles"]
    assert isinstance(profiles, dict)
    oracle, empty = profiles["oracle"], profiles["empty"]
    assert (oracle["tasks"], oracle["resolved"], oracle["rate"]) == (4, 4, 1.0)
    assert (empty["tasks"], empty["resolved"], empty["reasons"]) == (4, 0, {"no change": 4})
    comparison = report["comparison"]
    assert isinstance(comparison, dict)
    assert (comparison["wins"], comparison["losses"]) == (4, 0)
    rows = {row.instance_id: row for row in load_set(SET).rows}
    tasks = report["tasks"]
    assert isinstance(tasks, list)
    for task in tasks:
        if task["profile"] != "oracle":
            continue
        row = rows[task["instance_id"]]
        grade = task["grade"]
        # every held-back test the miner found failing-then-passing ran in the sandbox and passed
        assert set(grade["fail_to_pass"]) == set(row.FAIL_TO_PASS)
        assert set(grade["fail_to_pass"].values()) == {"passed"}
        assert set(grade["pass_to_pass"]) == set(row.PASS_TO_PASS)


def test_the_task_remotes_of_a_real_history_hold_nothing_after_the_base(run: tuple[dict[str, object], Path]) -> None:
    _, run_dir = run
    source = run_dir.parents[2] / "repos" / "pallets" / "itsdangerous"
    newest = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True,
                            check=True).stdout.strip()
    remotes = sorted((run_dir / "remotes").glob("*/*.git"))
    assert len(remotes) == 8  # four rows, two profiles
    for remote in remotes:
        found = subprocess.run(["git", "cat-file", "-e", newest], cwd=remote, capture_output=True, check=False)
        assert found.returncode != 0, remote  # the source's newest commit (after every row's base) is not there
