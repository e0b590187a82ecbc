"""The embedded :class:`~contexts.outcomes.OutcomeStore`: one SQLite file (WAL) beside the contexts,
``<root>/outcomes.sqlite3``.

Unlike the context index it mirrors nothing: what the forge said about a request is known only here, so it is
never rebuilt or thrown away. A report reads one aggregate per group and state (``GROUP BY`` over an index by
opening time) and the merged requests' times to merge, never the contexts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from contexts.errors import ContextError
from contexts.names import OUTCOMES_FILE
from contexts.outcomes import (
    LAST_REVIEW_ENTRIES,
    OutcomeGroup,
    PullOutcome,
    Selection,
    week_of,
)
from contexts.sqlite_files import create_private, immediate, open_wal
from contexts.totals import nano_usd

BUSY_TIMEOUT_S = 30.0
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS pulls (
    pull TEXT PRIMARY KEY,
    thread TEXT NOT NULL,
    repository TEXT NOT NULL,
    number INTEGER NOT NULL,
    url TEXT NOT NULL,
    branch TEXT NOT NULL,
    model TEXT NOT NULL,
    first_uuid TEXT NOT NULL,
    started_at REAL NOT NULL,
    opened_at REAL NOT NULL,
    week TEXT NOT NULL,
    state TEXT NOT NULL,
    closed_at REAL,
    merge_s REAL,
    followups INTEGER NOT NULL DEFAULT 0,
    review_comments INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost_nusd INTEGER NOT NULL DEFAULT 0,
    priced INTEGER NOT NULL DEFAULT 0,
    last_review TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS pulls_opened ON pulls (opened_at);
CREATE INDEX IF NOT EXISTS pulls_repository ON pulls (repository, opened_at);
CREATE TABLE IF NOT EXISTS tallies (
    dim TEXT NOT NULL,
    key TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    followups INTEGER NOT NULL,
    review_comments INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    cost_nusd INTEGER NOT NULL,
    priced INTEGER NOT NULL,
    PRIMARY KEY (dim, key, state)
);
CREATE TABLE IF NOT EXISTS medians (dim TEXT NOT NULL, key TEXT NOT NULL, merge_s REAL NOT NULL,
    PRIMARY KEY (dim, key));
CREATE TABLE IF NOT EXISTS pull_tasks (
    pull TEXT NOT NULL,
    uuid TEXT NOT NULL,
    followup INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    cost_nusd INTEGER NOT NULL,
    priced INTEGER NOT NULL,
    PRIMARY KEY (pull, uuid)
);
-- A review can come before the request is recorded (a job writes it after the first task ends): it waits here
-- and is folded in when the request is.
CREATE TABLE IF NOT EXISTS early_reviews (id INTEGER PRIMARY KEY, pull TEXT NOT NULL, entries TEXT NOT NULL);
"""
_COLUMNS = {"repo": "repository", "model": "model", "week": "week"}
SEP = "\x1f"  # between the parts of a tally key (no repository, model or week name holds it)
# Each request counts in one tally row per dimension (and its state): a report without a time range reads the rows
# of one dimension, never the requests. A dimension is the columns its key is made of.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "all": (), "repo": ("repository",), "model": ("model",), "week": ("week",),
    "repo-model": ("repository", "model"), "repo-week": ("repository", "week"),
}


def _key_sql(columns: tuple[str, ...], row: str) -> str:
    return f" || '{SEP}' || ".join(f"{row}.{c}" for c in columns) if columns else "'all'"


def _tally_sql() -> list[str]:
    """The triggers that keep ``tallies``, and the indexes a group's median is read from (merged requests by their
    time to merge, per dimension)."""
    add, remove = [], []
    for dim, columns in DIMENSIONS.items():
        add.append(
            f"INSERT INTO tallies VALUES ('{dim}', {_key_sql(columns, 'new')}, new.state, 1, new.followups, "  # noqa: S608
            "new.review_comments, new.tokens, new.cost_nusd, new.priced) ON CONFLICT DO UPDATE SET n = n + 1, "
            "followups = followups + excluded.followups, review_comments = review_comments + excluded.review_comments, "
            "tokens = tokens + excluded.tokens, cost_nusd = cost_nusd + excluded.cost_nusd, "
            "priced = priced + excluded.priced;")
        remove.append(
            "UPDATE tallies SET n = n - 1, followups = followups - old.followups, "  # noqa: S608 - names are constants
            "review_comments = review_comments - old.review_comments, tokens = tokens - old.tokens, "
            "cost_nusd = cost_nusd - old.cost_nusd, priced = priced - old.priced "
            f"WHERE dim = '{dim}' AND key = {_key_sql(columns, 'old')} AND state = old.state;")
    remove.append("DELETE FROM tallies WHERE n <= 0;")
    adds, removes = " ".join(add), " ".join(remove)
    statements = [
        f"CREATE TRIGGER IF NOT EXISTS tally_insert AFTER INSERT ON pulls BEGIN {adds} END",
        f"CREATE TRIGGER IF NOT EXISTS tally_delete AFTER DELETE ON pulls BEGIN {removes} END",
        f"CREATE TRIGGER IF NOT EXISTS tally_update AFTER UPDATE ON pulls BEGIN {removes} {adds} END",
    ]
    for dim, columns in DIMENSIONS.items():
        name = dim.replace("-", "_")
        indexed = ", ".join(("state", *columns, "merge_s"))
        statements.append(f"CREATE INDEX IF NOT EXISTS merged_{name} ON pulls ({indexed})")
    return statements


