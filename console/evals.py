"""The console's eval pages (issue 39): ``/evals`` lists the runs under ``local.var_dir``/evals, ``/evals/<run>``
shows one run's report (:mod:`evals.report`) with a line per task that links to its context's page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.report import build_report
from evals.rundir import EvalError, RunDir, list_runs
from evals.runs import open_run


@dataclass(frozen=True)
class RunSummary:
    """One line of the runs page."""

    name: str
    created_at: str
    rows: int
    profiles: dict[str, dict[str, Any]]
    finished: int
    total: int


def read_runs(var_dir: Path) -> list[RunSummary]:
    """Every run, newest first (a run whose files cannot be read is left out)."""
    summaries = []
    for run in list_runs(var_dir):
        try:
            plan, report = _report(run)
        except (EvalError, OSError, KeyError, ValueError, TypeError):
            continue
        total = report["rows"] * len(report["profiles"]) * report["attempts"]
        summaries.append(RunSummary(run.name, str(plan.get("created_at") or ""), report["rows"], report["profiles"],
                                    total - report["pending"], total))
    return summaries


def read_run(var_dir: Path, name: str) -> dict[str, Any]:
    """One run's report; :class:`EvalError` (a 409 page) for a bad or unknown name."""
    _, report = _report(open_run(var_dir, name))
    return report


def _report(run: RunDir) -> tuple[dict[str, Any], dict[str, Any]]:
    plan = run.plan()
    return plan, build_report(plan, run.results())
