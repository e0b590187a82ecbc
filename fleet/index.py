"""The context index of every host in the fleet's PostgreSQL (SPEC §12): contexts/index.py's :class:`Index` on the
table ``tasuki_index`` (fleet/schema.py, version 3).

Each host writes the rows of its own contexts at the same points as one host writes ``index.sqlite3`` (a context
created, a status change, the move to ``completed/``, retention), from the same row builder
(:func:`contexts.index_schema.row_of`), and marks each row with its name. Every host reads every host's rows: ``context
list``, ``stats``, the console and the alerts see the fleet. A trigger keeps the tallies, so that counts and totals
read a handful of rows at 1,000 and at 100,000 contexts alike. Reconciliation and a rebuild touch only this host's
rows: the other hosts' directories are theirs.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from contexts.errors import CorruptRecordError
from contexts.index import IndexEntry, IndexUnavailable
from contexts.index_schema import ENTRY_COLUMNS, row_of, summary_from_json
from contexts.masking import mask
from contexts.names import ACTIVE_STATUSES, COMPLETED_DIR, RUNNING_DIR
from contexts.summary import ContextSummary, Damaged, context_uuids, summarize
from contexts.totals import Tally, Totals, fold
from fleet.errors import FleetError
from fleet.lease import Conn
from fleet.store import FleetStore

T = TypeVar("T")

COLUMNS = [
    "uuid",
    "location",
    "status",
    "created_at",
    "ended_at",
    "duration_us",
    "task_source",
    "repository",
    "user",
    "user_key",
    "task_type",
    "task_id",
    "title",
    "steps",
    "tokens",
    "messages",
    "compressions",
    "disk_bytes",
    "summary",
    "cost_nusd",
    "priced",
]  # contexts/index_schema.py's order (row_of)
_QUOTED = ", ".join(f'"{name}"' for name in ["host", *COLUMNS])
_ACTIVE = ", ".join(f"'{status}'" for status in ACTIVE_STATUSES)
# The same rule as SQLite's UPSERT (contexts/index_schema.py): a final completed row is only replaced by another.
UPSERT = (
    f"INSERT INTO tasuki_index AS c ({_QUOTED}) VALUES ({', '.join(['%s'] * (len(COLUMNS) + 1))}) "  # noqa: S608
    "ON CONFLICT (uuid) DO UPDATE SET "
    + ", ".join(f'"{name}" = EXCLUDED."{name}"' for name in ["host", *COLUMNS[1:]])
    + " WHERE c.location = 'running' OR (EXCLUDED.location = 'completed' AND ("
    + f"EXCLUDED.status NOT IN ({_ACTIVE}) OR c.status IN ({_ACTIVE})))"
)
_ENTRY = ", ".join(f'"{name}"' for name in ENTRY_COLUMNS.split(", "))
TALLY_COLUMNS = (
    "location, status, user_key, n, tokens, messages, compressions, duration_us, durations, disk_bytes, newest, "
    "cost_nusd, priced"
)
_TALLY_OF_ROWS = (
    "location, status, user_key, count(*), sum(tokens)::bigint, sum(messages)::bigint, sum(compressions)::bigint, "
    "coalesce(sum(duration_us), 0)::bigint, count(duration_us), sum(disk_bytes)::bigint, max(created_at), "
    "sum(cost_nusd)::bigint, sum(priced)::bigint"
)


def pg_row(host: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A :func:`row_of` tuple as ``tasuki_index`` takes it (the host first; ``priced`` an integer)."""
    return (host, *row[:-1], int(row[-1]))


