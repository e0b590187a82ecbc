"""The eval report's arithmetic (issue 39): Wilson intervals, the exact McNemar test, per-profile figures, pass@1 and
best-of-N, the failure reasons of unresolved tasks, and the terminal table; exact expected numbers throughout."""

from __future__ import annotations

from typing import Any

import pytest

from evals.outcome import task_record, unresolved_reason
from evals.report import build_report, compare, mcnemar_exact, report_lines, wilson_interval


def test_wilson_interval_matches_published_values() -> None:
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775328, abs=1e-7))
    assert wilson_interval(10, 10) == (pytest.approx(0.7224672, abs=1e-7), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(("wins", "losses", "p"), [
    (1, 6, 0.125),  # 2 * (C(7,0) + C(7,1)) / 2^7
    (0, 5, 0.0625),  # 2 / 2^5
    (2, 10, 158 / 4096),  # 2 * (1 + 12 + 66) / 2^12
    (3, 3, 1.0),  # capped
    (0, 0, 1.0),  # no discordant pair
    (10, 2, 158 / 4096),  # symmetric
])
def test_mcnemar_exact_is_the_two_sided_binomial_of_discordant_pairs(wins: int, losses: int, p: float) -> None:
    assert mcnemar_exact(wins, losses) == pytest.approx(p, rel=1e-12)


def record(row: str, profile: str, attempt: int = 1, *, resolved: bool, reason: str | None = None,
           cost: float | None = 0.5, wall: float | None = 10.0, steps: int = 4, tokens: int = 1000) -> dict[str, Any]:
    return {"instance_id": row, "profile": profile, "attempt": attempt, "uuid": f"u-{row}-{profile}-{attempt}",
            "resolved": resolved, "reason": None if resolved else (reason or "tests fail"), "cost_usd": cost,
            "wall_s": wall, "steps": steps, "tokens": tokens}


def test_two_profiles_figures_and_comparison() -> None:
    rows = ["r1", "r2", "r3", "r4"]
    plan = {"name": "x", "rows": rows, "profiles": ["a", "b"], "attempts": 1}
    results = [
        record("r1", "a", resolved=True, cost=1.0, wall=20.0, steps=6, tokens=3000),
        record("r2", "a", resolved=True, cost=2.0, wall=40.0, steps=8, tokens=5000),
        record("r3", "a", resolved=False, reason="no change", cost=0.5, wall=5.0, steps=1, tokens=1000),
        record("r4", "a", resolved=False, reason="limit", cost=0.5, wall=15.0, steps=30, tokens=7000),
        record("r1", "b", resolved=False, reason="tests fail"),
        record("r2", "b", resolved=True),
        record("r3", "b", resolved=False, reason="tests fail"),
    ]
    report = build_report(plan, results)
    a = report["profiles"]["a"]
    assert (a["tasks"], a["resolved"], a["rate"]) == (4, 2, 0.5)
    assert a["interval"] == [pytest.approx(0.15003899, abs=1e-7), pytest.approx(0.84996101, abs=1e-7)]
    assert a["cost_usd"] == 4.0
    assert a["cost_per_task"] == 1.0
    assert a["cost_per_resolved"] == 2.0
    assert a["wall_s_per_task"] == 20.0
    assert a["wall_s_per_resolved"] == 30.0
    assert a["steps_per_task"] == 11.25
    assert a["tokens_per_task"] == 4000.0
    assert a["reasons"] == {"no change": 1, "limit": 1}
    b = report["profiles"]["b"]
    assert (b["tasks"], b["resolved"], b["reasons"]) == (3, 1, {"tests fail": 2})
    assert report["pending"] == 1
    comparison = report["comparison"]
    assert (comparison["rows"], comparison["wins"], comparison["losses"], comparison["both"],
            comparison["neither"]) == (3, 1, 0, 1, 1)
    assert comparison["win_rows"] == ["r1"]
    assert comparison["p_value"] == 1.0
    lines = report_lines(report)
    assert lines[0] == "eval x: 4 rows x 1 attempt(s), 1 task(s) not finished"
    assert lines[2].split()[:4] == ["a", "2/4", "50.0%", "15.0%-85.0%"]
    assert "a vs b over 3 rows: wins 1, losses 0, both 1, neither 1; exact McNemar p = 1" in lines
    assert "  r3 a.1: no change (context u-r3-a-1)" in lines


def delivered(row: str, attempt: int, *, resolved: bool, lines: int, checks: str | None = None) -> dict[str, Any]:
    return {**record(row, "a", attempt, resolved=resolved), "status": "completed", "branch": f"b-{row}-{attempt}",
            "changed_lines": lines, "checks": checks}


def test_attempts_pass_at_1_best_of_n_and_the_pick() -> None:
    plan = {"name": "n", "rows": ["r1", "r2", "r3"], "profiles": ["a"], "attempts": 2}
    results = [
        # r1: both change; the smaller (attempt 2) is picked, and it is the one that fails
        delivered("r1", 1, resolved=True, lines=10), delivered("r1", 2, resolved=False, lines=3),
        # r2: attempt 1's checks failed, so attempt 2 (resolved) is picked though larger
        delivered("r2", 1, resolved=False, lines=2, checks="failed"), delivered("r2", 2, resolved=True, lines=8),
        # r3: attempt 1 changed nothing; attempt 2 delivered and fails
        {**record("r3", "a", 1, resolved=False, reason="no change"), "status": "completed", "branch": None},
        delivered("r3", 2, resolved=False, lines=1)]
    report = build_report(plan, results)
    a = report["profiles"]["a"]
    assert a["pass_at_1"] == pytest.approx(2 / 6)
    assert a["best_of_n"] == pytest.approx(2 / 3)
    assert a["best_of_n_resolved"] == 2
    assert a["picked"] == pytest.approx(1 / 3)
    assert "a attempts: pass@1 33.3%, best-of-2 66.7%, picked 33.3%" in report_lines(report)


def test_unpriced_tasks_have_no_cost_figures() -> None:
    plan = {"name": "n", "rows": ["r1"], "profiles": ["a"], "attempts": 1}
    a = build_report(plan, [record("r1", "a", resolved=True, cost=None)])["profiles"]["a"]
    assert a["cost_per_task"] is None
    assert a["cost_per_resolved"] is None


def test_compare_counts_only_rows_both_finished() -> None:
    result = compare({"r1": True, "r2": False, "r3": True}, {"r1": False, "r2": True})
    assert (result["rows"], result["wins"], result["losses"]) == (2, 1, 1)


@pytest.mark.parametrize(("state", "reason"), [
    ({"status": "completed", "result": {"grade": {"resolved": True}, "branch": "b"}}, None),
    ({"status": "completed", "result": {"unchanged": True}}, "no change"),
    ({"status": "completed", "result": {"branch": "b", "grade": {"resolved": False}}}, "tests fail"),
    ({"status": "completed", "result": {"branch": "b", "grade": {"resolved": False, "error": "no pytest"}}},
     "environment error"),
    ({"status": "failed", "reason": "steps", "result": {"branch": "b"}}, "limit"),
    ({"status": "timeout", "reason": "time"}, "limit"),
    ({"status": "failed", "reason": "budget", "result": {"grade": {"resolved": False}}}, "limit"),
    ({"status": "failed", "reason": "model", "error": "model down"}, "model error"),
    ({"status": "failed", "error": "clone failed"}, "environment error"),
    ({"status": "failed", "reason": "steps", "result": {"branch": "b", "grade": {"resolved": True}}}, None),
])
def test_unresolved_reasons(state: dict[str, Any], reason: str | None) -> None:
    assert unresolved_reason(state) == reason


def test_task_record_reads_the_figures_of_a_state() -> None:
    state = {"status": "completed", "started_at": "2026-01-01T10:00:00+00:00",
             "completed_at": "2026-01-01T10:01:30.500000+00:00", "llm_call_count": 5, "tool_call_count": 4,
             "total_tokens_used": 99, "usage": {"tokens": 1234, "cost_usd": 0.25},
             "result": {"branch": "tasuki/x", "grade": {"resolved": True, "fail_to_pass": {}, "pass_to_pass": {}}}}
    entry = task_record({"instance_id": "r1", "profile": "a", "attempt": 1}, "uuid-1", state)
    assert entry["resolved"] is True
    assert entry["reason"] is None
    assert (entry["steps"], entry["tool_calls"], entry["tokens"], entry["cost_usd"], entry["wall_s"]) == (
        5, 4, 1234, 0.25, 90.5)
    assert entry["branch"] == "tasuki/x"
