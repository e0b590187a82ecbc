"""The durable copy of every context in PostgreSQL (SPEC §12), behind contexts/durable.py's Protocols.

A context's lines and its ``state.json`` reach the database at its step's commit point, in one transaction whose
every statement is conditional on the writer's lease: ``EXISTS (its uuid, epoch and holder ... FOR SHARE)``. The
share lock on the lease row holds until the commit, so a taker's epoch increment waits for a commit in flight and
a commit after the increment writes nothing; a fenced writer learns it from the row count, rolls back and raises
:class:`~contexts.errors.FencedError`. Nothing of it reaches the database from then on.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

from contexts.atomic import fsync_dir, write_json_atomic
from contexts.clock import parse_iso
from contexts.durable import Amendment, Committed
from contexts.errors import ContextCompletedError, ContextExistsError, ContextNotFoundError, FencedError, LockHeldError
from contexts.names import DIR_MODE, FILE_MODE, FINAL_STATUSES, JSONL_FILES, METADATA_FILE, RECORD_FILES, STATE_FILE
from fleet import lease
from fleet.errors import FleetUnavailable
from fleet.lease import Conn
from fleet.store import FleetStore

log = structlog.get_logger(__name__)

T = TypeVar("T")

RETRY_FIRST_S = 0.1  # a commit that found the database out of reach waits this long, then twice that, ...
RETRY_MAX_S = 2.0

# Each write is conditional on the lease this writer took, and locks its row against a taker until the commit.
_INSERT_LINES = """
INSERT INTO tasuki_records (uuid, file, id, epoch, line)
SELECT %(uuid)s, r.file, r.id, %(epoch)s, r.line::json
FROM unnest(%(files)s::text[], %(ids)s::bigint[], %(lines)s::text[]) AS r(file, id, line)
WHERE EXISTS (
    SELECT 1 FROM tasuki_leases
    WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
    FOR SHARE)
ON CONFLICT (uuid, file, id) DO NOTHING"""

# When fewer lines went in than were sent: the batch is whole when every line is there, the same text under this
# epoch (an earlier try committed it), and the lease is still this writer's.
_MINE_ALREADY = """
SELECT count(*) FROM tasuki_records AS r
JOIN unnest(%(files)s::text[], %(ids)s::bigint[], %(lines)s::text[]) AS b(file, id, line)
    ON r.file = b.file AND r.id = b.id AND r.line::text = b.line
WHERE r.uuid = %(uuid)s AND r.epoch = %(epoch)s AND EXISTS (
    SELECT 1 FROM tasuki_leases
    WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
    FOR SHARE)"""

# A cancel request someone else wrote (PostgresCopy.amend) stays, whatever the holder's own state says, and the
# holder learns of it from the answer.
_WRITE_STATE = """
UPDATE tasuki_contexts AS c
SET state = %(state)s::jsonb || CASE WHEN c.state @> '{"cancel_requested": true}'
                                     THEN '{"cancel_requested": true}'::jsonb ELSE '{}'::jsonb END,
    epoch = %(epoch)s, updated_at = now()
WHERE uuid = %(uuid)s AND EXISTS (
    SELECT 1 FROM tasuki_leases
    WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
    FOR SHARE)
RETURNING c.state @> '{"cancel_requested": true}'"""

# Someone other than the holder (PostgresCopy.amend): the row locked against every other writer until the write.
_LOCK_STATE = "SELECT state FROM tasuki_contexts WHERE uuid = %s FOR UPDATE"
_AMEND_STATE = "UPDATE tasuki_contexts SET state = %s::jsonb, updated_at = now() WHERE uuid = %s"

# Leases that ran out without a release (their holder lost, wherever it ran), of contexts not finished.
_EXPIRED = """
SELECT l.uuid FROM tasuki_leases AS l JOIN tasuki_contexts AS c ON c.uuid = l.uuid
WHERE l.holder IS NOT NULL AND l.expires_at <= now()
  AND NOT (coalesce(c.state->>'status', '') = ANY(%(final)s))
