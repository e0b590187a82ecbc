"""Ownership across hosts (SPEC §12, issue 27): a lease row per task with an epoch fencing token, on a real
PostgreSQL; expiry is the database's clock, never a worker's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid as uuid_module
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fleet import schema
from fleet.errors import FleetUnavailable
from fleet.store import FleetStore
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import wait_for

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fleet(fleet_dsn: str) -> Iterator[FleetStore]:
    with FleetStore(fleet_dsn, lease_s=60) as store:
        yield store


def new_uuid() -> str:
    return str(uuid_module.uuid4())


def expired_by_the_database(store: FleetStore, uuid: str) -> bool:
    row = store.lease(uuid)
    return row is not None and row.expired


def test_a_free_task_is_taken_once_and_its_holder_alone_renews_it(fleet: FleetStore) -> None:
    task = new_uuid()
    assert fleet.take(task, "host-a:1") == 1
    assert fleet.take(task, "host-b:2") is None  # live: not taken again, by anyone
    assert fleet.renew(task, 1, "host-a:1")
    assert not fleet.renew(task, 1, "host-b:2")
    assert not fleet.renew(task, 2, "host-a:1")
    row = fleet.lease(task)
    assert row is not None
    assert (row.epoch, row.holder, row.expired) == (1, "host-a:1", False)


def test_a_released_lease_is_taken_at_once_with_a_new_epoch_that_fences_the_old_holder(fleet: FleetStore) -> None:
    task = new_uuid()
    assert fleet.take(task, "host-a:1") == 1
    assert fleet.release(task, 1, "host-a:1")
    assert not fleet.release(task, 1, "host-a:1")  # released once
    assert fleet.take(task, "host-b:2") == 2
    assert not fleet.renew(task, 1, "host-a:1")  # fenced: its epoch is gone for good
    assert not fleet.release(task, 1, "host-a:1")
    assert fleet.renew(task, 2, "host-b:2")


def test_an_expired_lease_is_taken_over_and_its_holder_can_no_longer_renew(fleet: FleetStore) -> None:
    task = new_uuid()
    assert fleet.take(task, "host-a:1", lease_s=0.5) == 1
    wait_for(lambda: expired_by_the_database(fleet, task), timeout=30, what="the lease to expire by the database")
    assert fleet.take(task, "host-b:2") == 2
    assert not fleet.renew(task, 1, "host-a:1")


def test_an_expired_lease_renewed_before_anyone_took_it_stays_with_its_holder(fleet: FleetStore) -> None:
    """Expiry only allows a takeover; the epoch, not the clock, is what fences."""
    task = new_uuid()
    assert fleet.take(task, "host-a:1", lease_s=0.5) == 1
    wait_for(lambda: expired_by_the_database(fleet, task), timeout=30, what="the lease to expire by the database")
    assert fleet.renew(task, 1, "host-a:1")
    assert fleet.take(task, "host-b:2") is None


def test_a_holder_gone_silent_inside_a_renewal_keeps_its_taker_out_for_one_lease_at_most(fleet_dsn: str) -> None:
    """A renewal whose COMMIT never comes (its host cut off once the UPDATE reached the server) holds the lease's row
    lock; the server ends the session once it has idled in its transaction for the holder's ``lease_s``, the renewal
    is rolled back, and the taker goes on (before, the session and its lock stayed until the server's keepalives
    gave up, hours later, and no host could take the task)."""
    task = new_uuid()
    with FleetStore(fleet_dsn, lease_s=1) as holder, FleetStore(fleet_dsn, lease_s=60) as taker:
        assert holder.take(task, "host-a:1", lease_s=0.1) == 1
        wait_for(lambda: expired_by_the_database(taker, task), timeout=30, what="the lease to expire by the database")
        taken: list[int | None] = []
        with pytest.raises(FleetUnavailable):  # its COMMIT, at last, finds the session ended
            take_while_a_renewal_waits_for_its_commit(holder, taker, task, taken)
        assert taken == [2]
        assert not holder.renew(task, 1, "host-a:1")  # its renewal never landed, and its epoch is gone


def take_while_a_renewal_waits_for_its_commit(
    holder: FleetStore, taker: FleetStore, task: str, taken: list[int | None]
) -> None:
    """The holder's renewal of epoch 1, uncommitted while another host tries to take the task."""
    with holder.connection() as conn:
        renewal = "UPDATE tasuki_leases SET expires_at = now() + interval '1 hour' WHERE uuid = %s AND epoch = 1"
        conn.execute(renewal, (task,))
        thread = threading.Thread(target=lambda: taken.append(taker.take(task, "host-b:2")))
        thread.start()
        thread.join(timeout=60)  # the server ends the holder's session after lease_s; the taker is let in


