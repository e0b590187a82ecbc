"""Failover in the compose stack: from ``docker kill`` of the worker container holding a task to the task's next
step on disk, with the project's images and docker-compose.yml (three worker replicas, host networking).

* ``test timings`` (heartbeat 2 s, stale 8 s, monitor every 2 s), as tests/test_compose_stack.py runs them;
* ``documented timings``: config.yaml's own (heartbeat 30 s, stale 60 s, monitor every 30 s).

The time splits, from the maintenance container's log, into *detection* (death → the monitor re-enqueues) and
*resume* (re-enqueue → next step: queue pickup, lock takeover, clone, one model call). Each sample is held
against the bound ``stale_after_s + monitor.interval_s + resume`` (measured / bound ≤ 1). Needs Docker (root
starts Debian's dockerd) and debootstrap, as the compose test does; a few minutes, most of it waiting.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from bench.common import Result, standalone
from tests.helpers.compose_fleet import TEST_TIMINGS, Fleet, compose_fleet
from worker.settings import load_settings

DOCUMENTED = load_settings(Path(__file__).resolve().parents[1] / "config.yaml", env={})
DOCUMENTED_TIMINGS = {
    "TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S": str(DOCUMENTED.contexts.heartbeat_interval_s),
    "TASUKI__CONTEXTS__STALE_AFTER_S": str(DOCUMENTED.contexts.stale_after_s),
    "TASUKI__MONITOR__INTERVAL_S": str(DOCUMENTED.monitor.interval_s),
}
TIMEOUT_S = 600.0


def reenqueued_at(fleet: Fleet, uuid: str) -> float:
    """When the maintenance container's monitor re-enqueued ``uuid`` (its log's JSON timestamp)."""
    for line in fleet.stack.logs("maintenance", tail=2000).splitlines():
        record = line.partition("|")[2].strip()
        if uuid in record and "monitor resume" in record and record.startswith("{"):
            stamp = json.loads(record)["timestamp"].replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    raise RuntimeError(f"the monitor's resume of {uuid} is not in the maintenance log")


def one_failover(root: Path, timings: dict[str, str]) -> tuple[float, float]:
    """Detection and resume seconds of one ``docker kill`` mid-task."""
    with compose_fleet(root, timings) as fleet:
        number = fleet.new_issue(held=True)
        uuid = fleet.submit(number)
        fleet.stack.wait(lambda: fleet.held(number), TIMEOUT_S, "the task to be mid-task")
        container = fleet.holder_container(uuid)
        fleet.stack.engine.docker("kill", container)
        died = time.time()
        fleet.release(number)
        state = fleet.stack.wait(lambda: fleet.completed_state(uuid), TIMEOUT_S, "the task to finish")
        assert state["status"] == "completed" and state["attempt"] == 2, state  # noqa: PT018 - one verdict
        stepped = died + fleet.first_step_after(uuid, died)
        enqueued = reenqueued_at(fleet, uuid)
    return enqueued - died, stepped - enqueued


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """One failover at test timings, and (unless ``quick``) one at the documented timings."""
    results = []
    chosen = {"test timings": TEST_TIMINGS} if quick else {"test timings": TEST_TIMINGS,
                                                             "documented timings": DOCUMENTED_TIMINGS}
    for name, timings in chosen.items():
        root = scratch / name.replace(" ", "-")
        root.mkdir(parents=True)
        detection, resume = one_failover(root, timings)
        stale = float(timings["TASUKI__CONTEXTS__STALE_AFTER_S"])
        interval = float(timings["TASUKI__MONITOR__INTERVAL_S"])
        total = detection + resume
        ratio = total / (stale + interval + resume)
        print(f"compose {name} (heartbeat {timings['TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S']} s, stale {stale:g} s, "
              f"monitor {interval:g} s): {total:.1f} s from death to next step (detect {detection:.1f} + resume "
              f"{resume:.1f}); bound {stale + interval + resume:.1f} s", flush=True)
        results.append(Result(f"compose failover: {name}", f"{total:.1f}s", "info", None))
        results.append(Result(f"compose failover: {name} / bound", f"{ratio:.2f}", "<= 1", ratio <= 1))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
