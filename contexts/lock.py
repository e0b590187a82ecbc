"""The context's ``.lock``: who holds it, when it is stale, and how it changes hands (SPEC §4).

Every change to a ``.lock`` — create, heartbeat, takeover, release — happens while holding a per-UUID
``flock`` mutex in ``{base}/.locks/``, and re-checks the lock's owner token under it.  That makes the
changes linearizable: under any interleaving of any number of processes at most one holder exists.
Readers (the monitor, the viewer) never take the mutex; the ``.lock`` is always replaced whole.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import filelock

from contexts.atomic import write_bytes_atomic
from contexts.clock import iso, parse_iso
from contexts.errors import BAD_DATA_ERRORS, FencedError, LockHeldError
from contexts.filelocks import file_lock

MUTEX_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Incarnation:
    """What makes a pid name one particular process: the kernel's boot, the PID namespace the pid belongs
    to, and the process's start time. Containers restarted by Docker, and containers or pods on host
    networking, share a hostname across PID namespaces where low pids are reused at once (SPEC §4)."""

    boot_id: str
    pid_namespace: str
    started: int


def process_started(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # the fields after the command name start at field 3
    except (OSError, IndexError, ValueError):
        return None


@functools.cache
def _this_kernel_and_namespace() -> tuple[str, str] | None:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return boot_id, os.readlink("/proc/self/ns/pid")
    except OSError:
        return None  # not Linux: only hostname and pid are known


def incarnation_of(pid: int) -> Incarnation | None:
    """The incarnation of ``pid`` as this process sees it (None where /proc does not tell)."""
    here, started = _this_kernel_and_namespace(), process_started(pid)
    if here is None or started is None:
        return None
    return Incarnation(here[0], here[1], started)


@dataclass(frozen=True)
class LockInfo:
    """The content of a ``.lock`` file."""

    process_id: int
    hostname: str
    acquired_at: datetime
    heartbeat_at: datetime
    owner: str
    incarnation: Incarnation | None = None  # None: a lock written before Tasuki recorded it, or off Linux

    def to_json(self) -> dict[str, Any]:
        """The record as written to disk (schemas/lock.schema.json plus ``owner``)."""
        data: dict[str, Any] = {
            "process_id": self.process_id,
            "hostname": self.hostname,
            "acquired_at": iso(self.acquired_at),
            "heartbeat_at": iso(self.heartbeat_at),
            "owner": self.owner,
        }
        if self.incarnation is not None:
            data["boot_id"] = self.incarnation.boot_id
            data["pid_namespace"] = self.incarnation.pid_namespace
            data["process_started"] = self.incarnation.started
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockInfo:
        """Parse a ``.lock`` record (old records without the incarnation are read as before)."""
        incarnation = None
        if all(data.get(key) is not None for key in ("boot_id", "pid_namespace", "process_started")):
            incarnation = Incarnation(str(data["boot_id"]), str(data["pid_namespace"]), int(data["process_started"]))
        return cls(
            process_id=int(data["process_id"]),
            hostname=str(data["hostname"]),
            acquired_at=parse_iso(data["acquired_at"]),
            heartbeat_at=parse_iso(data["heartbeat_at"]),
            owner=str(data.get("owner", "")),
            incarnation=incarnation,
        )

    @property
    def worker(self) -> str:
        """``hostname:pid`` as ``state.json`` records it."""
        return f"{self.hostname}:{self.process_id}"


def is_stale(lock: LockInfo, now: datetime, stale_after_s: float, this_host: str, process_alive: bool) -> bool:
    """A lock is stale when its heartbeat is older than ``stale_after_s`` and its holder cannot be alive.

    ``process_alive`` (``kill -0``) only means something on the holder's own host; from another host
    only the heartbeat counts (SPEC §4, §12).
    """
    if (now - lock.heartbeat_at).total_seconds() <= stale_after_s:
        return False
    return lock.hostname != this_host or not process_alive


def holder_alive(lock: LockInfo, this_host: str) -> bool:
    """True only when the lock's holder is provably a live process of this machine: same hostname, and —
    when the lock records it — same boot, same PID namespace and same start time; only then does
    ``kill -0`` decide. Otherwise the heartbeat's age alone decides whether the lock is stale."""
    if lock.hostname != this_host:
        return False
    if lock.incarnation is not None and incarnation_of(lock.process_id) != lock.incarnation:
        return False  # another boot, another PID namespace, or another process that got the pid since
    return process_alive(lock.process_id)


def heartbeat_age_s(lock: LockInfo, now: datetime) -> float:
    """Seconds since the holder's last heartbeat."""
    return (now - lock.heartbeat_at).total_seconds()


