"""The audit log in fleet mode: the same chain as rows of a real PostgreSQL (pgserver's), one chain across hosts, and
a row altered, removed or reordered by a hand that got past the append-only trigger still found."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from contexts.audit import Event, line_hash
from fleet.audit import PostgresAuditLog
from fleet.store import FleetStore
from worker.audit import audit_log, record_audit
from worker.settings_models import Settings

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def fleet(fleet_dsn: str) -> Iterator[FleetStore]:
    with FleetStore(fleet_dsn) as store:
        yield store


def _fill(log: PostgresAuditLog, count: int) -> None:
    for i in range(count):
        log.append(Event(at=T0 + timedelta(minutes=i), actor=f"github:user{i}", action="trigger.admitted",
                         target=f"o/r#{i}"))


def _tamper(dsn: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE tasuki_audit DISABLE TRIGGER tasuki_audit_append_only")
        for sql, params in statements:
            conn.execute(sql, params)  # type: ignore[arg-type]
        conn.execute("ALTER TABLE tasuki_audit ENABLE TRIGGER tasuki_audit_append_only")


def test_record_audit_in_fleet_mode_writes_rows_with_the_files_chain(
    make_settings: Callable[..., Settings], fleet_dsn: str
) -> None:
    settings = make_settings({"TASUKI__FLEET__STORE": fleet_dsn})
    token = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8"
    record_audit(settings, actor="oidc:alice", action="signin", now=T0)
    record_audit(settings, actor="token:alice", action="task.cancel", target="abc", detail={"bearer": token},
                 now=T0 + timedelta(seconds=1))
    backend = audit_log(settings)
    assert isinstance(backend, PostgresAuditLog)
    lines = list(backend.read())
    assert [line["seq"] for line in lines] == [1, 2]
    assert lines[1]["prev"] == lines[0]["hash"] == line_hash(lines[0])
    assert token not in str(lines)
    assert backend.verify() == []
    assert [line["seq"] for line in backend.read(since=T0 + timedelta(milliseconds=500))] == [2]
    assert [line["seq"] for line in backend.read_reversed()] == [2, 1]
    assert not (settings.contexts.base_dir.parent / "audit").exists()  # nothing on the host's disk


def test_an_update_or_delete_is_refused_by_the_table(fleet: FleetStore, fleet_dsn: str) -> None:
    _fill(PostgresAuditLog(fleet), 2)
    with psycopg.connect(fleet_dsn) as conn, pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        conn.execute("DELETE FROM tasuki_audit WHERE seq = 1")


def test_an_altered_row_is_named(fleet: FleetStore, fleet_dsn: str) -> None:
    log = PostgresAuditLog(fleet)
    _fill(log, 5)
    _tamper(fleet_dsn, ("UPDATE tasuki_audit SET line = jsonb_set(line::jsonb, '{actor}', '\"github:x\"')::json "
                        "WHERE seq = 3", ()))
    assert [(p.line, p.seq) for p in log.verify()] == [(3, 3)]


def test_a_removed_row_is_named(fleet: FleetStore, fleet_dsn: str) -> None:
    log = PostgresAuditLog(fleet)
    _fill(log, 5)
    _tamper(fleet_dsn, ("DELETE FROM tasuki_audit WHERE seq = 2", ()))
    problems = log.verify()
    assert [p.line for p in problems] == [2]
    assert "removed" in problems[0].message


def test_rows_cut_off_the_end_are_found_through_the_head(fleet: FleetStore, fleet_dsn: str) -> None:
    log = PostgresAuditLog(fleet)
    _fill(log, 5)
    _tamper(fleet_dsn, ("DELETE FROM tasuki_audit WHERE seq > 3", ()))
    assert [p.line for p in log.verify()] == [4]


def test_reordered_rows_are_named(fleet: FleetStore, fleet_dsn: str) -> None:
    log = PostgresAuditLog(fleet)
    _fill(log, 5)
    # Swap the lines of rows 2 and 3: the chain reads them in the other order.
    _tamper(fleet_dsn, ("UPDATE tasuki_audit AS a SET line = b.line FROM tasuki_audit AS b "
                        "WHERE (a.seq, b.seq) IN ((2, 3), (3, 2))", ()))
    assert [p.line for p in log.verify()] == [2]


def test_hosts_appending_at_once_keep_one_chain(fleet_dsn: str) -> None:
    stores = [FleetStore(fleet_dsn) for _ in range(4)]
    errors: list[BaseException] = []

    def host(store: FleetStore, name: str) -> None:
        try:
            log = PostgresAuditLog(store)
            for i in range(25):
                log.append(Event(at=datetime.now(UTC), actor=f"cli:{name}", action="task.submit", target=str(i)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(store, f"h{n}")) for n, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert errors == []
        log = PostgresAuditLog(stores[0])
        assert [line["seq"] for line in log.read()] == list(range(1, 101))
        assert log.verify() == []
    finally:
        for store in stores:
            store.close()


def test_select_filters_in_the_database_as_the_file_does(fleet: FleetStore) -> None:
    from contexts.audit import AuditQuery

    log = PostgresAuditLog(fleet)
    _fill(log, 12)
    assert [line["seq"] for line in log.select(AuditQuery(limit=3))] == [10, 11, 12]
    assert [line["seq"] for line in log.select(AuditQuery(actor="github:user3"))] == [4]
    assert [line["seq"] for line in log.select(AuditQuery(actor="github:user1*", limit=2))] == [11, 12]
    assert [line["seq"] for line in log.select(AuditQuery(since=T0 + timedelta(minutes=9), action="trigger.*"))] == [
        10, 11, 12]
    assert list(log.select(AuditQuery(action="signin"))) == []
