"""An eval run's report from its results (pure; issue 39): resolve rate with a Wilson 95 % interval, cost and wall
time per task and per resolved task, steps, tokens, why unresolved tasks failed; with several attempts pass@1 and
best-of-N; with two profiles, per-row wins and losses and an exact McNemar test.

``results`` are ``results.jsonl``'s lines (:func:`evals.outcome.task_record`). pass@1 is the share of all
tasks (rows x attempts) resolved, the expected rate of one attempt; best-of-N counts a row resolved when any of its
attempts is (the oracle pick: an upper bound on what a picker that sees only the candidates can reach); "picked" is
the rate production's pick would reach (``worker.attempts.pick`` without a reviewer: an attempt that delivered a
change, whose checks did not fail, the smallest). The comparison of two profiles is on best-of-N per row (with one
attempt, simply each row's task).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from evals.outcome import REASONS
from worker.attempts import Candidate, pick

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ((0, 1) with no trials): unlike the normal
    approximation it stays inside [0, 1] and is honest at 0 % and 100 %, which small eval sets hit."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - spread)  # exact at the ends, not 1 - 1e-16
    return low, 1.0 if successes == trials else min(1.0, centre + spread)


def mcnemar_exact(wins: int, losses: int) -> float:
    """The exact two-sided McNemar p-value: a binomial test (p = 1/2) of the discordant pairs, ``wins`` rows only
    the first profile resolved against ``losses`` only the second did. 1.0 with no discordant pair."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / (1 << n))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per(total: float | None, count: int) -> float | None:
    return total / count if total is not None and count else None