TALLY_SQL = _tally_sql()
def _add_review(db: sqlite3.Connection, pull: str, entries: Sequence[dict[str, Any]]) -> bool:
    """Count a review's entries on the request and keep the newest; False when the request is not recorded."""
    row = db.execute("SELECT last_review FROM pulls WHERE pull = ?", (pull,)).fetchone()
    if row is None:
        return False
    kept = [*json.loads(row[0]), *entries][-LAST_REVIEW_ENTRIES:]
    db.execute("UPDATE pulls SET last_review = ?, review_comments = review_comments + ? WHERE pull = ?",
               (json.dumps(kept, ensure_ascii=False), len(entries), pull))
    return True


_TOTALS = """
UPDATE pulls SET followups = (SELECT COUNT(*) FROM pull_tasks t WHERE t.pull = pulls.pull AND t.followup = 1),
    tokens = (SELECT IFNULL(SUM(tokens), 0) FROM pull_tasks t WHERE t.pull = pulls.pull),
    cost_nusd = (SELECT IFNULL(SUM(cost_nusd), 0) FROM pull_tasks t WHERE t.pull = pulls.pull),
    priced = (SELECT IFNULL(MAX(priced), 0) FROM pull_tasks t WHERE t.pull = pulls.pull)
WHERE pull = ?
"""


