"""The fleet's store (``fleet.store: postgresql://...``): a connection pool on one PostgreSQL, its schema migrated on
open, and the lease operations every host runs (SPEC §12)."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
import psycopg_pool
import structlog
from psycopg.conninfo import conninfo_to_dict

from contexts.masking import mask
from fleet import lease, schema
from fleet.errors import FleetUnavailable
from fleet.lease import Conn, LeaseRow

log = structlog.get_logger(__name__)

POOL_MAX = 4  # a worker process: its task's writes, its heartbeat's renewals, and a reader or two
# A pooled connection is checked (an empty query: one round trip) before it is handed out; for a read (reading())
# not when its last use ended without error this recently: a recall's five searches in a row paid five checks, half
# its round trips. A restarted server is down for seconds, so a connection it dropped is still checked; one lost
# within this second fails the read, as a connection lost just after its check would (memory: MemoryUnavailable,
# and the task goes on without it). Writes are always checked.
CHECKED_RECENTLY_S = 1.0


def connection_limits(url: str, timeout_s: float, lease_s: float) -> dict[str, int | str]:
    """libpq's limits, each ``timeout_s``: on connecting, and on a connection whose other end went silent (a host cut
    off, packets dropped). What was sent and not acknowledged for ``timeout_s`` (``tcp_user_timeout``), or no answer
    to keepalive probes after ``timeout_s`` idle, ends the connection, on this side and, through the session's
    ``options``, on the server's. Without them a query, or the pool's check of an idle connection, waited for the
    kernel's retransmissions (about 15 minutes): a heartbeat, a commit or a delivery to be deferred hung past the lease;
    and the server kept the session of a holder cut off inside a transaction (a renewal whose answer or COMMIT was
    lost) for hours, its row lock on the lease with it, so that no host could take the task over. A session idle in
    a transaction for ``lease_s`` is ended too, as an effect's hold already was (``fleet/durable.py``)."""
    seconds = max(1, round(timeout_s))
    server = (
        f"-c tcp_user_timeout={seconds * 1000} -c tcp_keepalives_idle={seconds} -c tcp_keepalives_interval=1 "
        f"-c tcp_keepalives_count=3 -c idle_in_transaction_session_timeout={max(1, round(lease_s * 1000))}"
    )
    own = conninfo_to_dict(url).get("options")
    return {
        "connect_timeout": seconds,
        "tcp_user_timeout": seconds * 1000,
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "options": f"{own} {server}" if own else server,
    }