def process_alive(pid: int) -> bool:
    """``kill -0``: does a process with this id exist on this host?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A killed process that nobody reaped yet still answers ``kill -0``; /proc tells it is dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False  # no /proc (not Linux): trust kill -0
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def read_lock(path: Path) -> LockInfo | None:
    """The ``.lock`` at ``path``, or ``None`` when there is none (or it vanished while reading)."""
    try:
        with open(path, "rb") as handle:
            return LockInfo.from_json(json.loads(handle.read()))
    except FileNotFoundError:
        return None
    except BAD_DATA_ERRORS as exc:  # never written torn, but an operator may have edited it
        raise LockHeldError(f"{path}: unreadable lock file ({exc})") from exc


class ContextLock:
    """One holder's handle on a context's ``.lock``: acquire, refresh, check (fencing), release."""

    def __init__(self, path: Path, mutex_path: Path, hostname: str, pid: int | None = None) -> None:
        self.path = path  # a property: the fencing check stats a ready-made string on every write
        self.mutex_path = mutex_path
        self.hostname = hostname
        self.pid = os.getpid() if pid is None else pid
        self.incarnation = incarnation_of(self.pid)
        self.owner = secrets.token_hex(16)
        self.info: LockInfo | None = None
        self.fenced = False
        # Our own last .lock, held open: replacing or removing the file (a takeover, a release) drops its
        # link count to 0, which the fencing check reads with one fstat, without looking up the path.
        self._fd = -1
        self._guard = threading.Lock()

    def mutex(self) -> contextlib.AbstractContextManager[None]:
        """The per-UUID mutex every change to the ``.lock`` happens under."""
        return file_lock(self.mutex_path, MUTEX_TIMEOUT_S)

    def acquire(
        self, clock: Callable[[], datetime], stale_after_s: float, *, create_only: bool = False
    ) -> LockInfo | None:
        """Take the lock; return the previous (stale) holder's info when this was a takeover.

        Raises :class:`LockHeldError` while a live holder has it.
        """
        try:
            with self.mutex():
                # The time is read once the mutex is ours: a long wait must not write a lock already stale.
                return self.acquire_under_mutex(clock(), stale_after_s, create_only=create_only)
        except filelock.Timeout as exc:
            raise LockHeldError(f"{self.path}: lock mutex busy for {MUTEX_TIMEOUT_S}s") from exc

    def acquire_under_mutex(self, now: datetime, stale_after_s: float, *, create_only: bool = False) -> LockInfo | None:
        """:meth:`acquire` for a caller that already holds :meth:`mutex` (``create`` renames under it)."""
        current = read_lock(self.path)
        if current is not None:
            alive = holder_alive(current, self.hostname)
            if create_only or not is_stale(current, now, stale_after_s, self.hostname, alive):
                raise LockHeldError(f"context is held by {current.worker} (heartbeat {iso(current.heartbeat_at)})")
        self._write(LockInfo(self.pid, self.hostname, now, now, self.owner, self.incarnation))
        return current

    def refresh(self, now: datetime) -> None:
        """Heartbeat: rewrite ``heartbeat_at``; raises :class:`FencedError` if the lock was taken over."""
        if self.info is None or self.fenced:
            raise FencedError(f"{self.path}: not the holder")
        with self.mutex():
            self._verify_owner()
            self._write(LockInfo(self.pid, self.hostname, self.info.acquired_at, now, self.owner, self.incarnation))

    @property
    def path(self) -> Path:
        """The ``.lock`` file (it moves from the staging directory into ``running/`` on create)."""
        return self._path

    @path.setter
    def path(self, value: Path) -> None:
        self._path = value
        self._path_str = os.fspath(value)

    def check(self) -> None:
        """Fencing before a write: one ``fstat``; the file is read only when it was replaced under us."""
        if self.fenced or self.info is None:
            raise FencedError(f"{self.path}: lock lost; this holder must not write")
        # Under the guard: the heartbeat thread closes and replaces the descriptor when it rewrites the lock
        # (unguarded, fstat could hit a closed descriptor, or one already reused for another file).
        with self._guard:
            if self._fd >= 0 and os.fstat(self._fd).st_nlink:
                return
            current = read_lock(self.path)  # our own heartbeat may have just replaced the file
            if current is None or current.owner != self.owner:
                self._fence("lock taken over" if current else "lock file removed")
            self._hold_open()

    def close(self) -> None:
        """Let go of the open ``.lock`` (the lock itself stays as it is)."""
        with self._guard:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _hold_open(self) -> None:
        fd = os.open(self._path_str, os.O_RDONLY)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock if it is still ours (finish, or handing the task back on shutdown)."""
        if self.info is None:
            return
        with self.mutex():
            self.release_under_mutex()

    def release_under_mutex(self) -> bool:
        """:meth:`release` for a caller holding :meth:`mutex`; returns whether the lock was still ours."""
        current = read_lock(self.path)
        ours = current is not None and current.owner == self.owner
        if ours:
            os.unlink(self.path)
        self.info = None
        return ours

    def _verify_owner(self) -> None:
        current = read_lock(self.path)
        if current is None or current.owner != self.owner:
            self._fence("lock taken over")

    def _fence(self, why: str) -> NoReturn:
        self.fenced = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        raise FencedError(f"{self.path.parent.name}: {why}; this holder stops writing")

    def _write(self, info: LockInfo) -> None:
        with self._guard:
            write_bytes_atomic(self.path, json.dumps(info.to_json()).encode() + b"\n")
            self._hold_open()
            self.info = info


def lock_mutex_path(mutex_dir: Path, uuid: str) -> Path:
    """Where the flock mutex of ``uuid`` lives (outside the context, so it exists before the context)."""
    with contextlib.suppress(FileExistsError):
        mutex_dir.mkdir(mode=0o700, parents=True)
    return mutex_dir / uuid
