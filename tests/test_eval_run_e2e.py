"""``tasuki eval run`` end to end (issue 39): the real CLI, real Redis, real celery workers grading in their sandbox,
replay models scripted per row by replay/oracle.py — one model server per profile, so one fleet runs them all.

The oracle resolves every row and the empty agent none (each for "no change"), compared row by row with the exact
McNemar p; a mixed agent gives its exact rate; the predictions carry each oracle task's patch, read from task remotes
that never held the gold commits; an eval CLI killed while a task is held at a replay gate continues under its name
and runs no row twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from replay import ReplayServer
from tests.helpers.celery_worker import REPO_ROOT
from tests.helpers.eval_sets import SyntheticSet, make_set, profiles_env, scripted
from tests.helpers.stack import Stack

pytestmark = pytest.mark.integration

MIXED_CHOSEN = {"acme__calc-1", "acme__calc-3"}
HELD_ROW = "acme__calc-2"


@dataclass
class EvalFleet:
    root: Path
    stack: Stack
    models: dict[str, ReplayServer]
    synthetic: SyntheticSet
    set_path: Path

    @property
    def var_dir(self) -> Path:
        return self.root / "var"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
        return {**env, **self.stack.env(), "TASUKI__LOCAL__VAR_DIR": str(self.var_dir)}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli.main", *args]

    def tasuki(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), capture_output=True, text=True, env=self.env(), cwd=REPO_ROOT,
                              timeout=timeout_s, check=False)

    def eval_run(self, name: str, *options: str) -> subprocess.CompletedProcess[str]:
        return self.tasuki("eval", "run", str(self.set_path), "--repos", str(self.synthetic.repos_dir),
                           "--name", name, "--timeout", "240", *options)

    def run_dir(self, name: str) -> Path:
        return self.var_dir / "evals" / name

    def results(self, name: str) -> list[dict[str, Any]]:
        path = self.run_dir(name) / "results.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def contexts_of(self, name: str) -> Counter[tuple[str, str]]:
        """How many tasks ran per (row, profile.attempt) of run ``name``, from the contexts' metadata."""
        found: Counter[tuple[str, str]] = Counter()
        for where in ("running", "completed"):
            for meta in (self.stack.contexts_dir / where).glob("*/metadata.json"):
                key = json.loads(meta.read_text())["task_key"]
                if key["owner"] == f"eval-{name}":
                    found[(key["repo"], key["task_id"])] += 1
        return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[EvalFleet]:
    root = tmp_path_factory.mktemp("eval-run")
    synthetic = make_set(root)
    models = {
        "oracle": scripted(synthetic.rows, "oracle"),
        "empty": scripted(synthetic.rows, "empty"),
        "mixed": scripted(synthetic.rows, "mixed", chosen=MIXED_CHOSEN),
        "gated": scripted(synthetic.rows, "oracle", gates={HELD_ROW: "hold"}),
    }
    stack = Stack(root, redis_url, models["empty"].url, env_overrides=profiles_env(models))
    try:
        stack.start_worker("w1")
        stack.start_worker("w2")
        yield EvalFleet(root, stack, models, synthetic, synthetic.write(root / "calc-set.jsonl"))
    finally:
        stack.stop()
        for server in models.values():
            server.stop()


