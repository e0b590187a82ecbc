"""The fleet's store in PostgreSQL (SPEC §12, issue 27), measured against one host in the same run:

- a step's durable write: an agent step (the model's answer, a tool call, its result, the state) written by a
  context store with the durable copy in PostgreSQL (the lines and state committed per step under the lease)
  against the same step on one host; both with ``fsync: step``. Target: at most 1.5 times.
- ``context list`` and ``stats`` on 100,000 fleet contexts against 1,000: each from a fresh store reading the
  fleet's index table (``fleet/index.py``). Target: at most 2 times. The rows are copies of one context's index row
  that a real store wrote, bulk-loaded with ``COPY`` (the tallies' trigger runs for each, as for a write).
- the rebuild of a context's directory from PostgreSQL (what a resume on another host does first) at 10,000
  messages against 100: reported, no target (it is part of a failover's time).

PostgreSQL 16 with pgvector is the ``pgserver`` wheel's, started in the scratch directory (tests/helpers/postgres.py).
"""

from __future__ import annotations

import statistics
import time
import uuid as uuid_module
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

from bench.common import CONFIG, TASK_KEY, Result, standalone, timed
from contexts.context import Context
from contexts.index_schema import row_of
from contexts.names import COMPLETED_DIR
from contexts.queries import indexed_stats, list_page
from contexts.store import ContextStore
from contexts.summary import summarize
from fleet.durable import PostgresCopy
from fleet.index import COLUMNS, PostgresIndex, pg_row
from fleet.store import FleetStore
from tests.helpers.postgres import running_postgres

STEP_TARGET = 1.5
READ_TARGET = 2.0
SMALL = 1_000
FULL_BIG = 100_000
QUICK_SMALL, QUICK_BIG = 100, 2_000
PAGE = 50
BATCH = 500
REBUILD_SMALL, REBUILD_BIG, QUICK_REBUILD_BIG = 100, 10_000, 1_000


def one_step(ctx: Context, n: int) -> None:
    """An agent step's records and its commit point, as the agent loop writes them."""
    ctx.append_message("assistant", f"step {n}: running the tests.", tool_calls=[{"id": f"c{n}", "type": "function"}])
    ctx.append_tool("bash", {"command": "pytest -q"}, "success", 120, result="1 passed")
    ctx.append_message("tool", "1 passed", tool_call_id=f"c{n}")
    ctx.stage_state(add={"llm_call_count": 1, "tool_call_count": 1}, status="processing")
    ctx.step_done()


def step_times(store: ContextStore, steps: int) -> list[float]:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "Fix the failing test.")
    times = [timed(lambda n=n: one_step(ctx, n)) for n in range(steps)]  # type: ignore[misc]
    ctx.finish("completed")
    return times


def durable_step(scratch: Path, fleet: FleetStore, quick: bool) -> Result:
    stores = {
        "one host": ContextStore(scratch / "one-host", fsync="step"),
        "fleet": ContextStore(
            scratch / "fleet-host",
            fsync="step",
            durable=PostgresCopy(fleet),
            index=lambda base: PostgresIndex(fleet, base),
        ),
    }
    steps = 20 if quick else 200
    times: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(2 if quick else 5):  # alternately, so that both see the same machine
        for name, store in stores.items():
            times[name] += step_times(store, steps)
    one, many = statistics.median(times["one host"]), statistics.median(times["fleet"])
    ratio = many / one
    print(
        f"fleet: a step's durable write {many * 1e3:.2f} ms in fleet mode vs {one * 1e3:.2f} ms on one host: "
        f"{ratio:.2f}",
        flush=True,
    )
    return Result("fleet: step write vs one host", f"{ratio:.2f}", f"<= {STEP_TARGET:g}", ratio <= STEP_TARGET)


def filled(store: ContextStore, messages: int) -> str:
    """A finished fleet context of ``messages`` messages (answers and tool results), committed a step at a time."""
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "Fix the failing test.")
    for n in range(1, messages, 2):
        one_step(ctx, n)
    ctx.finish("completed")
    return ctx.uuid


def rebuild_times(scratch: Path, fleet: FleetStore, quick: bool) -> Result:
    """The rebuild of a directory from the durable copy at the larger size against the smaller, alternately."""
    store = ContextStore(scratch / "rebuild-host", fsync="never", durable=PostgresCopy(fleet))
    sizes = (REBUILD_SMALL, QUICK_REBUILD_BIG if quick else REBUILD_BIG)
    uuids = {size: filled(store, size) for size in sizes}
    copy = PostgresCopy(fleet)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for round_ in range(3 if quick else 7):
        for size, uuid in uuids.items():
            target = scratch / f"rebuilt-{size}-{round_}"
            times[size].append(timed(lambda uuid=uuid, target=target: copy.rebuild(uuid, target)))  # type: ignore[misc]
    small, big = (statistics.median(times[size]) for size in sizes)
    print(
        f"fleet: rebuild of a directory at {sizes[1]:,} messages {big * 1e3:.1f} ms vs {small * 1e3:.1f} ms at "
        f"{sizes[0]:,}: {big / small:.1f}",
        flush=True,
    )
    return Result(f"fleet: rebuild, {sizes[1]:,} vs {sizes[0]:,} messages", f"{big / small:.1f}", "-", None)


