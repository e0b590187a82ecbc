"""The durable copy of every context in PostgreSQL (SPEC §12, issue 27): committed per step under the writer's lease
epoch, rebuilt on another host with the same files and schemas (SPEC §3), and nothing from a fenced writer.

Two "hosts" are two context stores with their own directories and hostnames on one real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import redis

from contexts.compression import CompressionPolicy
from contexts.durable import ONE_HOST
from contexts.errors import ContextCompletedError, FencedError, LockHeldError
from contexts.names import JSONL_FILES
from contexts.state import read_state
from contexts.store import ContextStore
from fleet import lease
from fleet.durable import PostgresCopy
from fleet.errors import FleetUnavailable
from fleet.store import FleetStore
from scheduler.monitor import Monitor
from scheduler.plan import Policy
from scheduler.reconcile import reconcile
from tests.helpers.context_support import CONFIG, TASK_KEY, wait_for
from tests.helpers.fleet_hosts import HostFactory, committed_state, lease_expired, one_step, waiting_for_a_lock
from tests.helpers.postgres import PostgresServer
from tests.helpers.schemas import validate_context_dir
from worker.names import HEARTBEATS_KEY
from worker.settings import Settings
from worker.stores import open_store


def rows(dsn: str, uuid: str) -> list[tuple[str, int, int, str]]:
    """(file, id, epoch, role-or-tool) of every line the database has of the context."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT file, id, epoch, coalesce(line->>'content', line->>'tool_name', line->>'summary') "
            "FROM tasuki_records WHERE uuid = %s ORDER BY file, id",
            (uuid,),
        ).fetchall()
    return [(str(f), int(i), int(e), str(c)) for f, i, e, c in found]


def test_lines_reach_postgresql_only_at_the_step_commit(host: HostFactory, fleet_dsn: str) -> None:
    first = host("a")
    ctx = first.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "You are Tasuki.")
    ctx.append_message("user", "Fix the bug.")
    assert rows(fleet_dsn, ctx.uuid) == []  # staged, not yet committed
    ctx.step_done(write_state=False)
    assert [r[:3] for r in rows(fleet_dsn, ctx.uuid)] == [("messages.jsonl", 1, 1), ("messages.jsonl", 2, 1)]
    one_step(ctx, "Let me look.")
    assert committed_state(fleet_dsn, ctx.uuid)["llm_call_count"] == 1
    assert committed_state(fleet_dsn, ctx.uuid) == read_state(ctx.home)
    ctx.detach()


def test_a_finished_context_rebuilds_on_another_host_byte_for_byte(
    host: HostFactory, fleet_dsn: str, tmp_path: Path
) -> None:
    store = host("a")
    ctx = store.create(TASK_KEY, CONFIG, user="alice", heartbeat=False)
    ctx.append_message("system", "You are Tasuki.")
    ctx.append_message("user", "Fix the bug; my key is sk-abcdefghijklmnopqrstuvwx.")
    for n in range(8):
        one_step(ctx, f"step {n}: ünïcode ✓")
    assert ctx.compress(lambda previous, span: f"summary of {len(span)} messages", CompressionPolicy(keep_recent=3))
    done = ctx.finish("completed")
    rebuilt = tmp_path / "elsewhere" / ctx.uuid
    PostgresCopy(FleetStore(fleet_dsn)).rebuild(ctx.uuid, rebuilt)
    counts = validate_context_dir(rebuilt)
    assert counts == {"messages.jsonl": 18, "summaries.jsonl": 1, "tools.jsonl": 8}
    for name in JSONL_FILES:
        assert (rebuilt / name).read_bytes() == (done / name).read_bytes()
    assert read_state(rebuilt) == read_state(done)
    assert read_state(rebuilt)["status"] == "completed"
    assert "sk-abcdef" not in (rebuilt / "messages.jsonl").read_text()  # masked before it left the host
    assert {oct(p.stat().st_mode & 0o777) for p in rebuilt.iterdir()} == {"0o600"}
    assert oct(rebuilt.stat().st_mode & 0o777) == "0o700"
    with pytest.raises(ContextCompletedError):
        host("b").open(ctx.uuid, heartbeat=False)