ORDER BY l.expires_at LIMIT %(limit)s"""

# An effect outside the context (a push, a forge write) holds the lease row, this writer's epoch, until it is over;
# a taker's epoch increment waits for it. The checkpoint recorded last comes with it: what a push is leased on.
_HOLD = """
SELECT c.head FROM tasuki_leases AS l LEFT JOIN tasuki_checkpoints AS c ON c.uuid = l.uuid
WHERE l.uuid = %(uuid)s AND l.epoch = %(epoch)s AND l.holder = %(holder)s
FOR SHARE OF l"""

# A holder stopped in the middle of an effect (SIGSTOP, a frozen VM) must not keep its taker out for ever: its
# session ends, and its row lock with it, once it has been idle in the transaction for the lease's length.
_HOLD_FOR_AT_MOST = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"

_RECORD_CHECKPOINT = """
INSERT INTO tasuki_checkpoints (uuid, epoch, head)
SELECT %(uuid)s, %(epoch)s, %(head)s
WHERE EXISTS (
    SELECT 1 FROM tasuki_leases
    WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
    FOR SHARE)
ON CONFLICT (uuid) DO UPDATE SET epoch = EXCLUDED.epoch, head = EXCLUDED.head, updated_at = now()"""

_CREATE = """
INSERT INTO tasuki_contexts (uuid, metadata, state, epoch) VALUES (%(uuid)s, %(metadata)s::jsonb, %(state)s::jsonb, 0)
ON CONFLICT (uuid) DO NOTHING
RETURNING uuid"""

# Finished contexts (whichever host ran them) whose copy was last written before a bound: retention's candidates.
_ENDED_BEFORE = """
SELECT uuid::text, state->>'completed_at', updated_at FROM tasuki_contexts
WHERE updated_at < %(before)s AND coalesce(state->>'status', '') = ANY(%(final)s)
ORDER BY updated_at LIMIT %(limit)s"""

# Retention's delete: the context's row locked against every writer, and gone only while its status is final (its
# lines go with it, ON DELETE CASCADE); its lease and its checkpoint in the same transaction.
_LOCK_STATUS = "SELECT coalesce(state->>'status', '') FROM tasuki_contexts WHERE uuid = %s FOR UPDATE"
_FORGET = (
    "DELETE FROM tasuki_contexts WHERE uuid = %s",
    "DELETE FROM tasuki_leases WHERE uuid = %s",
    "DELETE FROM tasuki_checkpoints WHERE uuid = %s",
)

_COMMITTED = """
SELECT c.metadata, c.state, l.holder, l.epoch, l.holder IS NOT NULL AND l.expires_at > now()
FROM tasuki_contexts AS c LEFT JOIN tasuki_leases AS l ON l.uuid = c.uuid
WHERE c.uuid = %s"""


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)


class PostgresWriter:
    """One holder's writes to one context under the epoch it took; lines wait in memory for the step's commit."""

    def __init__(
        self, store: FleetStore, uuid: str, holder: str, epoch: int, *, cancel_requested: bool = False
    ) -> None:
        self.store = store
        self.uuid = uuid
        self.holder = holder
        self.epoch = epoch
        self.fenced = False
        self.cancel_requested = cancel_requested
        self.retries = 0  # commits tried again after the database was out of reach
        self._staged: list[tuple[str, int, str]] = []
        self._guard = threading.Lock()  # one commit at a time (the task's, a compression's, a release's)

    def _fence(self, what: str) -> FencedError:
        self.fenced = True
        self._staged.clear()
        log.error("fenced by the fleet's lease", uuid=self.uuid, epoch=self.epoch, at=what)
        return FencedError(f"{self.uuid}: lease epoch {self.epoch} was taken over; this holder stops writing")

    def _params(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "epoch": self.epoch, "holder": self.holder}

    def check(self) -> None:
        """Raise :class:`FencedError` once a renewal or a commit found the lease taken over."""
        if self.fenced:
            raise FencedError(f"{self.uuid}: lease epoch {self.epoch} was taken over; this holder stops writing")

    def renew(self) -> None:
        """Extend the lease; :class:`FencedError` when another epoch took the task."""
        self.check()
        # Not under the commit's guard: a commit waiting for the database must not hold up the heartbeat (which
        # refreshes the host's lock and the Redis index after this).
        if not self.store.renew(self.uuid, self.epoch, self.holder):
            raise self._fence("renew")

    def record(self, file: str, record_id: int, line: str) -> None:
        """Stage one appended line for the next commit."""
        self.check()
        self._staged.append((file, record_id, line))

    def commit(self, state: Mapping[str, Any] | None) -> None:
        """The staged lines and ``state`` in one transaction under this epoch, or nothing and :class:`FencedError`.

        A database out of reach (restarting, a network blip) is tried again until ``lease_s`` has passed: past
        that another host may have taken the task, and :class:`FleetUnavailable` reaches the step. A try whose
        commit landed but whose answer was lost is found by the next one (its own lines, under its own epoch)."""
        self.check()
        with self._guard:
            staged = list(self._staged)
            if not staged and state is None:
                return
            self._until_reached("commit", lambda: self._commit_once(staged, state))
            del self._staged[: len(staged)]

    def _commit_once(self, staged: list[tuple[str, int, str]], state: Mapping[str, Any] | None) -> None:
        with self.store.connection() as conn:
            if not self._write(conn, staged, state):
                conn.rollback()
                raise self._fence("commit")

    def _until_reached(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, tried again while the database is out of reach (restarting, a network blip), waiting
        0.1 s, then twice as long each time up to 2 s, until ``lease_s`` has passed: past that another host may
        have taken the task, and :class:`FleetUnavailable` reaches the caller."""
        deadline = time.monotonic() + self.store.lease_s
        delay = RETRY_FIRST_S
        while True:
            try:
                return attempt()
            except FleetUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    # Past lease_s another host may hold the task: this holder writes and does nothing more here
                    # (the step hands the task back; whoever takes it next resumes from the last commit).
                    self.fenced = True
                    raise
                self.retries += 1
                log.warning("fleet store unreachable; trying again", uuid=self.uuid, at=what, error=str(exc)[:200])
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    def _write(self, conn: Conn, staged: list[tuple[str, int, str]], state: Mapping[str, Any] | None) -> bool:
        params = self._params()
        if staged:
            files, ids, lines = (list(column) for column in zip(*staged, strict=True))
            batch = {**params, "files": files, "ids": ids, "lines": lines}
            inserted = conn.execute(_INSERT_LINES, batch).rowcount
            if inserted != len(staged) and conn.execute(_MINE_ALREADY, batch).fetchone() != (len(staged),):
                return False  # fenced, or a line of another epoch where this one's belongs
        if state is not None:
            row = conn.execute(_WRITE_STATE, {**params, "state": _json(state)}).fetchone()
            if row is None:
                return False
            self.cancel_requested = bool(row[0])
        return True

    @contextmanager
    def hold(self, checkpoint: str | None = None) -> Iterator[str | None]:
        """Hold this epoch's lease row (``FOR SHARE``) through one effect outside the context; yield the checkpoint
        recorded last, and record ``checkpoint`` (when given) under this epoch in the same transaction once the
        effect returned. :class:`FencedError` before the effect when the epoch is no longer this writer's.

        Not under the commit's guard: a checkpoint's push runs beside the next step, whose commit must not wait
        for it (their share locks on the lease row do not conflict)."""
        self.check()
        with ExitStack() as held:
            conn, recorded = self._until_reached("effect", lambda: self._take_hold(held))
            yield recorded
            try:
                with held:  # an error here passes through the transaction: rolled back, FleetUnavailable
                    self._record(conn, checkpoint)
            except FleetUnavailable as exc:
                # The session ended under the effect (the server's timeout of a holder stopped past lease_s, or a
                # lost connection), so a taker may have come in meanwhile: the effect is done, and whether the epoch
                # is still this writer's (and its record) is settled in a transaction of its own.
                log.warning("effect's hold lost; confirming the lease", uuid=self.uuid, error=str(exc)[:200])
                self._until_reached("record", lambda: self._confirm(checkpoint))

    def _take_hold(self, held: ExitStack) -> tuple[Conn, str | None]:
        """Open the effect's transaction (kept open in ``held``) and lock this epoch's lease row in it."""
        with ExitStack() as attempt:
            conn = attempt.enter_context(self.store.connection())
            conn.execute(_HOLD_FOR_AT_MOST, (f"{max(1, round(self.store.lease_s * 1000))}",))
            row = conn.execute(_HOLD, self._params()).fetchone()
            if row is None:
                raise self._fence("effect")
            held.push(attempt.pop_all())
        return conn, None if row[0] is None else str(row[0])

    def _record(self, conn: Conn, checkpoint: str | None) -> None:
        """Record ``checkpoint`` under this epoch (nothing when None); :class:`FencedError` once it is not ours."""
        if (
            checkpoint is not None
            and conn.execute(_RECORD_CHECKPOINT, {**self._params(), "head": checkpoint}).rowcount != 1
        ):
            raise self._fence("record")

    def _confirm(self, checkpoint: str | None) -> None:
        """After a hold was lost: record ``checkpoint`` under this epoch, or (None) see that the lease is still this
        writer's; :class:`FencedError` when it is not."""
        with self.store.connection() as conn:
            if checkpoint is not None:
                self._record(conn, checkpoint)
            elif not lease.holds(conn, self.uuid, self.epoch, self.holder):
                raise self._fence("effect")

    def release(self) -> None:
        """Free the lease for the next taker (nothing more is written under this epoch). Best effort: a store out
        of reach lets the lease run out instead, and the next taker waits ``lease_s``."""
        with self._guard:
            self._staged.clear()
            try:
                if not self.fenced:
                    self.store.release(self.uuid, self.epoch, self.holder)
            except FleetUnavailable as exc:
                log.warning("lease not released; it runs out instead", uuid=self.uuid, error=str(exc)[:300])
            finally:
                self.fenced = True  # released: any later write is refused here, before the database


