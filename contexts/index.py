"""The context index (issue 13 §4): one row per context in ``<root>/index.sqlite3``, kept by the writers.

The directories stay the truth; the index is a mirror that makes the common reads cost the same at 10 and at
10,000 completed contexts: a page of the newest (``page``), counts (``count``), totals from running tallies that
SQL triggers keep (``totals``) and recent endings (``ended_since``).  The store writes a row when it creates a
context, when a running context's status changes and after the move to ``completed/``; retention deletes rows.

A crash between a move and its index write leaves a row that still says "running": every open reconciles the
rows of running contexts against ``running/`` (small) and re-reads the few that moved or vanished.  A missing,
corrupt or outdated index file rebuilds itself once from a scan of both directories.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from contexts.errors import ContextError, CorruptRecordError
from contexts.index_schema import (
    ENTRY_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    TRIGGERS,
    UNFINISHED,
    UPSERT,
    row_of,
    summary_from_json,
)
from contexts.names import ACTIVE_STATUSES, COMPLETED_DIR, INDEX_FILE, RUNNING_DIR
from contexts.sqlite_files import create_private, immediate, open_wal
from contexts.summary import ContextSummary, Damaged, context_uuids, summarize
from contexts.totals import Tally, Totals, fold, tally_of

__all__ = ["ContextIndex", "Index", "IndexEntry", "IndexUnavailable", "Tally", "Totals", "fold", "tally_of"]

log = structlog.get_logger(__name__)

BUSY_TIMEOUT_S = 30.0  # a rebuild holds the write lock while it scans: writers queue behind it, never fail
T = TypeVar("T")


class IndexUnavailable(ContextError):
    """The context index cannot be opened or written (a read-only or full disk, a lock held too long)."""


@dataclass(frozen=True)
class IndexEntry:
    """One context as the index knows it (steps and tokens as of its last index write: final once it ended)."""

    uuid: str
    status: str
    created_at: datetime
    ended_at: datetime | None
    repository: str  # owner/repo, or the local repository's name
    user: str | None
    task_type: str
    task_id: str
    title: str | None  # masked, as in metadata.json
    steps: int
    tokens: int
    location: str = RUNNING_DIR  # running | completed
    task_source: str = ""
    disk_bytes: int = 0


class Index(Protocol):
    """The context index's seam: one row per context, kept by the writers and read by ``context list``, ``stats``,
    the console, the alerts and retention. :class:`ContextIndex` keeps the host's own contexts in SQLite; in fleet
    mode (SPEC §12) ``fleet/index.py`` keeps every host's in PostgreSQL. worker/stores.py picks one by the scheme of
    ``fleet.store``; :class:`~contexts.store.ContextStore` takes the factory."""

    @property
    def name(self) -> str:
        """Where the index is, for messages (a file, or a masked URL)."""

    def record(self, directory: Path) -> None:
        """Index the context in ``directory`` as its files say now (gone: forgotten; unreadable: damaged)."""

    def set_status(self, uuid: str, status: str, *, steps: int, tokens: int) -> None:
        """A running context's new status (and its progress so far); a no-op once it is completed."""

    def forget(self, uuid: str, *, anywhere: bool = False) -> None:
        """Drop a deleted context's row: this host's (another host may hold the context now), or, ``anywhere``,
        whichever host wrote it (a context retention forgot from the fleet's durable copy)."""

    def reconcile(self, *, everything: bool = False) -> int:
        """Re-read this host's contexts whose rows may be stale after a crash; how many were re-read."""

    def rebuild(self) -> int:
        """Index every context of this host from a scan of its directories; how many were indexed."""

    def page(
        self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
        uuid_prefix: str | None = None, location: str | None = None, limit: int = 50, offset: int = 0,
    ) -> list[IndexEntry]:
        """One page of contexts, newest first."""

    def summaries(
        self, *, status: str | None = None, user: str | None = None, location: str | None = COMPLETED_DIR,
        limit: int | None = 50, offset: int = 0,
    ) -> list[ContextSummary]:
        """What the list prints, newest first; ``limit`` None: all of them."""

    def elsewhere(self, *, status: str | None = None, user: str | None = None) -> list[ContextSummary]:
        """Running contexts held by other hosts, as of their last index write (one host: none)."""

    def count(
        self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
        uuid_prefix: str | None = None, location: str | None = None,
    ) -> int:
        """How many contexts match."""

    def totals(
        self, *, since: datetime | None = None, until: datetime | None = None, status: str | None = None,
        user: str | None = None, location: str | None = None,
    ) -> Totals:
        """Counts and sums of the contexts created in ``[since, until)`` (all without them)."""

    def tallies(
        self, *, since: datetime | None = None, until: datetime | None = None, status: str | None = None,
        user: str | None = None, location: str | None = None,
    ) -> list[Tally]:
        """The tallies :meth:`totals` folds."""

    def ended_since(self, since: datetime) -> dict[str, int]:
        """Contexts that reached ``completed/`` since ``since``, by status."""

    def damaged(self) -> list[Damaged]:
        """The contexts the index found unreadable when it last read them."""

    def close(self) -> None:
        """Close the connection (the next call reopens it)."""