def test_a_fenced_writer_raises_and_nothing_of_it_reaches_postgresql(host: HostFactory, fleet_dsn: str) -> None:
    a_store, b_store = host("a", lease_s=0.5), host("b")
    a = a_store.create(TASK_KEY, CONFIG, heartbeat=False)
    a.append_message("user", "Fix the bug.")
    one_step(a, "from a, committed")
    with pytest.raises(LockHeldError):
        b_store.open(a.uuid, heartbeat=False)  # a's lease is live: b waits
    wait_for(lambda: lease_expired(fleet_dsn, a.uuid), timeout=30, what="a's lease to expire by the database")

    b = b_store.open(a.uuid, heartbeat=False)  # host b never had the directory: rebuilt from the durable copy
    assert [m["content"] for m in b.messages()] == ["Fix the bug.", "from a, committed", "README.md"]
    assert read_state(b.home)["attempt"] == 2
    one_step(b, "from b")

    a.append_message("assistant", "from a, after the takeover")  # a does not know yet: its own disk only
    with pytest.raises(FencedError):
        a.step_done()  # the commit point finds another epoch: nothing of the step is written
    with pytest.raises(FencedError):
        a.append_message("assistant", "from a, once more")
    with pytest.raises(FencedError):
        a.update_state(status="failed")

    one_step(b, "from b again")
    b.finish("completed")
    contents = [r[3] for r in rows(fleet_dsn, a.uuid) if r[0] == "messages.jsonl"]
    assert not any(text.startswith("from a, after") or text.startswith("from a, once") for text in contents)
    assert [r[2] for r in rows(fleet_dsn, a.uuid) if r[0] == "messages.jsonl"] == [1, 1, 1, 2, 2, 2, 2]
    assert committed_state(fleet_dsn, a.uuid)["status"] == "completed"
    assert committed_state(fleet_dsn, a.uuid)["worker"] == b_store.holder


def test_a_heartbeat_that_finds_its_lease_taken_fences_the_next_append(host: HostFactory, fleet_dsn: str) -> None:
    a_store, b_store = host("a", lease_s=0.5), host("b")
    a = a_store.create(TASK_KEY, CONFIG, heartbeat=False)
    one_step(a, "from a")
    wait_for(lambda: lease_expired(fleet_dsn, a.uuid), timeout=30, what="a's lease to expire by the database")
    b = b_store.open(a.uuid, heartbeat=False)
    with pytest.raises(FencedError):
        a.beat()  # the renewal finds epoch 2
    with pytest.raises(FencedError):
        a.append_message("assistant", "from a, fenced")  # refused before it touches even a's own disk
    assert all(r[3] != "from a, fenced" for r in rows(fleet_dsn, a.uuid))
    assert "from a, fenced" not in (a.home / "messages.jsonl").read_text()
    b.detach()


def test_a_host_that_held_the_task_before_resumes_from_what_another_host_committed(
    host: HostFactory, fleet_dsn: str
) -> None:
    a_store, b_store = host("a", lease_s=0.5), host("b", lease_s=0.5)
    a = a_store.create(TASK_KEY, CONFIG, heartbeat=False)
    one_step(a, "from a")
    a.append_message("assistant", "from a, never committed")  # a dies mid-step
    a.detach()
    wait_for(lambda: lease_expired(fleet_dsn, a.uuid), timeout=30, what="a's lease to expire by the database")
    b = b_store.open(a.uuid, heartbeat=False)
    one_step(b, "from b")
    b.release()  # handed back (a warm shutdown): the lease is free at once

    # Host a again, as a new worker process would be: its dead holder's .lock is stale to it (here: the same live
    # test process, so "silent for a millisecond" stands for "gone").
    a_store = host("a", lease_s=0.5, stale_after_s=0.001, hung_after_s=0.001)
    again = a_store.open(a.uuid, heartbeat=False)  # a's directory is behind: rebuilt from the durable copy
    contents = [m["content"] for m in again.messages()]
    assert contents == ["from a", "README.md", "from b", "README.md"]
    one_step(again, "from a again")
    assert [r[1] for r in rows(fleet_dsn, a.uuid) if r[0] == "messages.jsonl"] == list(range(1, 7))
    assert read_state(again.home)["attempt"] == 3
    again.finish("completed")
    validate_context_dir(a_store.completed_path(a.uuid))


def test_a_commit_in_flight_holds_off_a_taker_until_it_lands(host: HostFactory, fleet_dsn: str) -> None:
    """The share lock on the lease row: a takeover cannot slip between a writer's check and its commit."""
    a_store = host("a", lease_s=0.5)
    a = a_store.create(TASK_KEY, CONFIG, heartbeat=False)
    one_step(a, "from a")
    wait_for(lambda: lease_expired(fleet_dsn, a.uuid), timeout=30, what="a's lease to expire by the database")
    with psycopg.connect(fleet_dsn) as in_flight:  # a's next commit, paused after its conditional insert
        inserted = in_flight.execute(
            "INSERT INTO tasuki_records (uuid, file, id, epoch, line) SELECT %(u)s, 'messages.jsonl', 3, 1, "
            '\'{"seq":3,"role":"assistant","content":"in flight"}\' WHERE EXISTS (SELECT 1 FROM tasuki_leases '
            "WHERE uuid = %(u)s AND epoch = 1 FOR SHARE)",
            {"u": a.uuid},
        ).rowcount
        assert inserted == 1
        taken: list[int | None] = []
        taker = threading.Thread(target=lambda: taken.append(FleetStore(fleet_dsn).take(a.uuid, "host-b:1")))
        taker.start()
        wait_for(lambda: waiting_for_a_lock(fleet_dsn), timeout=30, what="the taker to wait for the commit")
        assert taken == []
        in_flight.commit()
    taker.join(timeout=30)
    assert taken == [2]
    assert [r[3] for r in rows(fleet_dsn, a.uuid) if r[0] == "messages.jsonl"][-1] == "in flight"
    a.detach()


