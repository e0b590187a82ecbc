"""Metering and budgets cost a step nothing measurable (issue 17): the same 40-step task on ``tasuki worker``
with a price table and every limit set (each model call priced, the task's cap checked before every call,
the repository's day counted in Redis) against the same task with neither. Both meter their calls: usage
is always recorded; what limits add is the check and the pricing. The target is a ratio of at most 1.05.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.bench_compression import LARGE_WINDOW, STEPS, one_task
from bench.common import Result, standalone

PRICING = json.dumps({"scripted": {"input": 2.5, "cached_input": 1.25, "output": 10.0}})
LIMITS = {
    "TASUKI__PRICING": PRICING,
    "TASUKI__LIMITS__TASK_TOKENS": "1000000000",  # high: the task must finish, every check still runs
    "TASUKI__LIMITS__TASK_COST": "1000000",
    "TASUKI__LIMITS__REPO_TOKENS": "1000000000",
    "TASUKI__LIMITS__REPO_COST": "1000000",
    "TASUKI__LIMITS__USER_TASKS": "1000000",
}


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """With limits vs without, alternately, median of the rounds."""
    rounds = 1 if quick else 5
    limited, plain = [], []
    for n in range(rounds):
        seconds, state = one_task(scratch / f"plain-{n}", LARGE_WINDOW)
        plain.append(seconds)
        seconds, state = one_task(scratch / f"limited-{n}", LARGE_WINDOW, **LIMITS)
        if state.get("usage", {}).get("cost_usd") is None:
            raise RuntimeError("the limited task was not priced: the benchmark would measure nothing")
        limited.append(seconds)
    ratio = statistics.median(limited) / statistics.median(plain)
    print(f"{STEPS}-step task with pricing and limits: {statistics.median(limited):.2f} s vs "
          f"{statistics.median(plain):.2f} s without: {ratio:.3f}×", flush=True)
    return [Result(f"{STEPS}-step task with limits and pricing vs without", f"{ratio:.3f}", "<= 1.05",
                   ratio <= 1.05)]


if __name__ == "__main__":
    standalone(run, __doc__)
