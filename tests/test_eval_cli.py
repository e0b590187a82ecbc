"""`tasuki eval report` and `tasuki eval list` as an operator runs them on a run directory, and their one-line
errors: an unknown run, a name that is a path, an unknown profile, a set file that is not there."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.evals import _progress_printer
from evals.rundir import RunDir, TaskKey
from evals.runs import Progress
from tests.helpers.cli_process import ok, one_line_error

ROOT = Path(__file__).resolve().parents[1]


def tasuki(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "config.yaml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(tmp_path / "config.yaml"), "TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var"),
                "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts")})
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "var" / "evals" / "weekly")
    run.start({"name": "weekly", "set_hash": "h", "rows": ["r1", "r2"], "profiles": ["p"], "attempts": 1,
               "created_at": "2026-12-06T10:00:00+00:00"})
    for row, resolved in (("r1", True), ("r2", False)):
        run.record({**TaskKey(row, "p", 1).to_json(), "uuid": f"uuid-{row}", "status": "completed",
                    "resolved": resolved, "reason": None if resolved else "tests fail", "branch": None,
                    "steps": 2, "tokens": 100, "cost_usd": None, "wall_s": 4.0})
    return run


def test_report_prints_the_table_json_and_predictions(tmp_path: Path, run_dir: RunDir) -> None:
    table = ok(tasuki(tmp_path, "eval", "report", "weekly"))
    assert table.splitlines()[0] == "eval weekly: 2 rows x 1 attempt(s)"
    assert "  r2 p.1: tests fail (context uuid-r2)" in table.splitlines()
    report = json.loads(ok(tasuki(tmp_path, "eval", "report", "weekly", "--json")))
    assert (report["profiles"]["p"]["resolved"], report["profiles"]["p"]["rate"]) == (1, 0.5)
    done = tasuki(tmp_path, "eval", "report", "weekly", "--predictions", str(tmp_path / "p.jsonl"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"2 prediction(s) written to {tmp_path / 'p.jsonl'}\n"
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert lines == [{"instance_id": "r1", "model_name_or_path": "p", "model_patch": ""},
                     {"instance_id": "r2", "model_name_or_path": "p", "model_patch": ""}]
    listed = ok(tasuki(tmp_path, "eval", "list"))
    assert listed.split() == ["weekly", "2", "rows", "2/2", "finished", "p", "1/2"]


def test_errors_are_one_line(tmp_path: Path, run_dir: RunDir) -> None:
    assert "no eval run 'nope'" in one_line_error(tasuki(tmp_path, "eval", "report", "nope"), 2)
    assert "letters, digits" in one_line_error(tasuki(tmp_path, "eval", "report", "../weekly"), 2)
    set_path = tmp_path / "set.jsonl"
    set_path.write_text("")
    unknown = one_line_error(tasuki(tmp_path, "eval", "run", str(set_path), "--profile", "nope"), 2)
    assert "no model profile 'nope'" in unknown


def test_list_without_runs(tmp_path: Path) -> None:
    assert ok(tasuki(tmp_path, "eval", "list")) == "no eval runs\n"


def test_without_a_terminal_the_progress_is_a_line_per_change_never_the_same_line_twice() -> None:
    out = io.StringIO()
    show = _progress_printer(out)
    for progress in (Progress(2, queued=2), Progress(2, queued=2), Progress(2, running=1, queued=1),
                     Progress(2, running=1, queued=1), Progress(2, finished=2, resolved=1)):
        show(progress)
    assert [line.split("] ", 1)[1] for line in out.getvalue().splitlines()] == [
        "0/2 finished · 0 resolved · 0 running · 2 queued",
        "0/2 finished · 0 resolved · 1 running · 1 queued",
        "2/2 finished · 1 resolved · 0 running · 0 queued",
    ]