def test_oracle_resolves_every_row_and_empty_none_compared_row_by_row(fleet: EvalFleet, tmp_path: Path) -> None:
    done = fleet.eval_run("versus", "--profile", "oracle", "--profile", "empty", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    oracle, empty = report["profiles"]["oracle"], report["profiles"]["empty"]
    assert (oracle["tasks"], oracle["resolved"], oracle["rate"]) == (4, 4, 1.0)
    assert (empty["tasks"], empty["resolved"], empty["reasons"]) == (4, 0, {"no change": 4})
    assert oracle["steps_per_task"] == 3.0  # apply, status, finish (the gate is off: one finish)
    assert empty["steps_per_task"] == 1.0
    assert oracle["tokens_per_task"] > 0
    comparison = report["comparison"]
    assert (comparison["wins"], comparison["losses"], comparison["both"], comparison["neither"]) == (4, 0, 0, 0)
    assert comparison["p_value"] == 0.125  # 2 / 2^4
    assert report["pending"] == 0
    for task in report["tasks"]:
        if task["profile"] == "oracle":
            grade = task["grade"]
            row = task["instance_id"].rsplit("-", 1)[1]
            assert grade["fail_to_pass"] == {f"test_mod{row}.ModTest.test_fix": "passed"}
            assert grade["pass_to_pass"] == {f"test_mod{row}.ModTest.test_callable": "passed"}
            assert task["changed_lines"] == 2  # one line out, one in
        else:
            assert (task["changed_lines"], task["branch"]) == (0, None)
    assert fleet.contexts_of("versus") == {(row.instance_id, f"{p}.1"): 1 for row in fleet.synthetic.rows
                                           for p in ("oracle", "empty")}
    # The remotes never held the gold commits; each holds main at the base and the task's branch
    for remote in (fleet.run_dir("versus") / "remotes").glob("*/*.git"):
        for gold in fleet.synthetic.gold_commits:
            found = subprocess.run(["git", "cat-file", "-e", gold], cwd=remote, capture_output=True, check=False)
            assert found.returncode != 0, (remote, gold)
    table = fleet.tasuki("eval", "report", "versus", "--predictions", str(tmp_path / "preds.jsonl"))
    assert table.returncode == 0, table.stderr
    assert "oracle vs empty over 4 rows: wins 4, losses 0, both 0, neither 0; exact McNemar p = 0.125" in table.stdout
    predictions = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    by_key = {(p["instance_id"], p["model_name_or_path"]): p["model_patch"] for p in predictions}
    assert len(by_key) == 8
    for row in fleet.synthetic.rows:
        n = row.instance_id.rsplit("-", 1)[1]
        assert f"+    return x + {n}" in by_key[(row.instance_id, "oracle")]
        assert "test_mod" not in by_key[(row.instance_id, "oracle")]  # nothing of the test patch was pushed
        assert by_key[(row.instance_id, "empty")] == ""
    listed = fleet.tasuki("eval", "list")
    assert "versus" in listed.stdout
    assert "8/8 finished" in listed.stdout


def test_mixed_agent_gives_its_exact_rate(fleet: EvalFleet) -> None:
    done = fleet.eval_run("mixed", "--profile", "mixed", "--json")
    assert done.returncode == 0, done.stderr
    mixed = json.loads(done.stdout)["profiles"]["mixed"]
    assert (mixed["tasks"], mixed["resolved"], mixed["rate"]) == (4, 2, 0.5)
    assert mixed["reasons"] == {"no change": 2}
    resolved = {r["instance_id"] for r in fleet.results("mixed") if r["resolved"]}
    assert resolved == MIXED_CHOSEN


def test_a_killed_eval_run_continues_and_repeats_no_row(fleet: EvalFleet) -> None:
    gated = fleet.models["gated"]
    cli = subprocess.Popen(
        fleet.command("eval", "run", str(fleet.set_path), "--repos", str(fleet.synthetic.repos_dir), "--name",
                      "killed", "--profile", "gated", "--limit", "3"),
        env=fleet.env(), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        fleet.stack.wait_until(lambda: gated.model.gate_reached("hold") and fleet.results("killed"), 180,
                               "a finished row and the held row at its gate")
    finally:
        os.killpg(cli.pid, signal.SIGKILL)
        cli.wait(timeout=30)
    before = fleet.results("killed")
    assert HELD_ROW not in {r["instance_id"] for r in before}
    gated.model.open_gate("hold")
    done = fleet.eval_run("killed", "--profile", "gated", "--limit", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert "continued" in done.stderr
    report = json.loads(done.stdout)
    assert report["profiles"]["gated"]["resolved"] == 3
    results = fleet.results("killed")
    assert Counter(r["instance_id"] for r in results) == {f"acme__calc-{n}": 1 for n in (1, 2, 3)}
    assert results[: len(before)] == before  # what was recorded before the kill stays as it was
    journal = [json.loads(line) for line in (fleet.run_dir("killed") / "journal.jsonl").read_text().splitlines()]
    assert Counter(entry["instance_id"] for entry in journal) == {f"acme__calc-{n}": 1 for n in (1, 2, 3)}
    assert fleet.contexts_of("killed") == {(f"acme__calc-{n}", "gated.1"): 1 for n in (1, 2, 3)}
    # a third run has nothing left to do and sends nothing
    again = fleet.eval_run("killed", "--profile", "gated", "--limit", "3", "--json")
    assert again.returncode == 0, again.stderr
    assert fleet.contexts_of("killed") == {(f"acme__calc-{n}", "gated.1"): 1 for n in (1, 2, 3)}



def test_a_row_whose_environment_cannot_be_set_up_ends_before_any_model_call(fleet: EvalFleet, tmp_path: Path) -> None:
    # A run on a machine where the row's `pip install` cannot reach its index spent a small model's whole budget on
    # a task whose tests could never run: now such a row ends at once, an environment error.
    row = json.loads(fleet.set_path.read_text().splitlines()[0])
    broken = tmp_path / "broken-setup.jsonl"
    broken.write_text(json.dumps({**row, "setup": "echo 'no index answers' >&2; exit 3"}) + "\n")
    asked = len(fleet.models["oracle"].requests)

    done = fleet.tasuki("eval", "run", str(broken), "--repos", str(fleet.synthetic.repos_dir), "--name", "broken",
                        "--timeout", "240", "--profile", "oracle", "--json")

    assert done.returncode == 0, done.stderr
    oracle = json.loads(done.stdout)["profiles"]["oracle"]
    assert (oracle["tasks"], oracle["resolved"], oracle["reasons"]) == (1, 0, {"environment error": 1})
    [result] = fleet.results("broken")
    assert result["error"].startswith("the eval row's environment setup failed (exit code 3 after "), result
    assert len(fleet.models["oracle"].requests) == asked  # no model call was made for it
