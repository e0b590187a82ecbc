"""Issue 39: an eval of 20 rows with the replay model on 1, 2 and 4 workers.

A synthetic set (tests/helpers/eval_sets.py: 20 rows over one local repository, each graded by its own held-back
test) runs through the real fleet — a private Redis, ``celery -A worker`` processes grading in their sandbox — with
the oracle agent of replay/oracle.py (each of its model turns takes ``MODEL_S``), as ``tasuki eval run`` runs it
(:class:`evals.runs.EvalRun` over :func:`evals.fleet.local_fleet`). Printed: the wall time on 2 and 4 workers against
the serial (1-worker) run measured in the same run, and the harness's own time per row (making the row's bare remote,
journaling and enqueueing it, recording its result) against the agent's work per row (its task's start to its
completion, grading included).

``python -m bench.bench_eval [--quick]``
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench.common import Result, standalone
from bench.worker_stack import CeleryWorker, private_redis, tasuki_env
from evals.fleet import local_fleet
from evals.rundir import RunDir
from evals.runs import EvalRun
from replay import ReplayModel, ReplayServer, serve, turns_from_entries
from replay.oracle import route_entries
from tests.helpers.eval_sets import SetRow, make_set
from worker.settings import load_settings

MODEL_S = 0.25  # each model turn's time (a real model's is seconds: this keeps the agent's work the larger part)
TIMEOUT_S = 900.0


def with_delays(entries: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """Each turn of ``entries`` answered after ``seconds``."""
    return [{**entry, "delay_s": seconds} if "tool_calls" in entry and seconds else entry for entry in entries]


def oracle_model(rows: list[SetRow], seconds: float) -> ReplayServer:
    routes = {needle: turns_from_entries(with_delays(entries, seconds))
              for needle, entries in route_entries(rows, "oracle").items()}
    return serve(ReplayModel([], routes=routes))


def one_eval(root: Path, redis_url: str, model: ReplayServer, rows: list[SetRow], repos: Path,
             workers: int) -> dict[str, float]:
    """The eval on ``workers`` single-process workers: its wall time, the harness's and the agents' per row."""
    profiles = {"oracle": {"provider": "openai", "model": "oracle", "base_url": model.openai_base_url,
                           "context_length": 32768}}
    root.mkdir(parents=True)
    env = tasuki_env(root, redis_url, model.url, TASUKI__LLM__MODELS=json.dumps(profiles),
                     TASUKI__AGENT__FINISH_GATE="false")
    started = [CeleryWorker("worker", f"eval{workers}-{n}", redis_url, root / f"w{n}.log", env=env).start()
               for n in range(workers)]
    app = Celery(broker=redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        settings = load_settings(env=env)
        runner = EvalRun(RunDir(root / "evals" / f"bench-{workers}"), rows, ["oracle"], 1,
                         local_fleet(settings, app=app, client=client), repos_dir=repos)
        runner.run.start({"name": runner.run.name, "set_hash": "bench", "rows": [r.instance_id for r in rows],
                          "profiles": ["oracle"], "attempts": 1})
        began = time.perf_counter()
        pending = runner.execute(TIMEOUT_S)
        wall = time.perf_counter() - began
    finally:
        client.close()
        app.close()
        for worker in started:
            worker.stop()
    results = runner.run.results()
    if pending or not all(r["resolved"] for r in results):
        raise RuntimeError(f"eval on {workers} worker(s): {len(pending)} unfinished, "
                           f"{sum(1 for r in results if not r['resolved'])} unresolved")
    timings = runner.timings
    return {"wall": wall, "harness": (timings.prepare_s + timings.submit_s + timings.collect_s) / len(rows),
            "agent": statistics.mean(float(r["wall_s"]) for r in results)}


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """The same eval on 1, 2 and 4 workers (quick: 4 rows on 1 and 2 workers, no model time)."""
    count, seconds, fleets = (4, 0.0, (1, 2)) if quick else (20, MODEL_S, (1, 2, 4))
    synthetic = make_set(scratch / "set", count)
    measured: dict[int, dict[str, float]] = {}
    with private_redis(scratch / "redis") as redis_url:
        for workers in fleets:
            model = oracle_model(synthetic.rows, seconds)  # a fresh model: its delays are served once per turn
            try:
                measured[workers] = one_eval(scratch / f"fleet-{workers}", redis_url, model, synthetic.rows,
                                             synthetic.repos_dir, workers)
            finally:
                model.stop()
    results = []
    serial = measured[1]["wall"]
    for workers, figures in measured.items():
        print(f"eval of {count} rows on {workers} worker(s): {figures['wall']:.1f} s "
              f"({serial / figures['wall']:.2f}x the serial run); harness {1000 * figures['harness']:.1f} ms per "
              f"row vs the agent's work {figures['agent']:.2f} s per row", flush=True)
        if workers > 1:
            results.append(Result(f"eval {count} rows: 1 / {workers} workers", f"{serial / figures['wall']:.2f}",
                                  "—", None))
    overhead = measured[1]["harness"] / measured[1]["agent"]
    results.append(Result("eval: harness / agent per row", f"{overhead:.3f}", "<= 0.1", overhead <= 0.1))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
