"""Ownership of a task across hosts (SPEC §12): one lease row per task with an ``epoch`` fencing token.

Every decision is one conditional statement judged by the database's clock (``now()``), never a worker's: a host
whose clock is minutes off neither steals a live lease nor keeps an expired one. Taking a task increments the
epoch, so whatever a previous holder still tries under its old epoch fails (:mod:`fleet.durable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

Conn = psycopg.Connection[tuple[Any, ...]]  # rows as tuples of whatever the columns hold

_TAKE = """
INSERT INTO tasuki_leases AS lease (uuid, epoch, holder, expires_at)
VALUES (%(uuid)s, 1, %(holder)s, now() + make_interval(secs => %(lease_s)s))
ON CONFLICT (uuid) DO UPDATE
    SET epoch = lease.epoch + 1, holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE lease.holder IS NULL OR lease.expires_at <= now()
RETURNING epoch"""

_RENEW = """
UPDATE tasuki_leases SET expires_at = now() + make_interval(secs => %(lease_s)s)
WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
RETURNING epoch"""

_RELEASE = """
UPDATE tasuki_leases SET holder = NULL, expires_at = now()
WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s
RETURNING epoch"""

_READ = "SELECT epoch, holder, expires_at, expires_at <= now() FROM tasuki_leases WHERE uuid = %s"

_HOLDS = "SELECT 1 FROM tasuki_leases WHERE uuid = %(uuid)s AND epoch = %(epoch)s AND holder = %(holder)s"


@dataclass(frozen=True)
class LeaseRow:
    """A lease as the database has it; ``expired`` is judged by the database's clock."""

    epoch: int
    holder: str | None
    expired: bool


def take(conn: Conn, uuid: str, holder: str, lease_s: float) -> int | None:
    """Take the task's lease when it is free, released or expired: the new epoch; None while another holds it.

    Concurrent takers serialize on the row: the loser re-reads it after the winner's commit and finds it live."""
    row = conn.execute(_TAKE, {"uuid": uuid, "holder": holder, "lease_s": lease_s}).fetchone()
    return int(row[0]) if row else None


def renew(conn: Conn, uuid: str, epoch: int, holder: str, lease_s: float) -> bool:
    """Extend the lease by ``lease_s`` from the database's now; False when fenced (another epoch took it)."""
    return (
        conn.execute(_RENEW, {"uuid": uuid, "epoch": epoch, "holder": holder, "lease_s": lease_s}).fetchone()
        is not None
    )


def release(conn: Conn, uuid: str, epoch: int, holder: str) -> bool:
    """Free the lease at once (the next taker need not wait for expiry); False when it was no longer ours."""
    return conn.execute(_RELEASE, {"uuid": uuid, "epoch": epoch, "holder": holder}).fetchone() is not None


def holds(conn: Conn, uuid: str, epoch: int, holder: str) -> bool:
    """Whether the lease is still this holder's epoch (expired or not: only a taker's new epoch fences)."""
    return conn.execute(_HOLDS, {"uuid": uuid, "epoch": epoch, "holder": holder}).fetchone() is not None


def read(conn: Conn, uuid: str) -> LeaseRow | None:
    """The task's lease, or None when it never had one."""
    row = conn.execute(_READ, (uuid,)).fetchone()
    if row is None:
        return None
    epoch, holder, _expires_at, expired = row
    return LeaseRow(int(epoch), None if holder is None else str(holder), bool(expired))