class FleetStore:
    """One PostgreSQL reached by every host. Opening it migrates the schema; every method is one transaction.

    ``open=False`` defers the connection to the first use: a reader that never touches the fleet's store (``tasuki
    context list`` today) neither waits for nor fails on it."""

    def __init__(self, url: str, *, lease_s: float = 60.0, connect_timeout_s: float = 5.0, open: bool = True) -> None:
        self.url = url
        self.lease_s = lease_s
        self.connect_timeout_s = connect_timeout_s
        self._pool: psycopg_pool.ConnectionPool[Conn] | None = None
        self._opening = threading.Lock()
        self._used: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()  # last use without error
        self._reader = threading.local()  # .reading: this thread is taking a connection for reading()
        if open:
            self.open()

    def open(self) -> None:
        """Connect and migrate the schema (once; later calls return at once). :class:`FleetUnavailable` when the
        database does not answer within ``connect_timeout_s``."""
        with self._opening:
            if self._pool is not None:
                return
            pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
                self.url,
                min_size=1,
                max_size=POOL_MAX,
                open=False,
                timeout=self.connect_timeout_s,
                check=self._check,  # a restarted server leaves dead connections
                kwargs=connection_limits(self.url, self.connect_timeout_s, self.lease_s),
                name="tasuki-fleet",
            )
            try:
                pool.open(wait=True, timeout=self.connect_timeout_s)
                with self._transaction(pool) as conn:
                    found = schema.migrate(conn)
            except psycopg_pool.PoolTimeout as exc:
                pool.close()
                raise self._unavailable(self._reason(exc)) from None
            except BaseException:
                pool.close()
                raise
            self._pool = pool
        if found < schema.LATEST:
            log.info("fleet store migrated", url=mask(self.url), version=schema.LATEST, previous=found)

    def _reason(self, timeout: BaseException) -> BaseException:
        """Why the pool got no connection (it only says that it timed out): one direct attempt tells."""
        try:
            psycopg.connect(self.url, connect_timeout=max(1, round(self.connect_timeout_s))).close()
        except psycopg.Error as exc:
            return exc
        return timeout

    def _unavailable(self, exc: BaseException) -> FleetUnavailable:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        return FleetUnavailable(mask(f"fleet store {self.url} unreachable: {detail}"))

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        """A pooled connection whose work is one transaction: committed on the way out, rolled back on an error.
        A lost or refused connection is :class:`FleetUnavailable`, one line naming the (masked) URL."""
        self.open()
        assert self._pool is not None  # noqa: S101 - open() made it
        with self._transaction(self._pool) as conn:
            yield conn

    def _check(self, conn: Conn) -> None:
        """The pool's check of a connection before it is handed out, skipped for a read when the connection was used
        without error within :data:`CHECKED_RECENTLY_S`."""
        used = self._used.get(conn)
        if not getattr(self._reader, "reading", False) or used is None or time.monotonic() - used >= CHECKED_RECENTLY_S:
            psycopg_pool.ConnectionPool.check_connection(conn)

    @contextmanager
    def reading(self) -> Iterator[Conn]:
        """:meth:`connection` for reads whose statements each stand alone: autocommit, so a statement is one round
        trip, without a BEGIN before it and a COMMIT after; and the connection is not checked when it was used within
        :data:`CHECKED_RECENTLY_S` (a recall's searches: one round trip each, not four)."""
        self._reader.reading = True
        try:
            with self.connection() as conn:
                self._reader.reading = False
                conn.autocommit = True
                try:
                    yield conn
                finally:
                    with suppress(psycopg.Error):  # a lost connection: the pool replaces it
                        conn.autocommit = False
        finally:
            self._reader.reading = False

    @contextmanager
    def _transaction(self, pool: psycopg_pool.ConnectionPool[Conn]) -> Iterator[Conn]:
        try:
            with pool.connection() as conn:
                yield conn
                self._used[conn] = time.monotonic()
        # A session the server ended for idling in its transaction (an effect's hold past lease_s, fleet/durable.py)
        # is gone as a lost connection is.
        except (
            psycopg.OperationalError,
            psycopg.errors.IdleInTransactionSessionTimeout,
            psycopg_pool.PoolTimeout,
        ) as exc:
            raise self._unavailable(exc) from None

    def close(self) -> None:
        """Close every connection of the pool (a later use opens it again)."""
        with self._opening:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- leases (fleet/lease.py has the statements) -----------------------------------------------

    def take(self, uuid: str, holder: str, lease_s: float | None = None) -> int | None:
        """Take the task's lease when free or expired: the new epoch, or None while another holds it."""
        with self.connection() as conn:
            return lease.take(conn, uuid, holder, self.lease_s if lease_s is None else lease_s)

    def renew(self, uuid: str, epoch: int, holder: str, lease_s: float | None = None) -> bool:
        """Extend this holder's lease; False when it was fenced (another epoch took the task)."""
        with self.connection() as conn:
            return lease.renew(conn, uuid, epoch, holder, self.lease_s if lease_s is None else lease_s)

    def release(self, uuid: str, epoch: int, holder: str) -> bool:
        """Free this holder's lease now; False when it was no longer this holder's."""
        with self.connection() as conn:
            return lease.release(conn, uuid, epoch, holder)

    def lease(self, uuid: str) -> LeaseRow | None:
        """The task's lease as the database has it (None: never leased)."""
        with self.connection() as conn:
            return lease.read(conn, uuid)

    def __enter__(self) -> FleetStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
