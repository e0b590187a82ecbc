"""The audit log of a fleet in its PostgreSQL (issue 40): the same lines and the same hash chain as
:mod:`contexts.audit`'s file, as rows of ``tasuki_audit`` (fleet/schema.py, version 7).

Every host appends to one chain: an append takes a transaction-level advisory lock, reads the newest row, and
inserts the next one with the head in the same transaction, so two hosts never chain onto the same line. Reading
pages through the rows by ``seq`` with a server-side cursor, so a million rows stream as the file does.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from psycopg.types.json import Json

from contexts.audit import AuditQuery, Event, Problem, chain, check_chain, next_at
from contexts.clock import iso
from fleet.store import FleetStore

# pg_advisory_xact_lock's key for "appending to the audit chain": "audit" in ASCII, as a bigint.
AUDIT_LOCK = 0x6175646974
_PAGE = 5000


class PostgresAuditLog:
    """:class:`worker.audit.AuditBackend` on the fleet store."""

    def __init__(self, fleet: FleetStore) -> None:
        self.fleet = fleet

    def append(self, event: Event) -> dict[str, Any]:
        """Chain ``event`` after the fleet's newest row, in one transaction with the head."""
        with self.fleet.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
            last = conn.execute("SELECT line FROM tasuki_audit ORDER BY seq DESC LIMIT 1").fetchone()
            previous: dict[str, Any] | None = last[0] if last else None
            line = chain(
                event,
                seq=int(previous["seq"]) + 1 if previous else 1,
                prev=previous["hash"] if previous else "0" * 64,
                at=next_at(event.at, previous["at"] if previous else None),
            )
            conn.execute(
                "INSERT INTO tasuki_audit (seq, at, actor, action, line) VALUES (%s, %s, %s, %s, %s)",
                (line["seq"], line["at"], line["actor"], line["action"], Json(line)),
            )
            conn.execute(
                "INSERT INTO tasuki_audit_head (one, seq, hash) VALUES (true, %s, %s) "
                "ON CONFLICT (one) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash",
                (line["seq"], line["hash"]),
            )
        return line

    def read(self, *, since: datetime | None = None) -> Iterator[dict[str, Any]]:
        """Rows oldest first, from the first at or after ``since`` (the ``at`` index finds it)."""
        after_seq, first_at = 0, iso(since) if since is not None else ""
        while True:
            with self.fleet.reading() as conn:
                rows = conn.execute(
                    "SELECT seq, line FROM tasuki_audit WHERE seq > %s AND at >= %s ORDER BY seq LIMIT %s",
                    (after_seq, first_at, _PAGE),
                ).fetchall()
            for _, line in rows:
                yield line
            if len(rows) < _PAGE:
                return
            after_seq = rows[-1][0]

    def read_reversed(self) -> Iterator[dict[str, Any]]:
        """Rows newest first, a page at a time."""
        before: int | None = None
        while True:
            with self.fleet.reading() as conn:
                rows = conn.execute(
                    "SELECT seq, line FROM tasuki_audit WHERE %s::bigint IS NULL OR seq < %s "
                    "ORDER BY seq DESC LIMIT %s",
                    (before, before, _PAGE),
                ).fetchall()
            for _, line in rows:
                yield line
            if len(rows) < _PAGE:
                return
            before = rows[-1][0]

    def select(self, query: AuditQuery) -> Iterator[dict[str, Any]]:
        """The rows ``query`` wants, oldest first: exact actor and action compared by the database, patterns here;
        the newest ``limit`` read newest first, a page at a time, stopping at ``since``."""
        exact = [(column, value) for column, value in (("actor", query.actor), ("action", query.action))
                 if value is not None and not any(c in value for c in "*?[")]
        where = " AND ".join(["at >= %s", *(f"{column} = %s" for column, _ in exact)])
        values = [iso(query.since) if query.since is not None else "", *(value for _, value in exact)]
        order = "DESC" if query.limit > 0 else "ASC"
        bound: int | None = None
        found: list[dict[str, Any]] = []
        while True:
            with self.fleet.reading() as conn:
                rows = conn.execute(
                    f"SELECT seq, line FROM tasuki_audit WHERE {where} AND (%s::bigint IS NULL OR "  # noqa: S608
                    f"seq {'<' if order == 'DESC' else '>'} %s) ORDER BY seq {order} LIMIT %s",
                    (*values, bound, bound, _PAGE),
                ).fetchall()
            for _, line in rows:
                if not query.matches(line):
                    continue
                if query.limit <= 0:
                    yield line
                    continue
                found.append(line)
                if len(found) == query.limit:
                    yield from reversed(found)
                    return
            if len(rows) < _PAGE:
                yield from reversed(found)
                return
            bound = rows[-1][0]

    def verify(self) -> list[Problem]:
        """The rows' chain, position by position in ``seq`` order, and the head against the newest row."""
        problems = list(check_chain((n, line, False) for n, line in enumerate(self.read(), 1)))
        if problems:
            return problems
        with self.fleet.reading() as conn:
            head = conn.execute("SELECT seq FROM tasuki_audit_head").fetchone()
            last = conn.execute("SELECT max(seq) FROM tasuki_audit").fetchone()
        newest = int(last[0]) if last and last[0] is not None else 0
        if head is not None and newest < int(head[0]):
            return [Problem(newest + 1, int(head[0]),
                            f"the log ends at seq {newest} but seq {head[0]} was written (rows cut off the end)")]
        return []
