"""``GET /metrics`` with 10,000 running tasks against 10 (issue 13: every scrape read the state of every running
context). The running contexts are real directories under ``running/`` and real entries of the Redis index
their holders keep; the scrape is ``Metrics.render`` (what the route returns), on a private Redis.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import redis

from bench.common import Result, standalone, timed
from bench.worker_stack import private_redis
from contexts import ContextStore
from webhooks.metrics import Metrics
from worker.runtime import index_heartbeat
from worker.settings import install_settings, load_settings

SMALL = 10
FULL_BIG = 10_000
QUICK_BIG = 500
TARGET = 2.0
KEY = {"task_source": "local", "owner": "bench", "repo": "bench", "task_type": "prompt", "task_id": "1"}


def fleet(root: Path, url: str, count: int) -> Metrics:
    """``count`` running contexts, each in the index as the worker's store puts it; the intake's metrics."""
    settings = load_settings(env={"TASUKI__BROKER__URL": url, "TASUKI__CONTEXTS__BASE_DIR": str(root)})
    install_settings(settings)
    store = ContextStore(root, fsync="never", on_heartbeat=index_heartbeat)
    for _ in range(count):
        ctx = store.create(KEY, {"model": "m", "context_length": 1000}, heartbeat=False)
        ctx.update_state(status="processing")
        ctx.detach()  # its files closed, its lock left as a holder's would be: 10,000 open contexts need no fds
    return Metrics(settings, redis.Redis.from_url(url))


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Scrapes of both fleets, alternately; the ratio of the medians."""
    big = QUICK_BIG if quick else FULL_BIG
    times: dict[int, list[float]] = {SMALL: [], big: []}
    with private_redis(scratch / "redis-small") as small_url, private_redis(scratch / "redis-big") as big_url:
        started = time.perf_counter()
        metrics = {SMALL: fleet(scratch / "small", small_url, SMALL), big: fleet(scratch / "big", big_url, big)}
        print(f"metrics: made {big:,} running contexts in {time.perf_counter() - started:.1f} s "
              f"({datetime.now(UTC):%H:%M:%S})", flush=True)
        for _ in range(5 if quick else 51):
            for count, metric in metrics.items():
                times[count].append(timed(partial(metric.render)))
        shown = metrics[big].render().decode()
        assert f'tasuki_tasks_running{{status="processing"}} {float(big)}' in shown, shown[:2000]
    small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
    ratio = big_s / small_s
    print(f"metrics: a scrape with {big:,} running tasks {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms with "
          f"{SMALL}: {ratio:.2f}", flush=True)
    return [Result(f"/metrics scrape, {big:,} vs {SMALL} running", f"{ratio:.2f}", f"<= {TARGET:g}", ratio <= TARGET)]


if __name__ == "__main__":
    standalone(run, __doc__)
