"""Retention in fleet mode (SPEC §12, issue 27): a delete forgets the context's durable copy too, and a pass on any
host forgets the old finished contexts of every host from the fleet's PostgreSQL, so that none comes back.

Two "hosts" are two context stores with their own directories and hostnames on one real PostgreSQL; ``context
show`` and ``retention --dry-run`` run as subprocesses, as an operator runs them on a host."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import psycopg

from contexts.clock import iso, utc_now
from contexts.context import Context
from contexts.retention import apply_retention
from contexts.state import update_state
from contexts.store import ContextStore
from fleet.durable import PostgresCopy
from fleet.store import FleetStore
from tests.helpers.cli_process import one_line_error
from tests.helpers.context_support import CONFIG, TASK_KEY
from tests.helpers.fleet_hosts import HostFactory, host_cli, one_step

UNKNOWN = "00000000-0000-4000-8000-000000000000"
GZIP_DAYS, DELETE_DAYS = 7, 30


def finished(store: ContextStore) -> Context:
    ctx = store.create(TASK_KEY, CONFIG, user="alice", heartbeat=False)
    ctx.append_message("user", "Fix the bug.")
    one_step(ctx, "a step")
    ctx.finish("completed")
    return ctx


def age(store: ContextStore, uuid: str, dsn: str, days: float) -> None:
    """Make a finished context ``days`` old: its ``completed_at`` on its host and in the durable copy, and the time
    of the copy's last write (the database's clock)."""
    completed_at = iso(utc_now() - timedelta(days=days))
    update_state(store.completed_path(uuid), utc_now(), fsync=False, set_fields={"completed_at": completed_at})
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE tasuki_contexts SET state = jsonb_set(state, '{completed_at}', to_jsonb(%s::text)), "
            "updated_at = now() - make_interval(days => %s) WHERE uuid = %s",
            (completed_at, days, uuid),
        )


def kept(dsn: str, uuid: str) -> dict[str, int]:
    """How many rows of the context each fleet table keeps."""
    tables = ("tasuki_contexts", "tasuki_records", "tasuki_leases", "tasuki_checkpoints", "tasuki_index")
    with psycopg.connect(dsn) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table} WHERE uuid::text = %s", (uuid,)).fetchone()[0]  # type: ignore[index]  # noqa: S608
            for table in tables
        }


def test_a_pass_on_one_host_forgets_every_hosts_old_contexts_and_spares_running_and_young_ones(
    host: HostFactory, fleet_dsn: str, tmp_path: Path
) -> None:
    a, b = host("a", indexed=True), host("b", indexed=True)
    old_a, old_b, young_b = finished(a), finished(b), finished(b)
    with psycopg.connect(fleet_dsn) as conn:  # a checkpoint a holder recorded: forgotten with its context
        conn.execute("INSERT INTO tasuki_checkpoints (uuid, epoch, head) VALUES (%s, 1, 'abc')", (old_b.uuid,))
    for store, ctx in ((a, old_a), (b, old_b)):
        age(store, ctx.uuid, fleet_dsn, 40)
    age(b, young_b.uuid, fleet_dsn, 10)
    running = b.create(TASK_KEY, CONFIG, user="bob", heartbeat=False)
    one_step(running, "still on b")
    with psycopg.connect(fleet_dsn) as conn:  # a running task's copy untouched for 40 days is still not finished
        conn.execute(
            "UPDATE tasuki_contexts SET updated_at = now() - interval '40 days' WHERE uuid = %s", (running.uuid,)
        )
    before = {ctx.uuid: kept(fleet_dsn, ctx.uuid) for ctx in (old_a, old_b, young_b, running)}
    assert before[old_b.uuid] == {
        "tasuki_contexts": 1,
        "tasuki_records": 4,
        "tasuki_leases": 1,
        "tasuki_checkpoints": 1,
        "tasuki_index": 1,
    }

    dry = apply_retention(a, utc_now(), GZIP_DAYS, DELETE_DAYS, dry_run=True)
    assert {(x.uuid, x.action) for x in dry} == {(old_a.uuid, "delete"), (old_b.uuid, "forget")}
    assert {ctx.uuid: kept(fleet_dsn, ctx.uuid) for ctx in (old_a, old_b, young_b, running)} == before
    listed = host_cli(a.base_dir, fleet_dsn, "retention", "--dry-run")
    assert listed.returncode == 0, listed.stderr
    assert f"{old_b.uuid}  would forget  (completed " in listed.stdout
    assert f"{old_a.uuid}  would delete  (completed " in listed.stdout
    assert young_b.uuid not in listed.stdout
    assert running.uuid not in listed.stdout
    assert a.completed_path(old_a.uuid).is_dir()
    assert a.durable.knows(old_b.uuid)

    done = apply_retention(a, utc_now(), GZIP_DAYS, DELETE_DAYS)

    assert {(x.uuid, x.action) for x in done} == {(old_a.uuid, "delete"), (old_b.uuid, "forget")}
    nothing = dict.fromkeys(before[old_b.uuid], 0)
    assert kept(fleet_dsn, old_a.uuid) == nothing  # deleted here: directory, durable copy and row
    assert kept(fleet_dsn, old_b.uuid) == nothing  # b's: its copy and its row, from a
    assert not a.completed_path(old_a.uuid).exists()
    assert b.completed_path(old_b.uuid).is_dir()  # b's directory is b's own pass's to delete
    assert kept(fleet_dsn, young_b.uuid) == before[young_b.uuid]
    assert kept(fleet_dsn, running.uuid) == before[running.uuid]
    one_step(running, "its holder goes on committing")
    running.finish("completed")
    assert a.durable.committed(running.uuid).state["status"] == "completed"  # type: ignore[union-attr]

    elsewhere = tmp_path / "c" / "contexts"
    elsewhere.mkdir(parents=True)
    for base, uuid in ((a.base_dir, old_b.uuid), (elsewhere, old_b.uuid), (elsewhere, old_a.uuid)):
        unknown = one_line_error(host_cli(base, fleet_dsn, "context", "show", UNKNOWN), 1)
        assert unknown.startswith(f"tasuki: error: no context {UNKNOWN}")
        assert one_line_error(host_cli(base, fleet_dsn, "context", "show", uuid), 1) == unknown.replace(UNKNOWN, uuid)

    on_b = apply_retention(b, utc_now(), GZIP_DAYS, DELETE_DAYS)  # b's own pass: its directories by age
    assert {(x.uuid, x.action) for x in on_b} == {(old_b.uuid, "delete"), (young_b.uuid, "gzip")}
    assert not b.completed_path(old_b.uuid).exists()
    gone = one_line_error(host_cli(b.base_dir, fleet_dsn, "context", "show", old_b.uuid), 1)
    assert gone.startswith(f"tasuki: error: no context {old_b.uuid}")
    assert apply_retention(a, utc_now(), GZIP_DAYS, DELETE_DAYS) == []  # nothing left to do


def test_the_durable_copy_refuses_to_forget_a_task_not_finished(host: HostFactory, fleet_dsn: str) -> None:
    a = host("a")
    running = a.create(TASK_KEY, CONFIG, user="bob", heartbeat=False)
    one_step(running, "on a")
    before = kept(fleet_dsn, running.uuid)
    assert host("b").durable.forget(running.uuid) is False
    assert kept(fleet_dsn, running.uuid) == before
    one_step(running, "its holder's lease and lines are intact")
    running.finish("completed")
    assert a.durable.forget(running.uuid) is True
    assert kept(fleet_dsn, running.uuid)["tasuki_contexts"] == 0
    assert a.durable.forget(running.uuid) is True  # forgotten before: nothing to do


def test_a_copy_not_forgotten_while_the_store_was_out_of_reach_goes_on_the_next_pass(
    host: HostFactory, fleet_dsn: str
) -> None:
    a = host("a", indexed=True)
    old = finished(a)
    age(a, old.uuid, fleet_dsn, 40)
    with socket.socket() as probe:  # a port nothing listens on: the database out of reach
        probe.bind(("127.0.0.1", 0))
        nowhere = f"postgresql://postgres@127.0.0.1:{probe.getsockname()[1]}/tasuki"
    cut_off = FleetStore(nowhere, connect_timeout_s=1, open=False)
    try:
        alone = ContextStore(a.base_dir, hostname="host-a", fsync="never", durable=PostgresCopy(cut_off))
        done = apply_retention(alone, utc_now(), GZIP_DAYS, DELETE_DAYS)
    finally:
        cut_off.close()
    assert [(x.uuid, x.action) for x in done] == [(old.uuid, "delete")]
    assert not a.completed_path(old.uuid).exists()  # the host's disk is freed all the same
    assert kept(fleet_dsn, old.uuid)["tasuki_contexts"] == 1
    assert a.durable.knows(old.uuid)

    again = apply_retention(a, utc_now(), GZIP_DAYS, DELETE_DAYS)
    assert [(x.uuid, x.action) for x in again] == [(old.uuid, "forget")]
    assert kept(fleet_dsn, old.uuid) == dict.fromkeys(kept(fleet_dsn, old.uuid), 0)
