"""Failover across hosts (SPEC §12, issue 27): from SIGKILL of every process of the host that holds a task to the
task's next step committed to PostgreSQL by another host. Target: within ``fleet.lease_s`` + one
``monitor.interval_s`` + the rebuild of the context's directory from the durable copy (measured in the same run).

Each round is a fresh fleet of tests/helpers/fleet_netns.py on network namespaces (root only): a storage host
(PostgreSQL 16 from the ``pgserver`` wheel and a ``redis-server`` of the round's own), a services host (the scripted
model and the fake forge with its bare git remote) and two worker hosts, each with its own hostname, PID namespace
and directories for contexts, checkouts and mirrors. Host A runs a task worker and a maintenance worker; host B a
maintenance worker and the beat (the monitor), and its task worker once A holds the task. The task (a GitHub issue:
five ``bash`` steps, then ``finish``) runs on A; the model holds its third answer at a gate, so the kill lands by
event: two steps committed in the durable copy and their checkpoint on the remote, A waiting for the model. Then
every process of A dies at once (SIGKILL of its PID namespace's init), the gate opens, and the clock runs until the
durable copy holds a tool result written under the new epoch: B's next step, committed. The time is split, from B's
maintenance worker's log, into *detect* (kill -> the monitor re-enqueues; bounded by the lease and one monitor pass)
and *resume* (re-enqueue -> B's step committed: the queue, the lease taken, the rebuild, B's first clone of the
repository, one model call, the tool, the commit). Each round then checks that the task completed on B (attempt 2)
and times the rebuild of its directory from PostgreSQL (median of five) for the bound. The worst case at the
defaults (lease 60 s, monitor 30 s) is computed as bench_failover's: the settings plus the largest resume measured.

Settings (tests/helpers/fleet_netns.py's ``TIMINGS``): heartbeat 1 s, stale 3 s, lease 4 s, monitor 1 s.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.bench_failover import reenqueued_at
from bench.common import Result, standalone, timed
from fleet.durable import PostgresCopy
from fleet.settings import FleetSettings
from fleet.store import FleetStore
from tests.helpers.fleet_netns import TIMINGS, Fleet, logging_turns, tasuki_fleet
from tests.helpers.netns import Host, netns_can_be_made
from worker.settings_models import MonitorSettings

STEPS = 5  # bash steps, then finish
GATE, GATE_TURN = "fleet-failover", 2
WAIT_S = 180.0
POLL_S = 0.01
REBUILDS = 5
LEASE_S = float(TIMINGS["TASUKI__FLEET__LEASE_S"])
MONITOR_S = float(TIMINGS["TASUKI__MONITOR__INTERVAL_S"])
HEARTBEAT_S = float(TIMINGS["TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S"])
STALE_S = float(TIMINGS["TASUKI__CONTEXTS__STALE_AFTER_S"])
SETTINGS = f"heartbeat {HEARTBEAT_S:g} s, stale {STALE_S:g} s, lease {LEASE_S:g} s, monitor {MONITOR_S:g} s"
# B's next step: a tool result committed under an epoch after the dead host's (its answer is in the same commit).
NEXT_STEP = (
    "SELECT count(*) FROM tasuki_records WHERE uuid = %s AND file = 'messages.jsonl' AND epoch > 1 "
    "AND line->>'role' = 'tool'"
)


@dataclass(frozen=True)
class Sample:
    """One failover, in seconds."""

    total: float  # kill -> the next step committed by the other host
    detect: float  # kill -> the monitor's re-enqueue
    lease_left: float  # the lease's time to run at the kill, by the database's clock
    rebuild: float  # the context's directory rebuilt from PostgreSQL, median
    received: float  # kill -> B's task worker received the re-enqueued delivery
    started: float  # kill -> B's task started (its context open: the lease taken, the directory rebuilt)
    answered: float  # kill -> B's first model answer (its checkout made, the model called)

    @property
    def resume(self) -> float:
        return self.total - self.detect

    @property
    def bound(self) -> float:
        return LEASE_S + MONITOR_S + self.rebuild


def resume_marks(log_path: Path, uuid: str) -> tuple[float, float, float]:
    """When B's task worker received the delivery, started the task and had its first model answer (epoch seconds,
    from its JSON log)."""
    marks: list[float] = []
    wanted = (f"tasuki.run_task[{uuid}] received", "task started", "llm call")
    for line in log_path.read_text(errors="replace").splitlines():
        if len(marks) < len(wanted) and line.startswith("{"):
            record = json.loads(line)
            if wanted[len(marks)] in str(record.get("event", "")):
                marks.append(datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp())
    if len(marks) < len(wanted):
        raise RuntimeError(f"{log_path.name} lacks {wanted[len(marks)]!r}")
    return marks[0], marks[1], marks[2]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def poll(predicate: Any, what: str, fleet: Fleet) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)  # polling, bounded by the deadline
    raise RuntimeError(f"timed out after {WAIT_S:.0f} s waiting for {what}\n{fleet.log_tail()}")


def at_the_gate(fleet: Fleet, holder: Host, uuid: str) -> bool:
    """The task is the holder's, waits for its third answer, and its two steps' checkpoint is on the remote (a kill
    while that push is in flight loses the step's checkout, which the next holder would ask the model to redo)."""
    return (
        fleet.holders().get(holder.hostname) == uuid
        and fleet.model.model.gates().get(GATE, {}).get("reached", 0) >= 1
        and fleet.checkpoint(uuid) == f"tasuki: checkpoint after step {GATE_TURN}"
    )


def rebuild_time(dsn: str, uuid: str) -> float:
    """The median time to rebuild the context's directory from the durable copy, as a resume does first."""
    with FleetStore(dsn) as store, tempfile.TemporaryDirectory(prefix="tasuki-rebuild-") as scratch:
        copy = PostgresCopy(store)
        return statistics.median(
            timed(lambda n=n: copy.rebuild(uuid, Path(scratch) / str(n)))  # type: ignore[misc]
            for n in range(REBUILDS)
        )


def one_failover(root: Path) -> Sample:
    """A fresh fleet of two worker hosts; host A killed at the gate; the time to host B's next step."""
    root.mkdir(parents=True)
    with tasuki_fleet(root, logging_turns(STEPS, GATE, GATE_TURN), hosts=2) as fleet:
        a, b = fleet.hosts
        fleet.start_worker(a, "tasks")
        fleet.start_worker(a, "maint", queues="maintenance,compression", pool="solo")
        fleet.start_worker(b, "maint", queues="maintenance,compression", pool="solo")
        fleet.start_beat(b)
        uuid = fleet.send(fleet.issue(7, "Log every step"))
        poll(lambda: at_the_gate(fleet, a, uuid), f"{a.hostname}'s task at its gate, two steps committed", fleet)
        fleet.start_worker(b, "tasks")  # up before the kill: its start is no part of a failover
        with psycopg.connect(fleet.dsn, autocommit=True) as conn:
            left = conn.execute(
                "SELECT extract(epoch FROM expires_at - now()) FROM tasuki_leases WHERE uuid = %s", (uuid,)
            ).fetchone()
            killed = time.time()
            a.kill()  # every process of host A, at once
            fleet.model.model.open_gate(GATE)
            poll(lambda: (conn.execute(NEXT_STEP, (uuid,)).fetchone() or (0,))[0], "the next step on B", fleet)
            stepped = time.time()
        if a.pids():
            raise RuntimeError(f"{a.hostname} still has processes after its kill: {a.pids()}")
        enqueued = reenqueued_at(root / f"{b.hostname}-maint.log", uuid)
        received, started, answered = resume_marks(root / f"{b.hostname}-tasks.log", uuid)
        state = poll(lambda: done(fleet, uuid), "the task to complete on B", fleet)
        if (state.get("attempt"), str(state.get("worker")).split(":")[0]) != (2, b.hostname):
            raise RuntimeError(f"the task did not complete on {b.hostname} in attempt 2: {state}")
        rebuild = rebuild_time(fleet.dsn, uuid)
    return Sample(stepped - killed, enqueued - killed, float(left[0]) if left else float("nan"), rebuild,
                  received - killed, started - killed, answered - killed)


def done(fleet: Fleet, uuid: str) -> dict[str, Any] | None:
    state = fleet.states().get(uuid, {})
    if state.get("status") in ("failed", "timeout", "cancelled"):
        raise RuntimeError(f"the task ended {state['status']}: {state.get('error')}\n{fleet.log_tail()}")
    return state if state.get("status") == "completed" else None


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Rounds of a fresh two-host fleet, each killing the host that holds the task."""
    problem = netns_can_be_made()
    if problem is not None:
        print(f"fleet failover: skipped, {problem}", flush=True)
        return []
    rounds = 1 if quick else 5
    print(f"fleet failover: settings {SETTINGS}; load before {load()}", flush=True)
    samples = []
    for n in range(rounds):
        sample = one_failover(scratch / f"round-{n}")
        samples.append(sample)
        print(
            f"fleet failover round {n + 1}: kill -> next step on another host {sample.total:.2f} s (detect "
            f"{sample.detect:.2f}: lease left at the kill {sample.lease_left:.2f} s; resume {sample.resume:.2f}: "
            f"queue {sample.received - sample.detect:.2f}, open {sample.started - sample.received:.2f} with the "
            f"rebuild {sample.rebuild * 1e3:.1f} ms, checkout and model {sample.answered - sample.started:.2f}, "
            f"tool and commit {sample.total - sample.answered:.2f}); bound {sample.bound:.3f} s: "
            f"{sample.total / sample.bound:.3f}; load {load()}",
            flush=True,
        )
    totals = [s.total for s in samples]
    ratios = [s.total / s.bound for s in samples]
    detects = [s.detect / (LEASE_S + MONITOR_S) for s in samples]
    rebuild = statistics.median(s.rebuild for s in samples)
    print(
        f"fleet failover: kill -> next step on another host, median {statistics.median(totals):.2f} s, max "
        f"{max(totals):.2f} s over {rounds} round(s); bound lease {LEASE_S:g} s + monitor {MONITOR_S:g} s + rebuild "
        f"{rebuild * 1e3:.1f} ms: ratio median {statistics.median(ratios):.3f}, max {max(ratios):.3f}; detect / "
        f"(lease + monitor) max {max(detects):.3f}; resume median {statistics.median(s.resume for s in samples):.2f} "
        f"s; load after {load()}",
        flush=True,
    )
    # At the defaults the detection scales with the settings and the resume (the step's own work) does not.
    lease, monitor = FleetSettings().lease_s, MonitorSettings().interval_s
    resume = max(s.resume for s in samples)
    worst, bound = lease + monitor + resume, lease + monitor + rebuild
    print(
        f"fleet failover: worst case at the defaults: lease {lease:g} s + monitor {monitor} s + resume {resume:.2f} s "
        f"= {worst:.1f} s, against the bound {bound:.1f} s: {worst / bound:.3f}",
        flush=True,
    )
    return [
        Result("fleet failover: kill -> next step", f"{statistics.median(totals):.2f}s", "info", None),
        Result("fleet failover: worst at defaults", f"{worst:.1f}s", "info", None),
        Result("fleet failover / bound", f"{max(ratios):.3f}", "<= 1", max(ratios) <= 1),
        Result("fleet failover: detect / bound", f"{max(detects):.3f}", "<= 1", max(detects) <= 1),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