def _filters(**given: str | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    uuid_prefix = given.pop("uuid_prefix", None)
    for column, value in given.items():
        if value is not None:
            clauses.append(f'"{column}" = %s')
            params.append(value)
    if uuid_prefix:
        clauses.append("uuid >= %s AND uuid < %s")
        params += [uuid_prefix.lower(), uuid_prefix.lower() + "~"]
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class PostgresIndex:
    """Every host's contexts in the fleet's database; this host (``host``) writes the rows of ``root``'s."""

    def __init__(self, fleet: FleetStore, root: Path, *, host: str | None = None) -> None:
        self.fleet = fleet
        self.root = Path(root)
        self.host = host or socket.gethostname()

    @property
    def name(self) -> str:
        """The fleet's database (its URL masked)."""
        return mask(self.fleet.url)

    def _run(self, action: Callable[[Conn], T]) -> T:
        """One transaction; any database error is :class:`IndexUnavailable`, one line (a mirror logs it)."""
        try:
            with self.fleet.connection() as conn:
                return action(conn)
        except FleetError as exc:
            raise IndexUnavailable(f"context index: {exc}") from None
        except psycopg.Error as exc:
            detail = " ".join(str(exc).split())[:200]
            raise IndexUnavailable(mask(f"context index {self.fleet.url}: {detail}")) from None

    def close(self) -> None:
        """Nothing of its own: the pool is the process's (worker/stores.py)."""

    # -- writers -------------------------------------------------------------------------------------

    def record(self, directory: Path) -> None:
        """Index the context in ``directory`` as its files say now (gone: forgotten; unreadable: damaged)."""
        try:
            row = pg_row(self.host, row_of(summarize(directory), directory))
        except (OSError, CorruptRecordError) as exc:
            reason = str(exc)
            self._run(lambda conn: self._unreadable(conn, directory, reason))
            return

        def write(conn: Conn) -> None:
            conn.execute(UPSERT, row)
            conn.execute("DELETE FROM tasuki_index_damaged WHERE uuid = %s", (directory.name,))

        self._run(write)

    def _unreadable(self, conn: Conn, directory: Path, reason: str) -> None:
        if directory.is_dir():
            conn.execute("DELETE FROM tasuki_index WHERE uuid = %s AND host = %s", (directory.name, self.host))
            conn.execute(
                "INSERT INTO tasuki_index_damaged VALUES (%s, %s, %s, %s) ON CONFLICT (uuid) DO UPDATE SET "
                "host = EXCLUDED.host, location = EXCLUDED.location, reason = EXCLUDED.reason",
                (directory.name, self.host, directory.parent.name, reason),
            )
        elif not any((self.root / location / directory.name).is_dir() for location in (RUNNING_DIR, COMPLETED_DIR)):
            self._forget(conn, directory.name)

    def _forget(self, conn: Conn, uuid: str, *, anywhere: bool = False) -> None:
        # Only this host's row unless told: another host may hold the context now (its row names that host).
        mine = "" if anywhere else " AND host = %s"
        params = (uuid,) if anywhere else (uuid, self.host)
        conn.execute("DELETE FROM tasuki_index WHERE uuid = %s" + mine, params)  # noqa: S608 - a constant clause
        conn.execute("DELETE FROM tasuki_index_damaged WHERE uuid = %s" + mine, params)  # noqa: S608

    def set_status(self, uuid: str, status: str, *, steps: int, tokens: int) -> None:
        """A running context's new status (and its progress so far); a no-op once it is completed."""
        self._run(
            lambda conn: conn.execute(
                "UPDATE tasuki_index SET status = %s, steps = %s, tokens = %s, host = %s "
                "WHERE uuid = %s AND location = 'running'",
                (status, steps, tokens, self.host, uuid),
            )
        )

    def forget(self, uuid: str, *, anywhere: bool = False) -> None:
        """Drop a deleted context's row: this host's, or, ``anywhere``, whichever host wrote it (a context whose
        durable copy retention forgot: no host holds it any more)."""
        self._run(lambda conn: self._forget(conn, uuid, anywhere=anywhere))

    def reconcile(self, *, everything: bool = False) -> int:
        """Re-read this host's contexts whose rows may be stale (see :meth:`ContextIndex.reconcile`)."""

        def stale(conn: Conn) -> set[str]:
            running_now = set(context_uuids(self.root / RUNNING_DIR))
            rows = conn.execute(
                f"SELECT uuid, location FROM tasuki_index WHERE host = %s AND (location = 'running' "  # noqa: S608
                f"OR status IN ({_ACTIVE}))",
                (self.host,),
            ).fetchall()
            indexed = {uuid for uuid, location in rows if location == RUNNING_DIR}
            moved = {uuid for uuid, location in rows if location != RUNNING_DIR or uuid not in running_now}
            if not everything:
                return moved | (running_now - indexed)
            on_disk = running_now | set(context_uuids(self.root / COMPLETED_DIR))
            known = {
                row[0]
                for row in conn.execute(
                    "SELECT uuid FROM tasuki_index WHERE host = %s UNION SELECT uuid FROM tasuki_index_damaged "
                    "WHERE host = %s",
                    (self.host, self.host),
                )
            }
            return moved | (running_now - indexed) | (known - on_disk) | (on_disk - known)

        uuids = self._run(stale)
        for uuid in sorted(uuids):
            running = self.root / RUNNING_DIR / uuid
            self.record(running if running.is_dir() else self.root / COMPLETED_DIR / uuid)
        return len(uuids)

    def rebuild(self) -> int:
        """Index every context of this host's directories, and drop this host's rows of contexts it no longer has."""
        rows: list[tuple[Any, ...]] = []
        damaged: list[tuple[str, str, str, str]] = []
        for location in (RUNNING_DIR, COMPLETED_DIR):
            for uuid in context_uuids(self.root / location):
                directory = self.root / location / uuid
                try:
                    rows.append(pg_row(self.host, row_of(summarize(directory), directory)))
                except (OSError, CorruptRecordError) as exc:
                    if directory.is_dir():
                        damaged.append((uuid, self.host, location, str(exc)))

        def write(conn: Conn) -> None:
            found = [row[1] for row in rows]
            conn.execute("DELETE FROM tasuki_index WHERE host = %s AND NOT uuid = ANY(%s)", (self.host, found))
            conn.execute("DELETE FROM tasuki_index_damaged WHERE host = %s", (self.host,))
            with conn.cursor() as cursor:
                cursor.executemany(UPSERT, rows)
                cursor.executemany(
                    "INSERT INTO tasuki_index_damaged VALUES (%s, %s, %s, %s) ON CONFLICT (uuid) DO NOTHING", damaged
                )

        self._run(write)
        return len(rows)

    def insert_many(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Upsert ready rows (:func:`pg_row`'s) in one transaction: ``tasuki fleet import`` and the benchmark."""
        batch = list(rows)

        def write(conn: Conn) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(UPSERT, batch)

        self._run(write)

    # -- readers -------------------------------------------------------------------------------------

    def page(
        self,
        *,
        status: str | None = None,
        repository: str | None = None,
        user: str | None = None,
        uuid_prefix: str | None = None,
        location: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[IndexEntry]:
        """One page of contexts, newest first."""
        where = _filters(status=status, repository=repository, user=user, uuid_prefix=uuid_prefix, location=location)
        return [
            IndexEntry(
                uuid=r[0],
                status=r[1],
                created_at=datetime.fromtimestamp(r[2], UTC),
                ended_at=None if r[3] is None else datetime.fromtimestamp(r[3], UTC),
                repository=r[4],
                user=r[5],
                task_type=r[6],
                task_id=r[7],
                title=r[8],
                steps=r[9],
                tokens=r[10],
                location=r[11],
                task_source=r[12],
                disk_bytes=r[13],
            )
            for r in self._newest(_ENTRY, where, limit, offset)
        ]

    def summaries(
        self,
        *,
        status: str | None = None,
        user: str | None = None,
        location: str | None = COMPLETED_DIR,
        limit: int | None = 50,
        offset: int = 0,
    ) -> list[ContextSummary]:
        """What the list prints, newest first, as of each context's last index write; ``limit`` None: all."""
        rows = self._newest("summary", _filters(status=status, user=user, location=location), limit, offset)
        return [summary_from_json(row[0], self.root) for row in rows]

    def elsewhere(self, *, status: str | None = None, user: str | None = None) -> list[ContextSummary]:
        """Running contexts whose last index write came from another host: the summary of their last full write,
        with the status, steps and tokens of their last status change."""
        clauses, params = _filters(status=status, user=user, location=RUNNING_DIR)
        sql = f"SELECT summary, status, steps, tokens FROM tasuki_index{clauses} AND host <> %s"  # noqa: S608
        rows = self._run(lambda conn: conn.execute(sql, [*params, self.host]).fetchall())
        return [
            replace(summary_from_json(text, self.root), status=now, llm_call_count=steps, total_tokens_used=tokens)
            for text, now, steps, tokens in rows
        ]

    def _newest(
        self, columns: str, where: tuple[str, list[Any]], limit: int | None, offset: int
    ) -> list[tuple[Any, ...]]:
        clauses, params = where
        sql = (
            f"SELECT {columns} FROM tasuki_index{clauses} ORDER BY created_at DESC, uuid DESC "  # noqa: S608
            "LIMIT %s OFFSET %s"
        )
        rows = None if limit is None else max(limit, 0)
        return self._run(lambda conn: conn.execute(sql, [*params, rows, max(offset, 0)]).fetchall())

    def count(
        self,
        *,
        status: str | None = None,
        repository: str | None = None,
        user: str | None = None,
        uuid_prefix: str | None = None,
        location: str | None = None,
    ) -> int:
        """How many contexts match (a sum of the tallies when only status, user and location filter)."""
        if repository is None and uuid_prefix is None:
            return self.totals(status=status, user=user, location=location).count
        where, params = _filters(
            status=status, repository=repository, user=user, uuid_prefix=uuid_prefix, location=location
        )
        sql = f"SELECT count(*) FROM tasuki_index{where}"  # noqa: S608 - clauses are constants, values parameters
        return int(self._run(lambda conn: conn.execute(sql, params).fetchone())[0])  # type: ignore[index]

    def totals(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        user: str | None = None,
        location: str | None = None,
    ) -> Totals:
        """Counts and sums of the contexts created in ``[since, until)`` (all without them)."""
        return fold(self.tallies(since=since, until=until, status=status, user=user, location=location))

    def tallies(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        user: str | None = None,
        location: str | None = None,
    ) -> list[Tally]:
        """The kept tallies without a time bound; with one, the rows of that range grouped."""
        clauses, params = _filters(status=status, user_key=user, location=location)
        if since is None and until is None:
            sql = f"SELECT {TALLY_COLUMNS} FROM tasuki_index_tallies{clauses}"  # noqa: S608
        else:
            bounds = [(op, bound.timestamp()) for op, bound in ((">=", since), ("<", until)) if bound is not None]
            clauses += (" AND " if clauses else " WHERE ") + " AND ".join(f"created_at {op} %s" for op, _ in bounds)
            params += [value for _, value in bounds]
            sql = f"SELECT {_TALLY_OF_ROWS} FROM tasuki_index{clauses} GROUP BY location, status, user_key"  # noqa: S608
        rows = self._run(lambda conn: conn.execute(sql, params).fetchall())
        return [Tally(*row) for row in rows]

    def ended_since(self, since: datetime) -> dict[str, int]:
        """Contexts that reached ``completed/`` since ``since``, by status (every host's)."""
        sql = (
            "SELECT status, count(*) FROM tasuki_index WHERE ended_at >= %s AND location = 'completed' GROUP BY status"
        )
        rows = self._run(lambda conn: conn.execute(sql, (since.timestamp(),)).fetchall())
        return {str(status): int(n) for status, n in rows}

    def damaged(self) -> list[Damaged]:
        """The contexts some host found unreadable when it last read them."""
        rows = self._run(
            lambda conn: conn.execute("SELECT uuid, location, reason FROM tasuki_index_damaged").fetchall()
        )
        return [Damaged(uuid, self.root / location / uuid, reason) for uuid, location, reason in sorted(rows)]