def _filters(
    status: str | None, repository: str | None, user: str | None, uuid_prefix: str | None, location: str | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("status", status), ("repository", repository), ("user", user), ("location", location)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if uuid_prefix:  # a range of the primary key: "~" sorts after every character of a UUID
        clauses.append("uuid >= ? AND uuid < ?")
        params += [uuid_prefix.lower(), uuid_prefix.lower() + "~"]
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _mark_damaged(db: sqlite3.Connection, directory: Path, reason: str) -> None:
    db.execute("INSERT OR REPLACE INTO damaged VALUES (?, ?, ?)", (directory.name, directory.parent.name, reason))


class ContextIndex:
    """The index of the contexts under ``root``; safe to share between threads, reopened after a fork."""

    def __init__(self, root: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.root = Path(root)
        self.path = self.root / INDEX_FILE
        self.busy_timeout_s = busy_timeout_s
        self._guard = threading.RLock()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []  # a parent's, after a fork: kept open, never used or closed
        self._attempt(self._connect)

    @property
    def name(self) -> str:
        """The index file."""
        return str(self.path)

    # -- connection ----------------------------------------------------------------------------------

    def _connect(self) -> None:
        if self._db is not None and self._pid != os.getpid():
            self._inherited.append(self._db)  # closing it here could checkpoint the parent's WAL under it
        new = create_private(self.path)
        db = open_wal(self.path, self.busy_timeout_s)
        self._db, self._pid = db, os.getpid()
        try:
            version = self._schema_version(db)
            if version != SCHEMA_VERSION:
                self._build("new" if new else ("missing" if version is None else f"schema {version}"))
        except BaseException:
            db.close()
            self._db = None
            raise
        self.reconcile()

    @staticmethod
    def _schema_version(db: sqlite3.Connection) -> str | None:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            return None
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        return str(row[0]) if row else None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():  # a connection must not cross a fork
            self._connect()
        return self._db  # type: ignore[return-value]  # _connect set it

    def _attempt(self, action: Callable[[], T]) -> T:
        """Run ``action``; a corrupt file is removed and rebuilt once, any other SQLite error is one line."""
        with self._guard:
            try:
                return action()
            except sqlite3.OperationalError as exc:
                raise IndexUnavailable(f"context index {self.path}: {exc}") from None
            except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
                log.warning("context index corrupt; rebuilding it", path=str(self.path), error=str(exc))
                self._discard()
            try:
                self._connect()
                return action()
            except sqlite3.Error as exc:
                raise IndexUnavailable(f"context index {self.path}: {exc}") from None

    def _discard(self) -> None:
        if self._db is not None:
            with suppress(sqlite3.Error):
                self._db.close()
        self._db = None
        for suffix in ("", "-wal", "-shm"):
            with suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self._conn())

    def close(self) -> None:
        """Close the connection (the next call reopens it)."""
        with self._guard:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

    # -- writers -------------------------------------------------------------------------------------

    def record(self, directory: Path) -> None:
        """Index the context in ``directory`` as its files say now (gone: forgotten; unreadable: damaged)."""
        self._attempt(lambda: self._record(directory))

    def _record(self, directory: Path) -> None:
        try:
            row = row_of(summarize(directory), directory)
        except (OSError, CorruptRecordError) as exc:
            with self._write() as db:
                if directory.is_dir():
                    db.execute("DELETE FROM contexts WHERE uuid = ?", (directory.name,))
                    _mark_damaged(db, directory, str(exc))
                elif not self._exists(directory.name):
                    self._forget(db, directory.name)
            return
        with self._write() as db:
            db.execute(UPSERT, row)
            db.execute("DELETE FROM damaged WHERE uuid = ?", (directory.name,))

    def _exists(self, uuid: str) -> bool:
        return any((self.root / location / uuid).is_dir() for location in (RUNNING_DIR, COMPLETED_DIR))

    def set_status(self, uuid: str, status: str, *, steps: int, tokens: int) -> None:
        """A running context's new status (and its progress so far); a no-op once it is completed."""

        def update() -> None:
            with self._write() as db:
                db.execute(
                    "UPDATE contexts SET status = ?, steps = ?, tokens = ? WHERE uuid = ? AND location = 'running'",
                    (status, steps, tokens, uuid),
                )

        self._attempt(update)

    def forget(self, uuid: str, *, anywhere: bool = False) -> None:
        """Drop a deleted context's row (one host: every row is this host's, ``anywhere`` or not)."""

        def delete() -> None:
            with self._write() as db:
                self._forget(db, uuid)

        self._attempt(delete)

    @staticmethod
    def _forget(db: sqlite3.Connection, uuid: str) -> None:
        db.execute("DELETE FROM contexts WHERE uuid = ?", (uuid,))
        db.execute("DELETE FROM damaged WHERE uuid = ?", (uuid,))

    def reconcile(self, *, everything: bool = False) -> int:
        """Re-read the contexts whose rows may be stale after a crash: running rows whose directory left
        ``running/``, contexts in ``running/`` without a row, ended rows not yet final; with ``everything``
        (retention's daily pass) also rows without a directory and ``completed/`` without a row.  Returns how
        many contexts were re-read."""

        def stale() -> set[str]:
            db = self._conn()
            running_now = set(context_uuids(self.root / RUNNING_DIR))
            rows = db.execute(UNFINISHED, ACTIVE_STATUSES).fetchall()
            indexed = {uuid for uuid, location in rows if location == RUNNING_DIR}
            moved = {uuid for uuid, location in rows if location != RUNNING_DIR or uuid not in running_now}
            if not everything:
                return moved | (running_now - indexed)
            on_disk = running_now | set(context_uuids(self.root / COMPLETED_DIR))
            known = {row[0] for row in db.execute("SELECT uuid FROM contexts UNION SELECT uuid FROM damaged")}
            return moved | (running_now - indexed) | (known - on_disk) | (on_disk - known)

        uuids = self._attempt(stale)
        for uuid in sorted(uuids):
            self._attempt(lambda uuid=uuid: self._record(self._locate(uuid)))  # type: ignore[misc]
        return len(uuids)

    def _locate(self, uuid: str) -> Path:
        running = self.root / RUNNING_DIR / uuid
        return running if running.is_dir() else self.root / COMPLETED_DIR / uuid

    def rebuild(self) -> int:
        """Index every context from a scan of ``running/`` and ``completed/``; returns how many were indexed."""
        return self._attempt(lambda: self._build("asked"))

    def _build(self, reason: str) -> int:
        db = self._db if self._db is not None and self._pid == os.getpid() else self._conn()
        db.execute("BEGIN IMMEDIATE")  # taken before the scan: a second opener waits for this build, not repeats it
        try:
            if reason != "asked" and self._schema_version(db) == SCHEMA_VERSION:
                db.execute("COMMIT")
                return 0
            for name in ("tally_insert", "tally_delete", "tally_update"):
                db.execute(f"DROP TRIGGER IF EXISTS {name}")
            for name in ("contexts", "damaged", "tallies", "meta"):
                db.execute(f"DROP TABLE IF EXISTS {name}")
            # One statement at a time: executescript would commit the transaction that keeps a second builder out.
            for statement in [*SCHEMA.split(";"), *TRIGGERS]:
                if statement.strip():
                    db.execute(statement)
            indexed = 0
            for location in (RUNNING_DIR, COMPLETED_DIR):
                for uuid in context_uuids(self.root / location):
                    indexed += self._scan_one(db, self.root / location / uuid)
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        # A new file (a new store, a deleted index) is expected; a corrupt or outdated one was warned about.
        log.info("context index rebuilt", path=str(self.path), reason=reason, contexts=indexed)
        return indexed

    @staticmethod
    def _scan_one(db: sqlite3.Connection, directory: Path) -> int:
        try:
            db.execute(UPSERT, row_of(summarize(directory), directory))
        except (OSError, CorruptRecordError) as exc:
            if directory.is_dir():
                _mark_damaged(db, directory, str(exc))
            return 0
        return 1

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
        where = _filters(status, repository, user, uuid_prefix, location)
        return [
            IndexEntry(
                uuid=r[0], status=r[1], created_at=datetime.fromtimestamp(r[2], UTC),
                ended_at=None if r[3] is None else datetime.fromtimestamp(r[3], UTC),
                repository=r[4], user=r[5], task_type=r[6], task_id=r[7], title=r[8], steps=r[9], tokens=r[10],
                location=r[11], task_source=r[12], disk_bytes=r[13],
            )
            for r in self._newest(ENTRY_COLUMNS, where, limit, offset)
        ]

    def summaries(
        self, *, status: str | None = None, user: str | None = None, location: str | None = COMPLETED_DIR,
        limit: int | None = 50, offset: int = 0,
    ) -> list[ContextSummary]:
        """What the list prints, newest first, as of each context's last index write (final once completed);
        ``limit`` None: all of them."""
        rows = self._newest("summary", _filters(status, None, user, None, location), limit, offset)
        return [summary_from_json(row[0], self.root) for row in rows]

    def elsewhere(self, *, status: str | None = None, user: str | None = None) -> list[ContextSummary]:
        """One host: every running context is in this host's ``running/``."""
        return []

    def _newest(
        self, columns: str, where: tuple[str, list[Any]], limit: int | None, offset: int
    ) -> list[tuple[Any, ...]]:
        clauses, params = where
        sql = f"SELECT {columns} FROM contexts{clauses} ORDER BY created_at DESC, uuid DESC LIMIT ? OFFSET ?"  # noqa: S608
        rows = -1 if limit is None else max(limit, 0)  # SQLite: a negative limit is none
        return self._attempt(lambda: self._conn().execute(sql, [*params, rows, max(offset, 0)]).fetchall())

    def count(
        self,
        *,
        status: str | None = None,
        repository: str | None = None,
        user: str | None = None,
        uuid_prefix: str | None = None,
        location: str | None = None,
    ) -> int:
        """How many contexts match (a count of the tallies when only status, user and location filter)."""
        if repository is None and uuid_prefix is None:
            return self.totals(status=status, user=user, location=location).count
        where, params = _filters(status, repository, user, uuid_prefix, location)
        sql = f"SELECT COUNT(*) FROM contexts{where}"  # noqa: S608 - clauses are constants, values parameters
        return int(self._attempt(lambda: self._conn().execute(sql, params).fetchone()[0]))

    def totals(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        status: str | None = None,
        user: str | None = None,
        location: str | None = None,
    ) -> Totals:
        """Counts and sums of the contexts created in ``[since, until)`` (all without them): from the running
        tallies when no time bound is given, else from the context rows in that time range."""
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
        """The tallies :meth:`totals` folds (callers add tallies of contexts they read themselves)."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("status", status), ("user_key", user), ("location", location)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if since is None and until is None:
            where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
            sql = f"SELECT * FROM tallies{where}"  # noqa: S608
        else:
            for op, bound in ((">=", since), ("<", until)):
                if bound is not None:
                    clauses.append(f"created_at {op} ?")
                    params.append(bound.timestamp())
            sql = (  # clauses are constants, values parameters
                "SELECT location, status, user_key, COUNT(*), SUM(tokens), SUM(messages), SUM(compressions), "  # noqa: S608
                "IFNULL(SUM(duration_us), 0), COUNT(duration_us), SUM(disk_bytes), MAX(created_at), SUM(cost_nusd), "
                "SUM(priced) FROM contexts "
                "WHERE " + " AND ".join(clauses) + " GROUP BY location, status, user_key"
            )
        rows = self._attempt(lambda: self._conn().execute(sql, params).fetchall())
        return [Tally(*row) for row in rows]

    def ended_since(self, since: datetime) -> dict[str, int]:
        """Contexts that reached ``completed/`` since ``since``, by status (final ones, and any still completing)."""
        sql = "SELECT status, COUNT(*) FROM contexts WHERE ended_at >= ? AND location = 'completed' GROUP BY status"
        rows = self._attempt(lambda: self._conn().execute(sql, (since.timestamp(),)).fetchall())
        return {str(status): int(n) for status, n in rows}

    def damaged(self) -> list[Damaged]:
        """The contexts the index found unreadable when it last read them."""
        rows = self._attempt(lambda: self._conn().execute("SELECT uuid, location, reason FROM damaged").fetchall())
        return [Damaged(uuid, self.root / location / uuid, reason) for uuid, location, reason in sorted(rows)]