class PostgresCopy:
    """The fleet's contexts in PostgreSQL: :class:`contexts.durable.DurableCopy` for ``fleet.store``."""

    def __init__(self, store: FleetStore) -> None:
        self.store = store

    def create(self, uuid: str, holder: str, metadata: Mapping[str, Any], state: Mapping[str, Any]) -> PostgresWriter:
        """Record a new context and take its first lease, in one transaction."""
        with self.store.connection() as conn:
            made = conn.execute(_CREATE, {"uuid": uuid, "metadata": _json(metadata), "state": _json(state)}).fetchone()
            if made is None:
                raise ContextExistsError(f"context {uuid} already exists in the fleet's store")
            epoch = lease.take(conn, uuid, holder, self.store.lease_s)
            if epoch is None:  # a lease without a context: left by a create that failed after taking it
                raise LockHeldError(f"context {uuid}: its lease is held by another holder")
            conn.execute("UPDATE tasuki_contexts SET epoch = %s WHERE uuid = %s", (epoch, uuid))
        return PostgresWriter(self.store, uuid, holder, epoch)

    def take(self, uuid: str, holder: str) -> PostgresWriter:
        """Take the lease of a known context: a new epoch, which fences whoever held it before."""
        with self.store.connection() as conn:
            found = conn.execute(
                "SELECT state->>'status', state @> '{\"cancel_requested\": true}' FROM tasuki_contexts WHERE uuid = %s",
                (uuid,),
            ).fetchone()
            if found is None:
                raise ContextNotFoundError(f"no context {uuid} in the fleet's store")
            if found[0] in FINAL_STATUSES:
                raise ContextCompletedError(f"context {uuid} is already {found[0]}")
            epoch = lease.take(conn, uuid, holder, self.store.lease_s)
            if epoch is None:
                current = lease.read(conn, uuid)
                raise LockHeldError(f"context {uuid}: leased by {current.holder if current else 'another holder'}")
        return PostgresWriter(self.store, uuid, holder, epoch, cancel_requested=bool(found[1]))

    def knows(self, uuid: str) -> bool:
        """Whether the fleet's store has the context."""
        with self.store.connection() as conn:
            return conn.execute("SELECT 1 FROM tasuki_contexts WHERE uuid = %s", (uuid,)).fetchone() is not None

    def committed(self, uuid: str) -> Committed | None:
        """The context's metadata, last committed state and lease, its liveness judged by the database's clock."""
        with self.store.connection() as conn:
            row = conn.execute(_COMMITTED, (uuid,)).fetchone()
        if row is None:
            return None
        metadata, state, holder, epoch, live = row
        return Committed(metadata, state, f"{holder}#{epoch}" if holder else None, bool(live))

    def amend(self, uuid: str, change: Amendment) -> Mapping[str, Any] | None:
        """Someone other than the holder writes the committed state (a cancel request, usage metered after the end):
        ``change`` decides from the state as it is, the row locked until the write lands, under no lease. The
        holder's own commits keep the ``cancel_requested`` written here (``_WRITE_STATE``)."""
        with self.store.connection() as conn:
            row = conn.execute(_LOCK_STATE, (uuid,)).fetchone()
            if row is None:
                return None
            current: dict[str, Any] = row[0]
            changed = change(dict(current))
            if changed is None:
                return current
            conn.execute(_AMEND_STATE, (_json(changed), uuid))
        return changed

    def expired(self, limit: int = 1000) -> list[str]:
        """Unfinished contexts whose lease ran out without a release, by the database's clock, oldest first."""
        with self.store.connection() as conn:
            found = conn.execute(_EXPIRED, {"final": sorted(FINAL_STATUSES), "limit": limit}).fetchall()
        return [str(row[0]) for row in found]

    def ended_before(self, before: datetime, limit: int = 10_000) -> list[tuple[str, datetime]]:
        """Finished contexts of every host whose copy was last written before ``before`` by the database's clock,
        oldest first, each with its ``completed_at`` (the last write's time when the state has none readable)."""
        with self.store.connection() as conn:
            rows = conn.execute(
                _ENDED_BEFORE, {"before": before, "final": sorted(FINAL_STATUSES), "limit": limit}
            ).fetchall()
        return [(str(uuid), _moment(completed_at, updated_at)) for uuid, completed_at, updated_at in rows]

    def forget(self, uuid: str) -> bool:
        """Delete the context's copy, lease and checkpoint in one transaction, only when its status is final."""
        with self.store.connection() as conn:
            row = conn.execute(_LOCK_STATUS, (uuid,)).fetchone()
            if row is None:
                return True  # forgotten before (another host's pass), or never copied
            if row[0] not in FINAL_STATUSES:
                return False
            for statement in _FORGET:
                conn.execute(statement, (uuid,))
        return True

    def rebuild(self, uuid: str, directory: Path) -> None:
        """Write the context's files into ``directory`` (created 0700 if missing) as its committed steps left them:
        the same names and schemas as on the host that wrote them (SPEC §3), each JSONL line byte for byte."""
        with self.store.connection() as conn:
            row = conn.execute("SELECT metadata, state FROM tasuki_contexts WHERE uuid = %s", (uuid,)).fetchone()
            if row is None:
                raise ContextNotFoundError(f"no context {uuid} in the fleet's store")
            metadata, state = row
            lines: dict[str, list[str]] = {name: [] for name in RECORD_FILES}
            for file, line in conn.execute(
                "SELECT file, line::text FROM tasuki_records WHERE uuid = %s ORDER BY file, id", (uuid,)
            ):
                lines[str(file)].append(str(line))
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        write_json_atomic(directory / METADATA_FILE, metadata)
        write_json_atomic(directory / STATE_FILE, state)
        for name, text in lines.items():
            if text or name in JSONL_FILES:  # requests.jsonl only where the context recorded a request
                _write_lines(directory / name, text)
        fsync_dir(directory)


def _moment(text: str | None, fallback: datetime) -> datetime:
    """``completed_at`` as the state wrote it, or ``fallback`` when it is missing or unreadable."""
    try:
        return parse_iso(text) if text else fallback
    except ValueError:
        return fallback


def _write_lines(path: Path, lines: list[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            for line in lines:
                handle.write(line.encode() + b"\n")
            handle.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
