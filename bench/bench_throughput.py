"""Minimal tasks per second through the whole stack, against a bare Celery no-op task on the same Redis.

A minimal task: the scripted model calls ``finish`` at once, the repository is one small file.  Each one still
creates its context, clones, asks the model over HTTP, pushes its branch and completes.  Both workers are
real ``celery worker`` subprocesses with the same concurrency on one private Redis; rounds of the two
alternate, so a burst of load from elsewhere slows a round of each rather than all rounds of one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid as uuid_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from bench.common import Result
from bench.noop_app import NOOP, NOOP_QUEUE
from bench.worker_stack import (
    CeleryWorker,
    client,
    local_request,
    private_redis,
    replay_model,
    send_run_task,
    tasuki_env,
    tiny_repo,
)

TARGET = 0.3
CONCURRENCY = 2
RESULT_TIMEOUT_S = 300.0
FINISH_AT_ONCE = [{"content": "Nothing to do.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Done."}}]}]


def round_seconds(send: Callable[[], Any], count: int) -> float:
    """Seconds from the first send of ``count`` tasks to the last result."""
    start = time.perf_counter()
    results = [send() for _ in range(count)]
    for result in results:
        outcome = result.get(timeout=RESULT_TIMEOUT_S, interval=0.005)
        if outcome.get("status") != "completed":
            raise RuntimeError(f"a benchmark task ended {outcome.get('status')}: {outcome}")
    return time.perf_counter() - start


def measure(scratch: Path, tasks: int, noops: int, rounds: int) -> tuple[float, float]:
    """Median tasks/s of (Tasuki, no-op) over alternating rounds, after one warm-up round of each."""
    repo = tiny_repo(scratch / "repo")
    with private_redis(scratch / "redis") as redis_url, replay_model(FINISH_AT_ONCE) as model:
        workers = [
            CeleryWorker("worker", "tasuki", redis_url, scratch / "tasuki.log",
                         tasuki_env(scratch, redis_url, model.url), CONCURRENCY),
            CeleryWorker("bench.noop_app", "noop", redis_url, scratch / "noop.log", {}, CONCURRENCY, NOOP_QUEUE),
        ]  # fmt: skip
        try:
            for worker in workers:
                worker.start()
            with client(redis_url) as app:
                tasuki_times, noop_times = [], []
                for _ in range(rounds + 1):
                    tasuki_times.append(round_seconds(lambda: send_task(app, repo), tasks))
                    noop_times.append(round_seconds(lambda: send_noop(app, repo), noops))
        finally:
            for worker in workers:
                worker.stop()
    return tasks / statistics.median(tasuki_times[1:]), noops / statistics.median(noop_times[1:])


def send_task(app: Celery, repo: Path) -> Any:
    uuid = str(uuid_module.uuid4())
    return send_run_task(app, uuid, local_request(repo, uuid[:8]))


def send_noop(app: Celery, repo: Path) -> Any:
    uuid = str(uuid_module.uuid4())
    return app.send_task(NOOP, args=[uuid, local_request(repo, uuid[:8])], task_id=uuid, queue=NOOP_QUEUE)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure, print one line, return the result."""
    tasks, noops, rounds = (6, 30, 1) if quick else (40, 400, 3)
    tasuki_rate, noop_rate = measure(scratch, tasks, noops, rounds)
    ratio = tasuki_rate / noop_rate
    result = Result("task throughput vs celery no-op", f"{ratio:.3f}", f">= {TARGET}", ratio >= TARGET)
    print(
        f"throughput  tasuki {tasuki_rate:,.1f} tasks/s  celery no-op {noop_rate:,.1f} tasks/s  "
        f"ratio {ratio:.3f}  target >= {TARGET}  {result.verdict}  "
        f"(median of {rounds} rounds of {tasks} tasks / {noops} no-ops, concurrency {CONCURRENCY})",
        flush=True,
    )
    return [result]


def main() -> None:
    """``python -m bench.bench_throughput [--quick]``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not a measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tasuki-bench-") as scratch:
        run(Path(scratch), quick=args.quick)


if __name__ == "__main__":
    main()