def test_concurrent_takers_get_one_winner_per_round_and_epochs_that_only_grow(fleet_dsn: str) -> None:
    task, takers, rounds = new_uuid(), 6, 15
    stores = [FleetStore(fleet_dsn) for _ in range(takers)]
    barrier = threading.Barrier(takers)
    won: list[list[tuple[int, int]]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []

    def taker(index: int) -> None:
        try:
            for round_ in range(rounds):
                barrier.wait(timeout=60)
                epoch = stores[index].take(task, f"host-{index}:1")
                if epoch is not None:
                    won[round_].append((index, epoch))
                barrier.wait(timeout=60)  # every taker tried before the winner lets go
                if epoch is not None:
                    assert stores[index].release(task, epoch, f"host-{index}:1")
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(takers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for store in stores:
            store.close()
    assert errors == []
    assert [len(winners) for winners in won] == [1] * rounds
    assert [winners[0][1] for winners in won] == list(range(1, rounds + 1))


def faketime_taker(offset: str, dsn: str, task: str, holder: str, lease_s: float) -> dict[str, float | None]:
    """Take the lease from a process whose wall clock is ``offset`` off (``faketime -f '+10m'``)."""
    if shutil.which("faketime") is None:
        cannot_run("faketime is not installed (apt-get install faketime)")
    done = subprocess.run(
        ["faketime", "-f", offset, sys.executable, "-m", "tests.helpers.fleet_taker", dsn, task, holder, str(lease_s)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, float | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def database_now(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def test_a_taker_whose_clock_is_ten_minutes_ahead_cannot_take_a_live_lease(fleet: FleetStore, fleet_dsn: str) -> None:
    task = new_uuid()
    assert fleet.take(task, "host-a:1", lease_s=60) == 1
    ahead = faketime_taker("+10m", fleet_dsn, task, "host-ahead:1", 60)
    assert float(ahead["clock"] or 0) - database_now(fleet_dsn) > 500  # its clock really was ahead
    assert ahead["epoch"] is None  # by its own clock the lease expired minutes ago; by the database's, it is live
    assert fleet.renew(task, 1, "host-a:1")


def test_a_taker_whose_clock_is_ten_minutes_behind_takes_a_lease_the_database_saw_expire(
    fleet: FleetStore, fleet_dsn: str
) -> None:
    task = new_uuid()
    assert fleet.take(task, "host-a:1", lease_s=0.5) == 1
    wait_for(lambda: expired_by_the_database(fleet, task), timeout=30, what="the lease to expire by the database")
    behind = faketime_taker("-10m", fleet_dsn, task, "host-behind:1", 60)
    assert database_now(fleet_dsn) - float(behind["clock"] or 0) > 500  # its clock really was behind
    assert behind["epoch"] == 2
    assert not fleet.renew(task, 1, "host-a:1")


def test_opening_migrates_once_and_a_second_open_finds_the_schema_current(fleet_dsn: str) -> None:
    with FleetStore(fleet_dsn), FleetStore(fleet_dsn), psycopg.connect(fleet_dsn) as conn:
        versions = conn.execute("SELECT version FROM tasuki_schema ORDER BY version").fetchall()
        assert schema.migrate(conn) == schema.LATEST
    assert [row[0] for row in versions] == list(range(1, schema.LATEST + 1))


def test_a_schema_newer_than_this_tasuki_is_refused_in_one_line(fleet_dsn: str) -> None:
    with FleetStore(fleet_dsn), psycopg.connect(fleet_dsn) as conn:
        conn.execute("INSERT INTO tasuki_schema (version) VALUES (%s)", (schema.LATEST + 1,))
    with pytest.raises(Exception, match=r"newer than this Tasuki's") as caught:
        FleetStore(fleet_dsn)
    assert "\n" not in str(caught.value)


def test_an_unreachable_store_is_one_line_naming_it_without_its_password() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"postgresql://postgres:hunter2@127.0.0.1:{probe.getsockname()[1]}/tasuki"
    with pytest.raises(FleetUnavailable) as caught:
        FleetStore(url, connect_timeout_s=1)
    message = str(caught.value)
    assert "unreachable" in message
    assert "hunter2" not in message
    assert "\n" not in message