def test_open_store_picks_the_durable_copy_by_the_urls_scheme(
    make_settings: Callable[..., Settings], fleet_dsn: str
) -> None:
    assert open_store(make_settings(), must_exist=False).durable is ONE_HOST
    fleet = open_store(make_settings({"TASUKI__FLEET__STORE": fleet_dsn}), must_exist=False)
    assert isinstance(fleet.durable, PostgresCopy)
    ctx = fleet.create(TASK_KEY, CONFIG, heartbeat=False)
    assert fleet.durable.knows(ctx.uuid)
    ctx.detach()


def test_an_unreachable_store_is_one_line_when_a_task_starts_and_leaves_nothing_behind(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(
        {"TASUKI__FLEET__STORE": "postgresql://tasuki:pw@127.0.0.1:1/tasuki", "TASUKI__FLEET__CONNECT_TIMEOUT_S": "1"}
    )
    store = open_store(settings, must_exist=False)  # readers never wait for the fleet's store
    assert store.running_uuids() == []
    with pytest.raises(FleetUnavailable) as caught:
        store.create(TASK_KEY, CONFIG, heartbeat=False)
    assert "\n" not in str(caught.value)
    assert ":pw@" not in str(caught.value)
    assert store.running_uuids() == []
    assert list((store.base_dir / ".staging").iterdir()) == []


def lease_expires_at(dsn: str, uuid: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT expires_at FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    assert row is not None
    return row[0]


def test_the_heartbeat_keeps_a_live_holders_lease_and_fences_it_once_another_host_took_it(
    host: HostFactory, fleet_dsn: str
) -> None:
    a_store = host("a", lease_s=5, heartbeat_interval_s=0.2)
    a = a_store.create(TASK_KEY, CONFIG)  # its heartbeat thread renews the lease every 0.2 s
    try:
        first = lease_expires_at(fleet_dsn, a.uuid)
        wait_for(lambda: lease_expires_at(fleet_dsn, a.uuid) != first, timeout=30, what="a renewal")
        with pytest.raises(LockHeldError):
            host("b").open(a.uuid, heartbeat=False)
        # Another host takes the task as if a's lease had run out (a paused past it, say): expired and taken in one
        # transaction, so a's heartbeat cannot renew in between.
        with psycopg.connect(fleet_dsn) as conn:
            conn.execute("UPDATE tasuki_leases SET expires_at = now() - interval '1 second' WHERE uuid = %s", (a.uuid,))
            assert lease.take(conn, a.uuid, "host-b:1", 60) == 2
        wait_for(lambda: a.fenced, timeout=30, what="a's heartbeat to find the lease taken")
        with pytest.raises(FencedError):
            a.append_message("assistant", "from a, fenced by its heartbeat")
        assert "from a, fenced" not in (a.home / "messages.jsonl").read_text()
    finally:
        a.detach()


def test_a_commit_sent_again_after_its_answer_was_lost_lands_once(fleet_dsn: str) -> None:
    with FleetStore(fleet_dsn) as fleet:
        writer = PostgresCopy(fleet).create(
            "6f1c3f5e-8a0e-4c1e-9a53-2f4d1c0b7a11", "host-a:1", {"uuid": "x"}, {"status": "initializing"}
        )
        line = '{"seq":1,"role":"user","content":"Fix the bug."}'
        writer.record("messages.jsonl", 1, line)
        writer.commit({"status": "processing"})
        writer.record("messages.jsonl", 1, line)  # the same batch again: its first commit landed, its answer did not
        writer.commit({"status": "processing"})
        assert rows(fleet_dsn, writer.uuid) == [("messages.jsonl", 1, 1, "Fix the bug.")]
        writer.record("messages.jsonl", 1, '{"seq":1,"role":"user","content":"something else"}')
        with pytest.raises(FencedError):
            writer.commit(None)  # another text at a seq that has one: this writer's numbering went astray; it stops
        assert rows(fleet_dsn, writer.uuid) == [("messages.jsonl", 1, 1, "Fix the bug.")]


def test_a_commit_waits_for_a_restarting_database_and_lands_once(private_postgres: PostgresServer) -> None:
    dsn = private_postgres.dsn(private_postgres.create_database())
    with FleetStore(dsn, connect_timeout_s=1, lease_s=120) as fleet:
        writer = PostgresCopy(fleet).create(
            "0b7d0c55-4a0b-4f44-8f5e-5e6c2f1f9d21", "host-a:1", {"uuid": "x"}, {"status": "initializing"}
        )
        writer.record("messages.jsonl", 1, '{"seq":1,"role":"user","content":"Fix the bug."}')
        private_postgres.stop()
        errors: list[BaseException] = []

        def commit() -> None:
            try:
                writer.commit({"status": "processing"})
            except BaseException as exc:
                errors.append(exc)

        committing = threading.Thread(target=commit)
        committing.start()
        wait_for(lambda: writer.retries > 0, timeout=60, what="a commit that found the database gone")
        private_postgres.start()
        committing.join(timeout=120)
        assert errors == []
        assert rows(dsn, writer.uuid) == [("messages.jsonl", 1, 1, "Fix the bug.")]
        assert committed_state(dsn, writer.uuid)["status"] == "processing"


def test_the_hosts_heartbeat_goes_on_while_the_database_is_out_of_reach(
    private_postgres: PostgresServer, tmp_path: Path
) -> None:
    dsn = private_postgres.dsn(private_postgres.create_database())
    with FleetStore(dsn, connect_timeout_s=1, lease_s=120) as fleet:
        store = ContextStore(
            tmp_path / "contexts",
            hostname="host-a",
            fsync="never",
            heartbeat_interval_s=0.2,
            durable=PostgresCopy(fleet),
        )
        ctx = store.create(TASK_KEY, CONFIG)
        try:
            private_postgres.stop()
            lock = store.read_lock(ctx.uuid)
            assert lock is not None
            stopped_at = lock.heartbeat_at
            wait_for(
                lambda: (store.read_lock(ctx.uuid) or lock).heartbeat_at > stopped_at,
                timeout=30,
                what="the host's lock refreshed with the database down",
            )
            assert not ctx.fenced
            private_postgres.start()
            renewed_from = lease_expires_at(dsn, ctx.uuid)
            wait_for(
                lambda: lease_expires_at(dsn, ctx.uuid) != renewed_from, timeout=30, what="the lease renewed again"
            )
            one_step(ctx, "after the database came back")
            assert any(r[3] == "after the database came back" for r in rows(dsn, ctx.uuid))
        finally:
            ctx.detach()


def test_another_hosts_monitor_judges_a_task_by_its_lease_and_keeps_it_in_the_heartbeat_index(
    host: HostFactory, fleet_dsn: str, redis_client: redis.Redis
) -> None:
    """The monitor and reconciliation of a host without the context's directory (tests/test_fleet_hosts.py has
    the whole fleet): a live lease is skipped however stale the heartbeat index says it is, an expired one is
    re-enqueued with the request from the durable copy, and the index entry stays until then; a UUID nobody
    knows is unindexed."""
    request = {"task_key": TASK_KEY, "prompt": "the task"}
    first = host("a")
    ctx = first.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": request})
    ctx.step_done()
    other, sent = host("b"), []
    monitor = Monitor(
        other,
        redis_client,
        Policy(stale_after_s=3, max_attempts=3, resume=True, hostname="host-b"),
        send=lambda uuid, body: sent.append((uuid, body)),
        ended=lambda *_: None,
    )
    nobody = "0b0e0a4c-0000-4000-8000-000000000000"
    redis_client.zadd(HEARTBEATS_KEY, {ctx.uuid: 1.0, nobody: 1.0})
    later = datetime.now(UTC) + timedelta(seconds=60)

    [outcome] = [o for o in monitor.run(later) if o.action.uuid == ctx.uuid]
    reconcile(other, redis_client, None, later, quiet_s=3)
    assert (outcome.action.kind, outcome.action.reason) == ("skip", f"held by a live worker (lease {first.holder}#1)")
    assert redis_client.zscore(HEARTBEATS_KEY, ctx.uuid) is not None
    assert redis_client.zscore(HEARTBEATS_KEY, nobody) is None
    with psycopg.connect(fleet_dsn) as conn:  # the holder died: its lease ran out by the database's clock
        conn.execute("UPDATE tasuki_leases SET expires_at = now() - interval '1 second'")
    [resumed] = monitor.run(later)
    assert (resumed.action.kind, resumed.done, resumed.action.owner) == ("resume", True, f"{first.holder}#1")
    assert sent == [(ctx.uuid, request)]