def template_row(scratch: Path) -> tuple[Any, ...]:
    """The index row a real store writes for a finished context."""
    store = ContextStore(scratch / "template", fsync="never")
    ctx = store.create(TASK_KEY, CONFIG, user="bench", heartbeat=False)
    ctx.append_message("user", "Fix the failing test.")
    one_step(ctx, 1)
    done = ctx.finish("completed")
    return pg_row("bench-host", row_of(summarize(done), done))


def load(dsn: str, template: tuple[Any, ...], count: int) -> float:
    """``count`` copies of ``template`` under their own UUIDs and creation times, by COPY in batches of
    :data:`BATCH`, each its own transaction (the tallies' trigger updates one row per copy: one transaction of
    100,000 updates of one row walks an ever longer version chain); the seconds it took."""
    names = ["host", *COLUMNS]
    at = {name: names.index(name) for name in ("uuid", "created_at", "ended_at", "summary")}
    columns = ", ".join(f'"{name}"' for name in names)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(0, count, BATCH):
            with (
                conn.transaction(),
                conn.cursor() as cursor,
                cursor.copy(f"COPY tasuki_index ({columns}) FROM STDIN") as copy,
            ):
                for n in range(first, min(first + BATCH, count)):
                    row = list(template)
                    uuid = str(uuid_module.uuid4())
                    row[at["uuid"]] = uuid
                    row[at["created_at"]] = template[at["created_at"]] - 60.0 * (n + 1)
                    row[at["ended_at"]] = row[at["created_at"]] + 40.0
                    row[at["summary"]] = str(template[at["summary"]]).replace(str(template[at["uuid"]]), uuid)
                    copy.write_row(row)
            conn.execute("VACUUM tasuki_index_tallies")  # the trigger's dead versions of the tally row
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE tasuki_index")
    return time.perf_counter() - started


def reads(fleet: FleetStore, root: Path) -> dict[str, Callable[[], object]]:
    def store() -> ContextStore:
        return ContextStore(root, index=lambda base: PostgresIndex(fleet, base, host="reader"))

    return {"list": lambda: list_page(store(), limit=PAGE), "stats": lambda: indexed_stats(store())}


def list_and_stats(scratch: Path, fleets: dict[int, FleetStore], dsns: dict[int, str], quick: bool) -> list[Result]:
    template = template_row(scratch)
    for count, dsn in dsns.items():
        fleets[count].open()  # the schema
        seconds = load(dsn, template, count)
        print(f"fleet: loaded {count:,} index rows in {seconds:.1f} s", flush=True)
    roots = {count: scratch / f"reader-{count}" for count in dsns}
    for count, root in roots.items():
        stats = indexed_stats(ContextStore(root, index=lambda base, c=count: PostgresIndex(fleets[c], base)))  # type: ignore[misc]
        assert stats.completed == count, (stats.completed, count)
    results = []
    small, big = sorted(dsns)
    for name in ("list", "stats"):
        actions = {count: reads(fleets[count], roots[count])[name] for count in dsns}
        times: dict[int, list[float]] = {count: [] for count in dsns}
        for _ in range(5 if quick else 31):
            for count, action in actions.items():
                times[count].append(timed(action))
        small_s, big_s = statistics.median(times[small]), statistics.median(times[big])
        ratio = big_s / small_s
        print(
            f"fleet: {name} with {big:,} fleet contexts {big_s * 1e3:.2f} ms vs {small_s * 1e3:.2f} ms with "
            f"{small:,}: {ratio:.2f}",
            flush=True,
        )
        label = f"fleet: {name}, {big:,} vs {small:,}"
        results.append(Result(label, f"{ratio:.2f}", f"<= {READ_TARGET:g}", ratio <= READ_TARGET))
    assert len(list_page(ContextStore(roots[big], index=lambda b: PostgresIndex(fleets[big], b))).items) == PAGE
    assert (roots[big] / COMPLETED_DIR).is_dir()
    return results


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Both measurements on one PostgreSQL started for the run."""
    scratch.mkdir(parents=True, exist_ok=True)
    sizes = (QUICK_SMALL, QUICK_BIG) if quick else (SMALL, FULL_BIG)
    with ExitStack() as stack:
        server = stack.enter_context(running_postgres())
        dsns = {size: server.dsn(server.create_database()) for size in sizes}
        step_dsn = server.dsn(server.create_database())
        step_fleet = stack.enter_context(FleetStore(step_dsn))
        fleets = {size: stack.enter_context(FleetStore(dsn, open=False)) for size, dsn in dsns.items()}
        return [
            durable_step(scratch, step_fleet, quick),
            rebuild_times(scratch, step_fleet, quick),
            *list_and_stats(scratch, fleets, dsns, quick),
        ]


if __name__ == "__main__":
    standalone(run, __doc__)