def picked_resolved(attempts: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the attempt production's pick would deliver (no reviewer in an eval) resolved the row."""
    candidates = [Candidate(attempt=int(r["attempt"]), uuid=str(r.get("uuid") or ""), branch=r.get("branch"),
                            checks_passed=False if r.get("checks") == "failed" else None,
                            changed_lines=int(r.get("changed_lines") or (1 if r.get("branch") else 0)), diff="",
                            delivered=r.get("status") == "completed" and bool(r.get("branch")))
                  for r in attempts]
    winner = pick(candidates).winner
    return winner is not None and any(r.get("resolved") for r in attempts if int(r["attempt"]) == winner.attempt)


def profile_summary(records: Sequence[Mapping[str, Any]], rows: Sequence[str], attempts: int) -> dict[str, Any]:
    """One profile's figures over its finished tasks."""
    tasks = len(records)
    resolved = [r for r in records if r.get("resolved")]
    low, high = wilson_interval(len(resolved), tasks)
    costs = [float(r["cost_usd"]) for r in records if r.get("cost_usd") is not None]
    total_cost = sum(costs) if costs else None
    walls = [float(r["wall_s"]) for r in records if r.get("wall_s") is not None]
    by_row: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_row.setdefault(str(record["instance_id"]), []).append(record)
    best = sum(1 for outcomes in by_row.values() if any(r.get("resolved") for r in outcomes))
    picked = sum(1 for outcomes in by_row.values() if picked_resolved(outcomes))
    reasons = Counter(str(r.get("reason")) for r in records if not r.get("resolved"))
    return {
        "tasks": tasks,
        "expected": len(rows) * attempts,
        "resolved": len(resolved),
        "rate": len(resolved) / tasks if tasks else None,
        "interval": [low, high],
        "pass_at_1": len(resolved) / tasks if tasks else None,
        "best_of_n": best / len(by_row) if by_row else None,
        "best_of_n_resolved": best,
        "picked": picked / len(by_row) if by_row else None,
        "rows_finished": len(by_row),
        "cost_usd": total_cost,
        "cost_per_task": _per(total_cost, tasks) if costs else None,
        "cost_per_resolved": _per(total_cost, len(resolved)) if costs else None,
        "wall_s_per_task": _mean(walls),
        "wall_s_per_resolved": _per(sum(float(r["wall_s"]) for r in resolved if r.get("wall_s") is not None),
                                    len(resolved)),
        "steps_per_task": _mean([float(r.get("steps") or 0) for r in records]),
        "tokens_per_task": _mean([float(r.get("tokens") or 0) for r in records]),
        "reasons": {reason: reasons[reason] for reason in (*REASONS, *sorted(set(reasons) - set(REASONS)))
                    if reasons[reason]},
    }


def compare(first: Mapping[str, bool], second: Mapping[str, bool]) -> dict[str, Any]:
    """Two profiles row by row (``instance_id -> resolved``, rows both finished): wins (only the first resolved),
    losses (only the second), ties, and the exact McNemar p-value of the difference."""
    common = sorted(set(first) & set(second))
    wins = [row for row in common if first[row] and not second[row]]
    losses = [row for row in common if second[row] and not first[row]]
    return {
        "rows": len(common),
        "wins": len(wins),
        "losses": len(losses),
        "both": sum(1 for row in common if first[row] and second[row]),
        "neither": sum(1 for row in common if not first[row] and not second[row]),
        "p_value": mcnemar_exact(len(wins), len(losses)),
        "win_rows": wins,
        "loss_rows": losses,
    }


def _best_by_row(records: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    rows: dict[str, bool] = {}
    for record in records:
        row = str(record["instance_id"])
        rows[row] = rows.get(row, False) or bool(record.get("resolved"))
    return rows


def build_report(plan: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The whole report: ``plan`` is ``set.json`` (``rows``, ``profiles``, ``attempts``, ``name``), ``results``
    the finished tasks; a task finished twice (never, but a hand-edited file) counts once, the last line."""
    rows = [str(row) for row in plan.get("rows", [])]
    profiles = [str(profile) for profile in plan.get("profiles", [])]
    attempts = int(plan.get("attempts") or 1)
    latest: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    for record in results:
        latest[(str(record["instance_id"]), str(record["profile"]), int(record["attempt"]))] = record
    by_profile = {profile: [r for key, r in latest.items() if key[1] == profile] for profile in profiles}
    report: dict[str, Any] = {
        "name": plan.get("name"),
        "rows": len(rows),
        "attempts": attempts,
        "profiles": {profile: profile_summary(by_profile[profile], rows, attempts) for profile in profiles},
        "tasks": [dict(latest[key]) for key in sorted(latest, key=lambda k: (rows.index(k[0]) if k[0] in rows
                                                                                  else len(rows), k[1], k[2]))],
    }
    report["pending"] = len(rows) * len(profiles) * attempts - len(latest)
    if len(profiles) == 2:
        first, second = (_best_by_row(by_profile[p]) for p in profiles)
        report["comparison"] = {"first": profiles[0], "second": profiles[1], **compare(first, second)}
    return report


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as a terminal table: a line per profile, the failure reasons, the comparison."""
    lines = [f"eval {report.get('name')}: {report['rows']} rows x {report['attempts']} attempt(s)"
             + (f", {report['pending']} task(s) not finished" if report.get("pending") else "")]
    header = (f"{'profile':<16} {'resolved':>9} {'rate':>7} {'95% CI':>15} {'best-of-N':>9} {'$/task':>9} "
              f"{'$/resolved':>10} {'s/task':>8} {'s/resolved':>10} {'steps':>6} {'tokens':>9}")
    lines.append(header)
    for profile, s in report["profiles"].items():
        low, high = s["interval"]
        lines.append(
            f"{profile:<16} {s['resolved']:>4}/{s['tasks']:<4} {_percent(s['rate']):>7} "
            f"{_percent(low) + '-' + _percent(high):>15} {_percent(s['best_of_n']):>9} {_money(s['cost_per_task']):>9} "
            f"{_money(s['cost_per_resolved']):>10} {_secs(s['wall_s_per_task']):>8} "
            f"{_secs(s['wall_s_per_resolved']):>10} {_number(s['steps_per_task']):>6} "
            f"{_number(s['tokens_per_task']):>9}")
    if report["attempts"] > 1:
        for profile, s in report["profiles"].items():
            lines.append(f"{profile} attempts: pass@1 {_percent(s['pass_at_1'])}, best-of-{report['attempts']} "
                         f"{_percent(s['best_of_n'])}, picked {_percent(s['picked'])}")
    for profile, s in report["profiles"].items():
        if s["reasons"]:
            lines.append(f"{profile} unresolved: " + ", ".join(f"{why} {n}" for why, n in s["reasons"].items()))
    for task in report.get("tasks", []):
        if not task.get("resolved"):
            lines.append(f"  {task['instance_id']} {task['profile']}.{task['attempt']}: {task.get('reason')}"
                         f" (context {task.get('uuid')})")
    comparison = report.get("comparison")
    if comparison:
        lines.append(
            f"{comparison['first']} vs {comparison['second']} over {comparison['rows']} rows: "
            f"wins {comparison['wins']}, losses {comparison['losses']}, both {comparison['both']}, "
            f"neither {comparison['neither']}; exact McNemar p = {comparison['p_value']:.4g}")
    return lines
