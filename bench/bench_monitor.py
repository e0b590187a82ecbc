"""One monitor pass over 10,000 running contexts: through the Redis heartbeat index against a full scan of
``running/`` (reading every ``.lock`` and ``state.json``, as seed 001's monitor does).

Both sides run the same planning over what they read and find the same stale contexts; the index path reads
the sorted set, lists ``running/`` (to catch contexts the index lacks) and opens only the stale ones.  Passes
are dry runs, so nothing changes between rounds; rounds alternate.  Target: the index path under 1 s.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

import redis

from bench.common import Result, standalone
from bench.worker_stack import private_redis
from contexts import ContextStore
from contexts.clock import utc_now
from scheduler.monitor import Monitor
from scheduler.plan import Policy, plan
from worker.logging import configure_logging
from worker.names import HEARTBEATS_KEY

FULL, QUICK = 10_000, 300
STALE = 10  # lost contexts among them: what both passes must find
ROUNDS, QUICK_ROUNDS = 5, 2
TARGET_S = 1.0
TASK_KEY = {"task_source": "local", "owner": "bench", "repo": "bench", "task_type": "prompt", "task_id": "1"}


def populate(base: Path, client: redis.Redis, count: int) -> list[str]:
    """``count`` live contexts (copies of one template, heartbeats in the index) plus :data:`STALE` lost ones."""
    live = ContextStore(base, clock=lambda: utc_now() + timedelta(days=1))  # heartbeats fresh all benchmark long
    template = live.create(TASK_KEY, {"model": "bench"}, heartbeat=False)
    template.append_message("user", "a task")
    template.detach()
    files = [entry.name for entry in os.scandir(template.path)]
    uuids = [template.uuid]
    for n in range(count - 1):
        uuid = f"00000000-0000-4000-8000-{n:012d}"
        os.mkdir(base / "running" / uuid, 0o700)
        for name in files:
            os.link(template.path / name, base / "running" / uuid / name)  # same bytes, no copying
        uuids.append(uuid)
    now = utc_now().timestamp()
    for start in range(0, len(uuids), 5000):
        client.zadd(HEARTBEATS_KEY, dict.fromkeys(uuids[start : start + 5000], now + 86400))
    ghost = ContextStore(base, hostname="ghost-host", clock=lambda: utc_now() - timedelta(hours=1))
    lost = []
    for _ in range(STALE):
        ctx = ghost.create(TASK_KEY, {"model": "bench"}, heartbeat=False, extra_metadata={"request": {}})
        ctx.detach()
        client.zadd(HEARTBEATS_KEY, {ctx.uuid: now - 3600})
        lost.append(ctx.uuid)
    return lost


def full_scan(monitor: Monitor) -> list[str]:
    """Seed 001's pass: read every running context, then plan."""
    now = utc_now()
    seen = [monitor.inspect(uuid) for uuid in monitor.store.running_uuids()]
    return sorted(a.uuid for a in plan(seen, now, monitor.policy) if a.kind == "resume")


def index_pass(monitor: Monitor) -> list[str]:
    """Tasuki's pass: the heartbeat index plus the listing of ``running/``, then plan."""
    return sorted(o.action.uuid for o in monitor.run(utc_now(), dry_run=True) if o.action.kind == "resume")


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Populate a store, then time both passes alternately; print medians and the ratio."""
    count, rounds = (QUICK, QUICK_ROUNDS) if quick else (FULL, ROUNDS)
    configure_logging("WARNING")  # the monitor logs every action it takes; printing them is not the point
    scratch.mkdir(parents=True, exist_ok=True)
    with private_redis(scratch / "redis") as url:
        client = redis.Redis.from_url(url)
        print(f"populating {count:,} running contexts ...", flush=True)
        lost = populate(scratch / "contexts", client, count)
        store = ContextStore(scratch / "contexts", stale_after_s=60)
        policy = Policy(stale_after_s=60, max_attempts=3, resume=True, hostname=store.hostname)
        monitor = Monitor(store, client, policy, send=lambda *_: None, ended=lambda *_: None)
        index_s: list[float] = []
        scan_s: list[float] = []
        for _ in range(rounds):
            for sink, pass_ in ((index_s, index_pass), (scan_s, full_scan)):
                start = time.perf_counter()
                found = pass_(monitor)
                sink.append(time.perf_counter() - start)
                if found != sorted(lost):
                    raise RuntimeError(f"{pass_.__name__} found {len(found)} lost contexts, expected {len(lost)}")
        client.close()
    index, scan = statistics.median(index_s), statistics.median(scan_s)
    print(f"index pass: {index * 1000:.0f} ms   full scan: {scan * 1000:.0f} ms   (medians of {rounds})")
    print(json.dumps({"contexts": count + STALE, "index_ms": round(index * 1000, 1), "scan_ms": round(scan * 1000, 1)}))
    return [
        Result("monitor: scan / index time", f"{scan / index:.1f}x", "info", None),
        Result(f"monitor: index pass, {count:,} ctx", f"{index:.3f}s", f"< {TARGET_S:g} s", index < TARGET_S),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
