"""Minimal tasks per second through the whole stack, against a bare Celery no-op task on the same Redis.

A minimal task: the scripted model calls ``finish`` at once, the repository is one small file.  Each one still
creates its context, switches a warm copy onto a refreshed mirror, asks the model over HTTP and completes;
since issue 25 a task that changed nothing pushes no branch (it still pushes its fencing claim and deletes
it), so figures from before that change pushed a branch per task and are not comparable.  A second baseline
does only that unavoidable work (clone, then refresh the kept clone; one chat request on a kept HTTP client;
push) in a bare Celery task, which shows how much is Tasuki's own bookkeeping.
All workers are real ``celery worker`` subprocesses with the same concurrency on one private Redis; rounds
alternate, so a burst of load from elsewhere slows a round of each rather than all rounds of one.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from bench.common import Result, standalone
from bench.noop_app import CONTEXT_ROUNDTRIP, GIT_ROUNDTRIP, NOOP, NOOP_QUEUE
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

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET = 0.3
SAME_WORK_TARGET = 0.9  # issue 13 §3: Tasuki's own work is at most a tenth of a minimal task
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


@dataclass
class CpuShares:
    """CPU milliseconds per task, summed over the rounds measured: the pool processes' Python (user + system),
    the git they ran (their waited-for children), and the worker's main process (Celery's consumer); and the
    machine's idle core time per task (a side that waits, on a lock or a timer, leaves cores idle)."""

    python: float = 0.0
    git: float = 0.0
    main: float = 0.0
    idle: float = 0.0
    tasks: int = 0

    def add(self, before: list[float], after: list[float], tasks: int) -> None:
        """Add one round's readings (from :func:`cpu_ms`)."""
        self.python, self.git, self.main, self.idle = (
            total + (b - a)
            for total, a, b in zip((self.python, self.git, self.main, self.idle), before, after, strict=True)
        )
        self.tasks += tasks

    def per_task(self) -> str:
        n = max(self.tasks, 1)
        return (f"python {self.python / n:.1f} + git {self.git / n:.1f} + celery main {self.main / n:.1f} ms "
                f"(idle cores {self.idle / n:.1f} ms)")


def cpu_ms(worker: CeleryWorker) -> list[float]:
    """[pool processes' own CPU, their reaped children's CPU, the main process's own CPU, the machine's idle
    time summed over its cores], in milliseconds."""
    assert worker.process is not None

    def times(pid: int) -> list[float]:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return [int(value) * 1000 / CLOCK_TICKS for value in fields[11:15]]  # utime stime cutime cstime

    pools = [times(pid) for pid in worker.pool_processes()]
    main = times(worker.process.pid)
    idle = int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[4]) * 1000 / CLOCK_TICKS
    return [sum(t[0] + t[1] for t in pools), sum(t[2] + t[3] for t in pools), main[0] + main[1], idle]


def measured_round(worker: CeleryWorker, shares: CpuShares, send: Callable[[], Any], count: int, keep: bool) -> float:
    """:func:`round_seconds`, adding the round's CPU to ``shares`` when ``keep`` (not the warm-up round)."""
    before = cpu_ms(worker)
    seconds = round_seconds(send, count)
    if keep:
        shares.add(before, cpu_ms(worker), count)
    return seconds


@dataclass
class Rates:
    """Tasks per second of each side (medians over the measured rounds), and the CPU per task of three of them."""

    tasuki: float
    noop: float
    bare: float
    floor: float  # the bare work inside a context's life (SPEC §3's files): what any system must do
    cpu: dict[str, CpuShares]


