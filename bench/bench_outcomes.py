"""``tasuki outcomes`` at 10,000 threads against 100 (issue 28: at most 2 times). Each report is timed as the command
makes it: a fresh outcome store (the SQLite file opened, its schema checked), then the report — the total, and the
rows ``--by repo``, ``--by week`` and ``--by model`` with the total beside them — over every request recorded.

Both stores hold pull requests of the same 20 repositories and 2 models, opened over the same 52 weeks; a thread
is a first task and 0-2 follow-ups; 60 % merged, 25 % closed unmerged, the rest still open. They are recorded
through the store's own writers (``opened``, ``add_task``, ``note_review``, ``ended``) as the intake and the
workers record them.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import Result, standalone, timed
from contexts.outcomes import PullOutcome, Selection, report
from contexts.outcomes_sqlite import SQLiteOutcomeStore

SMALL = 100
FULL_BIG = 10_000
QUICK_BIG = 500
TARGET = 2.0
START = datetime(2026, 1, 5, tzinfo=UTC)
REPOSITORIES = [f"github/acme/repo{n}" for n in range(20)]
MODELS = ["gpt-4o", "qwen3:30b"]


def fill(root: Path, threads: int, seed: int = 7) -> None:
    """``threads`` pull requests with their tasks, reviews and endings, through the store's writers."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    store = SQLiteOutcomeStore(root)
    for n in range(threads):
        repo = REPOSITORIES[n % len(REPOSITORIES)]
        opened = START + timedelta(minutes=rng.randrange(52 * 7 * 24 * 60))
        pull = f"{repo}/pull_request/{n}"
        store.opened(PullOutcome(pull, f"{repo}/issue/{n}", repo, n, f"https://github.com/{repo}/pull/{n}",
                                 f"tasuki/{n}", MODELS[n % 2], f"first-{n}", opened - timedelta(minutes=20), opened))
        store.add_task(pull, f"first-{n}", followup=False, tokens=rng.randrange(5_000, 80_000),
                       cost_usd=rng.random() / 10)
        for round_ in range(rng.randrange(3)):
            store.add_task(pull, f"followup-{n}-{round_}", followup=True, tokens=rng.randrange(2_000, 40_000),
                           cost_usd=rng.random() / 20)
            store.note_review(pull, [{"author": "reviewer", "body": "Please add a test.", "path": "a.py", "line": 3}])
        fate = rng.random()
        if fate < 0.85:
            store.ended(pull, merged=fate < 0.6, at=opened + timedelta(hours=rng.randrange(1, 200)))
    store.close()


def outcomes_command(root: Path, by: str | None) -> object:
    """What ``tasuki outcomes [--by BY]`` computes, from a fresh store as each run of the command opens one."""
    store = SQLiteOutcomeStore(root)
    try:
        return report(store, by, Selection())
    finally:
        store.close()


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Each report on both stores, alternately; the ratio of the medians."""
    big = QUICK_BIG if quick else FULL_BIG
    roots = {SMALL: scratch / "small", big: scratch / "big"}
    started = time.perf_counter()
    for count, root in roots.items():
        fill(root, count)
    print(f"outcomes: recorded {SMALL} and {big:,} pull requests in {time.perf_counter() - started:.1f} s",
          flush=True)
    for count, root in roots.items():
        check = SQLiteOutcomeStore(root)
        _, total = report(check, None, Selection())
        check.close()  # no connection is left open: each run opens the store as the only one, as a command does
        assert total.opened == count
    results = []
    for by in (None, "repo", "week", "model"):
        times: dict[int, list[float]] = {SMALL: [], big: []}
        for round_ in range(6 if quick else 32):
            order = list(roots.items()) if round_ % 2 else list(reversed(roots.items()))  # the sides take turns first
            for count, root in order:
                took = timed(lambda root=root, by=by: outcomes_command(root, by))  # type: ignore[misc]
                if round_:  # the first round warms both up
                    times[count].append(took)
        small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
        ratio = big_s / small_s
        name = f"--by {by}" if by else "total"
        print(f"outcomes: {name} at {big:,} threads {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms at {SMALL}: "
              f"{ratio:.2f}", flush=True)
        results.append(Result(f"outcomes {name}, {big:,} vs {SMALL} threads", f"{ratio:.2f}", f"<= {TARGET:g}",
                              ratio <= TARGET))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
