"""A real worker in fleet mode (SPEC §12, issue 27): a task run by a Celery worker process with ``fleet.store`` set
leaves its durable copy in PostgreSQL, line for line what the host's directory holds, and its memory there too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from fleet.durable import PostgresCopy
from fleet.store import FleetStore
from tests.helpers.celery_worker import WorkerProcess
from tests.helpers.model_server import model_server
from tests.helpers.postgres import PostgresServer
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, fix_calc_trajectory, local_request, make_buggy_repo

pytestmark = pytest.mark.integration


def lease_of(dsn: str, uuid: str) -> tuple[int, str | None] | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT epoch, holder FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    return None if row is None else (int(row[0]), row[1])


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: object, fleet_dsn: str) -> Iterator[Stack]:
    with model_server(fix_calc_trajectory()) as server:
        s = Stack(tmp_path, redis_url, server.url, {"TASUKI__FLEET__STORE": fleet_dsn})
        try:
            yield s
        finally:
            s.stop()


def test_a_task_run_in_fleet_mode_is_in_postgresql_as_on_the_hosts_disk(
    stack: Stack, tmp_path: Path, fleet_dsn: str
) -> None:
    stack.start_worker("w1")
    uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
    state = stack.wait_finished(uuid)
    assert state["status"] == "completed", state

    # Taken once, released at the end (the release follows the move to completed/: waited for, not raced).
    assert stack.wait_until(lambda: lease_of(fleet_dsn, uuid) == (1, None) or None, what="the lease released")
    with psycopg.connect(fleet_dsn) as conn:  # the index row is the fleet's too (fleet/index.py)
        row = conn.execute("SELECT location, status FROM tasuki_index WHERE uuid = %s", (uuid,)).fetchone()
    assert row == ("completed", "completed")
    assert not (stack.contexts_dir / "index.sqlite3").exists()  # no host index in fleet mode
    rebuilt = tmp_path / "rebuilt" / uuid
    with FleetStore(fleet_dsn) as fleet:
        PostgresCopy(fleet).rebuild(uuid, rebuilt)
    validate_context_dir(rebuilt)
    completed = stack.contexts_dir / "completed" / uuid
    for name in ("messages.jsonl", "tools.jsonl", "summaries.jsonl"):
        assert (rebuilt / name).read_bytes() == (completed / name).read_bytes(), name
    assert json.loads((rebuilt / "state.json").read_text()) == json.loads((completed / "state.json").read_text())
    assert json.loads((rebuilt / "metadata.json").read_text()) == json.loads((completed / "metadata.json").read_text())


def test_a_task_whose_fleet_store_is_out_of_reach_at_start_waits_in_the_queue_and_runs_once_it_is_back(
    tmp_path: Path, redis_url: str, redis_client: object, private_postgres: PostgresServer
) -> None:
    dsn = private_postgres.dsn(private_postgres.create_database())
    private_postgres.stop()
    overrides = {
        "TASUKI__FLEET__STORE": dsn,
        "TASUKI__FLEET__CONNECT_TIMEOUT_S": "1",
        "TASUKI__MONITOR__INTERVAL_S": "1",
    }
    with model_server(fix_calc_trajectory()) as server:
        stack = Stack(tmp_path, redis_url, server.url, overrides)
        try:
            worker = stack.start_worker("w1")
            uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
            deferred = "delivery deferred: the fleet's store is out of reach"
            stack.wait_until(lambda: worker.log_text().count(deferred) >= 2, what="the delivery deferred twice")
            assert not (stack.contexts_dir / "running" / uuid).exists()  # nothing taken, nothing written
            assert only_deferrals_traced(worker.log_text())

            private_postgres.start()
            state = stack.wait_finished(uuid)
            assert state["status"] == "completed", state
            assert state["attempt"] == 1  # the deferrals took no attempt: none was lost
            assert stack.wait_until(lambda: lease_of(dsn, uuid) == (1, None) or None, what="the lease released")
        finally:
            stack.stop()


@contextmanager
def outage_mid_task(
    tmp_path: Path, redis_url: str, postgres: PostgresServer, **overrides: str
) -> Iterator[tuple[Stack, WorkerProcess, str, str]]:
    """A real worker's task in fleet mode held at its second answer; the database stopped, then the answer let through,
    so that the step's commit finds no database. Yields the stack, the worker, the task's UUID and the database URL."""
    dsn = postgres.dsn(postgres.create_database())
    trajectory = fix_calc_trajectory()
    trajectory.insert(1, {"gate": "outage"})  # the second answer waits until the database is down
    with model_server(trajectory) as server:
        stack = Stack(tmp_path, redis_url, server.url,
                      {"TASUKI__FLEET__STORE": dsn, "TASUKI__FLEET__CONNECT_TIMEOUT_S": "1", **overrides})  # fmt: skip
        try:
            worker = stack.start_worker("w1")
            uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
            stack.wait_until(lambda: server.model.gate_reached("outage"), what="the task at its second answer")
            postgres.stop()
            server.model.open_gate("outage")
            yield stack, worker, uuid, dsn
        finally:
            stack.stop()


def only_deferrals_traced(log: str) -> bool:
    """Every traceback in a worker's ``log`` is Celery's record of a deferred delivery (no error reached the user)."""
    tracebacks = [line for line in log.splitlines() if "Traceback" in line]
    return all("Ignore('delivery deferred')" in line for line in tracebacks)


def test_a_store_out_of_reach_for_a_whole_lease_mid_task_hands_the_task_back_and_it_resumes_once_it_is_back(
    tmp_path: Path, redis_url: str, redis_client: object, private_postgres: PostgresServer
) -> None:
    overrides = {"TASUKI__FLEET__LEASE_S": "2", "TASUKI__MONITOR__INTERVAL_S": "1"}
    with outage_mid_task(tmp_path, redis_url, private_postgres, **overrides) as (stack, worker, uuid, dsn):
        # The step's commit finds no database for longer than the lease.
        handed = "the fleet's store was out of reach for the lease; the task is handed back"
        stack.wait_until(lambda: handed in worker.log_text(), what="the task handed back")
        lock = stack.contexts_dir / "running" / uuid / ".lock"
        stack.wait_until(lambda: not lock.exists(), what="the host's lock freed")  # none takes it: no database

        private_postgres.start()
        state = stack.wait_finished(uuid)
        assert state["status"] == "completed", state
        assert stack.wait_until(lambda: (lease_of(dsn, uuid) or (0, ""))[0] >= 2 or None, what="a new epoch")
        assert only_deferrals_traced(worker.log_text())


def test_a_store_restarted_for_a_few_seconds_mid_task_is_waited_for_and_no_attempt_is_lost(
    tmp_path: Path, redis_url: str, redis_client: object, private_postgres: PostgresServer
) -> None:
    with outage_mid_task(tmp_path, redis_url, private_postgres) as (stack, worker, uuid, dsn):
        # The step's commit finds no database, and waits (lease_s: 60 s).
        stack.wait_until(lambda: "fleet store unreachable; trying again" in worker.log_text(), what="a retry")
        private_postgres.start()
        state = stack.wait_finished(uuid)
        assert state["status"] == "completed", state
        assert state["attempt"] == 1  # waited for, not handed back: no attempt lost
        assert stack.wait_until(lambda: lease_of(dsn, uuid) == (1, None) or None, what="the lease released")
        assert "handed back" not in worker.log_text()
        with FleetStore(dsn) as fleet:  # every model answer once in the durable copy
            rebuilt = tmp_path / "rebuilt"
            PostgresCopy(fleet).rebuild(uuid, rebuilt)
        turns = [m["content"] for m in (json.loads(line) for line in (rebuilt / "messages.jsonl").open())
                 if m["role"] == "assistant"]  # fmt: skip
        assert len(turns) == len(set(turns)) == len(fix_calc_trajectory())