def measure(scratch: Path, tasks: int, noops: int, rounds: int) -> Rates:
    """Tasks/s of Tasuki, the no-op, the bare round trip and the bare round trip with a context, over alternating
    rounds after a warm-up round, and the CPU per task of the worker processes."""
    repo = tiny_repo(scratch / "repo")
    contexts = str(scratch / "floor-contexts")
    cpu = {"tasuki": CpuShares(), "bare": CpuShares(), "floor": CpuShares()}
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
                sides: dict[str, Callable[[bool], float]] = {
                    "tasuki": lambda keep: measured_round(workers[0], cpu["tasuki"], lambda: send_task(app, repo),
                                                          tasks, keep),
                    "noop": lambda keep: round_seconds(lambda: send_noop(app, repo), noops),
                    "bare": lambda keep: measured_round(workers[1], cpu["bare"],
                                                        lambda: send_git_roundtrip(app, repo, model.url), tasks, keep),
                    "floor": lambda keep: measured_round(
                        workers[1], cpu["floor"], lambda: send_context_roundtrip(app, repo, model.url, contexts),
                        tasks, keep),
                }
                times: dict[str, list[float]] = {name: [] for name in sides}
                pushing = ["tasuki", "bare", "floor"]
                for index in range(rounds + 1):
                    # Every task pushes a branch, and git's fetch and push cost grows with the remote's branches:
                    # the sides that push take turns at going first (over three measured rounds, each side is
                    # once first, once second, once third), so that none always meets the fewest.
                    turn = (index - 1) % len(pushing)
                    for name in [*pushing[turn:], *pushing[:turn], "noop"]:
                        times[name].append(sides[name](index > 0))
        finally:
            for worker in workers:
                worker.stop()
    rate = {name: (noops if name == "noop" else tasks) / statistics.median(taken[1:]) for name, taken in times.items()}
    return Rates(rate["tasuki"], rate["noop"], rate["bare"], rate["floor"], cpu)


def send_task(app: Celery, repo: Path) -> Any:
    uuid = str(uuid_module.uuid4())
    return send_run_task(app, uuid, local_request(repo, uuid[:8]))


def send_noop(app: Celery, repo: Path) -> Any:
    uuid = str(uuid_module.uuid4())
    return app.send_task(NOOP, args=[uuid, local_request(repo, uuid[:8])], task_id=uuid, queue=NOOP_QUEUE)


def send_context_roundtrip(app: Celery, repo: Path, model_url: str, contexts: str) -> Any:
    uuid = str(uuid_module.uuid4())
    request = local_request(repo, uuid[:8])
    return app.send_task(CONTEXT_ROUNDTRIP, args=[uuid, request, model_url, contexts], task_id=uuid, queue=NOOP_QUEUE)


def send_git_roundtrip(app: Celery, repo: Path, model_url: str) -> Any:
    uuid = str(uuid_module.uuid4())
    request = local_request(repo, uuid[:8])
    return app.send_task(GIT_ROUNDTRIP, args=[uuid, request, model_url], task_id=uuid, queue=NOOP_QUEUE)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure, print one line per baseline, return the results."""
    tasks, noops, rounds = (6, 30, 1) if quick else (40, 400, 3)
    own = scratch / "throughput"
    own.mkdir(parents=True)
    rates = measure(own, tasks, noops, rounds)
    ratio = rates.tasuki / rates.noop
    result = Result("task throughput vs celery no-op", f"{ratio:.3f}", f">= {TARGET}", ratio >= TARGET)
    same = rates.tasuki / rates.bare
    same_work = Result("task throughput vs bare git+http", f"{same:.3f}", f">= {SAME_WORK_TARGET}",
                       same >= SAME_WORK_TARGET)
    floor = rates.floor / rates.bare
    where = f"(median of {rounds} rounds of {tasks} tasks / {noops} no-ops, concurrency {CONCURRENCY})"
    print(
        f"throughput  tasuki {rates.tasuki:,.1f} tasks/s  celery no-op {rates.noop:,.1f} tasks/s  "
        f"ratio {ratio:.3f}  target >= {TARGET}  {result.verdict}  {where}",
        flush=True,
    )
    print(
        f"throughput  tasuki {rates.tasuki:,.1f} tasks/s  bare refresh+chat+push {rates.bare:,.1f} tasks/s  "
        f"ratio {same:.3f}  target >= {SAME_WORK_TARGET}  {same_work.verdict}  (Tasuki against only the work every "
        "task must do)",
        flush=True,
    )
    print(
        f"throughput  the bare work inside a context's life (SPEC §3's files, nothing else) {rates.floor:,.1f} "
        f"tasks/s: {floor:.3f} of the bare rate (the ceiling for a task kept in this context store); Tasuki against it "
        f"{rates.tasuki / rates.floor:.3f}",
        flush=True,
    )
    print("throughput  cpu per task: " + "; ".join(f"{name} {shares.per_task()}" for name, shares in rates.cpu.items()),
          flush=True)
    return [result, same_work]


if __name__ == "__main__":
    standalone(run, __doc__)
