"""``tasuki context list``, ``tasuki stats`` and the alerts' measurements with 10,000 completed contexts against
10 (issue 13 §4: each read every context, 1.8 s / 2.2 s / 1.2 s at 11,000). Each is timed as the command runs
it: a fresh store (so the index is opened and reconciled each time), then ``list_page`` (one page, the size of
the small store), ``indexed_stats`` or ``measure``. Both stores also hold 3 running contexts.

The completed contexts are copies of one the store's own writers made (a real task: messages, a tool call,
``finish``), each under its own UUID and creation time, then indexed by one ``rebuild`` as an upgraded store is.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid as uuid_module
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from bench.common import CONFIG, TASK_KEY, Result, new_store, standalone, timed
from contexts import ContextStore
from contexts.clock import iso
from contexts.names import METADATA_FILE, STATE_FILE
from contexts.queries import compute_stats, every_summary, indexed_stats, list_page, read_contexts
from contexts.usage import Usage
from contexts.usage_report import usage_rows
from scheduler.alerts import measure

SMALL = 10
FULL_BIG = 10_000
QUICK_BIG = 300
RUNNING = 3
TARGET = 2.0
START = datetime(2026, 1, 1, tzinfo=UTC)


def template(base: Path) -> Path:
    """One completed context written by the store, as a worker finishes a short task."""
    ctx = new_store(base, "never").create(TASK_KEY, CONFIG, user="bench", heartbeat=False)
    ctx.append_message("system", "You are a coding agent.")
    ctx.append_message("user", "Fix the failing test.")
    ctx.append_message("assistant", "Running the tests.")
    ctx.append_tool("bash", {"command": "pytest -q"}, "success", 120, result="1 passed")
    ctx.update_state(status="processing", add={"llm_call_count": 3}, usage=[(Usage("agent", "bench", 4000, 200), None)])
    return ctx.finish("completed")


def copies(model: Path, count: int) -> None:
    """``count`` copies of ``model`` beside it, each with its own UUID and a creation time a minute apart."""
    metadata = json.loads((model / METADATA_FILE).read_text())
    state = json.loads((model / STATE_FILE).read_text())
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.name not in (METADATA_FILE, STATE_FILE)}
    for n in range(count):
        uuid = str(uuid_module.uuid4())
        created = START + timedelta(minutes=n)
        target = model.parent / uuid
        target.mkdir(mode=0o700)
        (target / METADATA_FILE).write_text(json.dumps({**metadata, "uuid": uuid, "created_at": iso(created)}))
        (target / STATE_FILE).write_text(
            json.dumps({**state, "started_at": iso(created), "completed_at": iso(created + timedelta(seconds=40))})
        )
        for name, data in files.items():
            (target / name).write_bytes(data)


def history(root: Path, completed: int) -> float:
    """A store with ``completed`` completed contexts and ``RUNNING`` running ones, indexed; the rebuild's seconds."""
    model = template(root)
    copies(model, completed - 1)
    store = new_store(root, "never")
    rebuild_s = timed(store.index.rebuild)
    for _ in range(RUNNING):
        store.create(TASK_KEY, CONFIG, heartbeat=False).release()
    return rebuild_s


def reads(root: Path) -> dict[str, Callable[[], object]]:
    """What each command does, from a fresh store as each run of it opens one."""
    now = datetime.now(UTC)
    return {
        "list": lambda: list_page(ContextStore(root), limit=SMALL),
        "stats": lambda: indexed_stats(ContextStore(root)),
        "alerts": lambda: measure(ContextStore(root), now, timedelta(hours=24), timedelta(hours=6)),
    }


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Each read on both stores, alternately; the ratio of the medians."""
    big = QUICK_BIG if quick else FULL_BIG
    started = time.perf_counter()
    roots = {SMALL: scratch / "small", big: scratch / "big"}
    rebuild_s = [history(root, count) for count, root in roots.items()][-1]
    print(f"index: made {big:,} completed contexts in {time.perf_counter() - started:.1f} s; indexing them all "
          f"(an upgraded store's first open, or `tasuki context reindex`) took {rebuild_s:.1f} s", flush=True)
    assert len(list_page(ContextStore(roots[big]), limit=SMALL).items) == SMALL
    assert indexed_stats(ContextStore(roots[big])) == compute_stats(ContextStore(roots[big]))
    results = []
    for name in ("list", "stats", "alerts"):
        times: dict[int, list[float]] = {SMALL: [], big: []}
        actions = {count: reads(root)[name] for count, root in roots.items()}
        for _ in range(5 if quick else 31):
            for count, action in actions.items():
                times[count].append(timed(partial(action)))
        small_s, big_s = statistics.median(times[SMALL]), statistics.median(times[big])
        ratio = big_s / small_s
        print(f"index: {name} with {big:,} completed contexts {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms with "
              f"{SMALL}: {ratio:.2f}", flush=True)
        label = f"{name}, {big:,} vs {SMALL} completed"
        results.append(Result(label, f"{ratio:.2f}", f"<= {TARGET:g}", ratio <= TARGET))
    scan = timed(lambda: read_contexts(ContextStore(roots[big])))
    print(f"index: for comparison, the scan every list and stats made before: {scan * 1e3:.0f} ms at {big:,}",
          flush=True)
    results.append(usage_report(roots[big], big, 3 if quick else 11))
    return results


def usage_report(root: Path, big: int, rounds: int) -> Result:
    """``tasuki usage`` (by repository) at ``big`` completed contexts: from the index against reading every context,
    as it did before; the two must agree."""
    indexed, scanned = (lambda: usage_rows(every_summary(ContextStore(root)).items),
                        lambda: usage_rows(read_contexts(ContextStore(root)).items))
    assert indexed() == scanned()
    assert indexed()[0].tasks == big  # every completed one spent (the running ones have not yet)
    times: dict[str, list[float]] = {"index": [], "scan": []}
    for _ in range(rounds):
        times["index"].append(timed(indexed))
        times["scan"].append(timed(scanned))
    index_s, scan_s = statistics.median(times["index"]), statistics.median(times["scan"])
    print(f"index: usage report with {big:,} completed contexts {index_s * 1e3:.0f} ms from the index vs "
          f"{scan_s * 1e3:.0f} ms reading every context: {index_s / scan_s:.2f}", flush=True)
    return Result(f"usage report, index vs scan at {big:,}", f"{index_s / scan_s:.2f}", "-", None)


if __name__ == "__main__":
    standalone(run, __doc__)