class OutcomesUnavailable(ContextError):
    """The outcome store cannot be opened or written."""


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def _moment(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _day_start(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def _where(selection: Selection) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if selection.repository is not None:
        clauses.append("repository = ?")
        params.append(selection.repository)
    if selection.since is not None:
        clauses.append("opened_at >= ?")
        params.append(_day_start(selection.since))
    if selection.until is not None:
        clauses.append("opened_at < ?")
        params.append(_day_start(selection.until + timedelta(days=1)))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class SQLiteOutcomeStore:
    """Outcomes in ``<root>/outcomes.sqlite3``; safe to share between threads, reopened after a fork."""

    def __init__(self, root: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(root) / OUTCOMES_FILE
        self.busy_timeout_s = busy_timeout_s
        self._guard = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._pid = -1
        self._attempt(self._conn)

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None and self._pid == os.getpid():
            return self._db
        create_private(self.path)
        db = open_wal(self.path, self.busy_timeout_s)
        db.executescript(SCHEMA)
        for statement in TALLY_SQL:
            db.execute(statement)
        self._db, self._pid = db, os.getpid()  # a parent's connection is left alone after a fork, never closed
        return db

    def _attempt(self, action: Callable[[], T]) -> T:
        with self._guard:
            try:
                return action()
            except sqlite3.Error as exc:
                raise OutcomesUnavailable(f"outcome store {self.path}: {exc}") from None

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self._conn())

    def close(self) -> None:
        """Close the connection (the next call reopens it)."""
        with self._guard:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

    # -- writers -------------------------------------------------------------------------------------

    def opened(self, outcome: PullOutcome) -> bool:
        """Record a request a task opened; False when it was recorded already."""

        def insert() -> bool:
            with self._write() as db:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO pulls (pull, thread, repository, number, url, branch, model, first_uuid, "
                    "started_at, opened_at, week, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open')",
                    (outcome.pull, outcome.thread, outcome.repository, outcome.number, outcome.url, outcome.branch,
                     outcome.model, outcome.first_uuid, _epoch(outcome.started_at), _epoch(outcome.opened_at),
                     week_of(outcome.opened_at)),
                )
                early = db.execute("SELECT entries FROM early_reviews WHERE pull = ? ORDER BY id",
                                   (outcome.pull,)).fetchall()
                if cursor.rowcount == 1 and early:
                    _add_review(db, outcome.pull, [e for (raw,) in early for e in json.loads(raw)])
                db.execute("DELETE FROM early_reviews WHERE pull = ?", (outcome.pull,))
                return cursor.rowcount == 1

        return self._attempt(insert)

    def add_task(self, pull: str, uuid: str, *, followup: bool, tokens: int, cost_usd: float | None) -> bool:
        """Count a task of the request's thread; its totals are summed again from its tasks."""

        def upsert() -> bool:
            with self._write() as db:
                if not db.execute("SELECT 1 FROM pulls WHERE pull = ?", (pull,)).fetchone():
                    return False
                db.execute("INSERT OR REPLACE INTO pull_tasks VALUES (?, ?, ?, ?, ?, ?)",
                           (pull, uuid, int(followup), tokens, nano_usd(cost_usd), int(cost_usd is not None)))
                db.execute(_TOTALS, (pull,))
                return True

        return self._attempt(upsert)

    def note_review(self, pull: str, entries: Sequence[dict[str, Any]]) -> bool:
        """Count review comments and keep the newest ``LAST_REVIEW_ENTRIES``; a review of a request not recorded
        yet waits for it (False)."""

        def update() -> bool:
            with self._write() as db:
                if _add_review(db, pull, entries):
                    return True
                db.execute("INSERT INTO early_reviews (pull, entries) VALUES (?, ?)",
                           (pull, json.dumps(list(entries), ensure_ascii=False)))
                return False

        return self._attempt(update)

    def ended(self, pull: str, *, merged: bool, at: datetime, review_comments: int | None = None) -> str | None:
        """Merged or closed: the previous state (None: no task opened it)."""

        def update() -> str | None:
            with self._write() as db:
                row = db.execute("SELECT state, started_at FROM pulls WHERE pull = ?", (pull,)).fetchone()
                if row is None:
                    return None
                merge_s = max(_epoch(at) - row[1], 0.0) if merged else None
                db.execute(
                    "UPDATE pulls SET state = ?, closed_at = ?, merge_s = ?, "
                    "review_comments = MAX(review_comments, ?) WHERE pull = ?",
                    ("merged" if merged else "closed", _epoch(at), merge_s, review_comments or 0, pull),
                )
                _remedian(db, pull)
                return str(row[0])

        return self._attempt(update)

    def reopened(self, pull: str) -> str | None:
        """Open again: the previous state (None: no task opened it)."""

        def update() -> str | None:
            with self._write() as db:
                row = db.execute("SELECT state FROM pulls WHERE pull = ?", (pull,)).fetchone()
                if row is None:
                    return None
                db.execute("UPDATE pulls SET state = 'open', closed_at = NULL, merge_s = NULL WHERE pull = ?", (pull,))
                _remedian(db, pull)
                return str(row[0])

        return self._attempt(update)

    # -- readers -------------------------------------------------------------------------------------

    def get(self, pull: str) -> PullOutcome | None:
        """One request's outcome."""

        def read() -> PullOutcome | None:
            db = self._conn()
            row = db.execute(
                "SELECT pull, thread, repository, number, url, branch, model, first_uuid, started_at, opened_at, "
                "state, closed_at, followups, review_comments, tokens, cost_nusd, priced, last_review "
                "FROM pulls WHERE pull = ?", (pull,)).fetchone()
            if row is None:
                return None
            tasks = [r[0] for r in db.execute("SELECT uuid FROM pull_tasks WHERE pull = ? ORDER BY followup, rowid",
                                              (pull,))]
            return PullOutcome(
                pull=row[0], thread=row[1], repository=row[2], number=row[3], url=row[4], branch=row[5],
                model=row[6], first_uuid=row[7], started_at=_moment(row[8]) or datetime.now(UTC),
                opened_at=_moment(row[9]) or datetime.now(UTC), state=row[10], closed_at=_moment(row[11]),
                followups=row[12], review_comments=row[13], tokens=row[14],
                cost_usd=row[15] / 1e9 if row[16] else None, tasks=tuple(tasks),
                last_review=tuple(json.loads(row[17])),
            )

        return self._attempt(read)

    def groups(self, by: str | None, selection: Selection) -> list[OutcomeGroup]:
        """The selection's aggregates: from the tallies (and the medians from the merged requests' indexes) when no
        time range is given; a time range reads the requests opened in it (by the index on their opening time)."""
        if selection.since is not None or selection.until is not None:
            return self._attempt(lambda: self._scan(by, selection))
        return self._attempt(lambda: self._tallied(by, selection.repository))

    def _tallied(self, by: str | None, repository: str | None) -> list[OutcomeGroup]:
        dim = {None: "all", "repo": "repo", "model": "model", "week": "week"}[by]
        prefix = None
        if repository is not None:
            dim, prefix = {"all": ("repo", None), "repo": ("repo", None), "model": ("repo-model", repository),
                           "week": ("repo-week", repository)}[dim]
        db = self._conn()
        sql = "SELECT key, state, n, followups, review_comments, tokens, cost_nusd, priced FROM tallies WHERE dim = ?"
        if prefix is not None:
            rows = db.execute(sql + " AND key >= ? AND key < ?", (dim, prefix + SEP, prefix + chr(ord(SEP) + 1)))
        elif repository is not None:
            rows = db.execute(sql + " AND key = ?", (dim, repository))
        else:
            rows = db.execute(sql, (dim,))
        found = _fold(rows)
        medians = dict(db.execute("SELECT key, merge_s FROM medians WHERE dim = ?", (dim,)).fetchall()) \
            if found else {}
        return [OutcomeGroup("all" if by is None else key.split(SEP)[-1], g["counts"], g["followups"],
                             g["review_comments"], g["tokens"], g["cost"] / 1e9 if g["priced"] else None,
                             medians.get(key))
                for key, g in found.items()]

    def _scan(self, by: str | None, selection: Selection) -> list[OutcomeGroup]:
        column = _COLUMNS[by] if by is not None else "'all'"
        where, params = _where(selection)
        sums = (f"SELECT {column}, state, COUNT(*), SUM(followups), SUM(review_comments), SUM(tokens), "  # noqa: S608
                f"SUM(cost_nusd), SUM(priced) FROM pulls{where} GROUP BY 1, 2")
        times = f"SELECT {column}, merge_s FROM pulls{where} AND state = 'merged'"  # noqa: S608 - constants
        db = self._conn()
        found = _fold(db.execute(sums, params))
        merge: dict[str, list[float]] = {}
        for key, seconds in db.execute(times, params):
            merge.setdefault(str(key), []).append(seconds)
        return [
            OutcomeGroup(key, g["counts"], g["followups"], g["review_comments"], g["tokens"],
                         g["cost"] / 1e9 if g["priced"] else None,
                         statistics.median(merge[key]) if merge.get(key) else None)
            for key, g in found.items()
        ]


def _remedian(db: sqlite3.Connection, pull: str) -> None:
    """The medians of the groups ``pull`` counts in, again (after it was merged, closed or reopened): each read by
    offset from its dimension's index of merged requests, so that a report reads one median per group."""
    row = db.execute("SELECT repository, model, week FROM pulls WHERE pull = ?", (pull,)).fetchone()
    values = dict(zip(("repository", "model", "week"), row, strict=True))
    for dim, columns in DIMENSIONS.items():
        parts = [values[c] for c in columns]
        key = SEP.join(parts) if columns else "all"
        where = "".join(f" AND {c} = ?" for c in columns)
        merged = db.execute(f"SELECT COUNT(*) FROM pulls WHERE state = 'merged'{where}", parts).fetchone()[0]  # noqa: S608
        found = [r[0] for r in db.execute(
            f"SELECT merge_s FROM pulls INDEXED BY merged_{dim.replace('-', '_')} "  # noqa: S608 - constants
            f"WHERE state = 'merged'{where} ORDER BY merge_s LIMIT ? OFFSET ?",
            (*parts, 2 - merged % 2, max(merged - 1, 0) // 2))]
        if found:
            db.execute("INSERT OR REPLACE INTO medians VALUES (?, ?, ?)", (dim, key, statistics.fmean(found)))
        else:
            db.execute("DELETE FROM medians WHERE dim = ? AND key = ?", (dim, key))


def _fold(rows: Iterable[tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """Rows of (key, state, n, followups, review comments, tokens, cost, priced) folded by key."""
    found: dict[str, dict[str, Any]] = {}
    for key, state, n, followups, reviews, tokens, cost, priced in rows:
        group = found.setdefault(str(key), {"counts": {}, "followups": 0, "review_comments": 0, "tokens": 0,
                                            "cost": 0, "priced": 0})
        group["counts"][state] = group["counts"].get(state, 0) + n
        group["followups"] += followups
        group["review_comments"] += reviews
        group["tokens"] += tokens
        group["cost"] += cost
        group["priced"] += priced
    return found
