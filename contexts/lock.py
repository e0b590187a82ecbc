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
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import filelock

from contexts.atomic import fsync_dir, write_bytes_atomic
from contexts.clock import iso, parse_iso
from contexts.errors import BAD_DATA_ERRORS, FencedError, LockHeldError
from contexts.filelocks import file_lock
from contexts.generation import copy_generation, discard, exchange, home_of, identity, open_directory
from contexts.names import DIR_MODE, LOCK_FILE, STAGING_DIR

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


def is_stale(
    lock: LockInfo,
    now: datetime,
    stale_after_s: float,
    this_host: str,
    process_alive: bool,
    hung_after_s: float | None = None,
) -> bool:
    """A lock is stale when its heartbeat is older than ``stale_after_s`` and its holder cannot be alive, or
    older than ``hung_after_s`` whatever its holder is: a live process that has not beaten for that long is
    stopped or wedged, and keeps its task no longer (``None``: never).

    ``process_alive`` (``kill -0``) only means something on the holder's own host; from another host
    only the heartbeat counts (SPEC §4, §12).
    """
    age = (now - lock.heartbeat_at).total_seconds()
    if age <= stale_after_s:
        return False
    if lock.hostname != this_host or not process_alive:
        return True
    return hung_after_s is not None and age > hung_after_s


def is_hung(lock: LockInfo, now: datetime, hung_after_s: float | None) -> bool:
    """The holder has not beaten for ``hung_after_s``: alive or not, it is not doing its task."""
    return hung_after_s is not None and (now - lock.heartbeat_at).total_seconds() > hung_after_s


def holder_alive(lock: LockInfo, this_host: str) -> bool:
    """True only when the lock's holder is provably a live process of this machine: same hostname, and —
    when the lock records it — same boot, same PID namespace and same start time; only then does
    ``kill -0`` decide. Otherwise the heartbeat's age alone decides whether the lock is stale."""
    if lock.hostname != this_host:
        return False
    if lock.incarnation is not None and incarnation_of(lock.process_id) != lock.incarnation:
        return False  # another boot, another PID namespace, or another process that got the pid since
    return process_alive(lock.process_id)


def stop_hung_holder(lock: LockInfo, this_host: str) -> bool:
    """SIGKILL the lock's process when it is provably the same incarnation on this host (a holder that stopped
    beating for ``hung_after_s``): the pid is pinned with a pidfd first, then its boot, PID namespace and start
    time are compared, so a pid reused since can never be hit.  Returns whether a signal was sent."""
    if lock.hostname != this_host or lock.incarnation is None or not hasattr(os, "pidfd_open"):
        return False
    try:
        pidfd = os.pidfd_open(lock.process_id)
    except OSError:
        return False  # gone already
    try:
        if incarnation_of(lock.process_id) != lock.incarnation:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True


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
    """One holder's handle on a context: acquire, refresh, check (fencing), release.

    The holder works in its own generation of the directory (:mod:`contexts.generation`): ``home`` names it
    wherever it is, ``path`` is the ``.lock`` at the context's public name.  Only acquiring, finishing and
    repairs take the per-UUID mutex; a holder's heartbeat, appends and state writes never do, so a holder that
    is paused can never keep a takeover waiting.
    """

    def __init__(
        self, path: Path, mutex_path: Path, hostname: str, pid: int | None = None, staging_dir: Path | None = None
    ) -> None:
        self._guard = threading.Lock()
        self._parent_fd = -1  # running/ (or the staging directory's parent), held open for the fencing check
        self.path = path
        self.mutex_path = mutex_path
        self.staging_dir = staging_dir if staging_dir is not None else path.parent.parent.parent / STAGING_DIR
        self.hostname = hostname
        self.pid = os.getpid() if pid is None else pid
        self.incarnation = incarnation_of(self.pid)
        self.owner = secrets.token_hex(16)
        self.info: LockInfo | None = None
        self.fenced = False
        self._dir_fd = -1
        self._dir_id: tuple[int, int] | None = None
        self.home = path.parent

    def mutex(self) -> contextlib.AbstractContextManager[None]:
        """The per-UUID mutex that acquiring, finishing and repairs take (never a holder's ordinary write)."""
        return file_lock(self.mutex_path, MUTEX_TIMEOUT_S)

    def acquire(
        self,
        clock: Callable[[], datetime],
        stale_after_s: float,
        *,
        hung_after_s: float | None = None,
        admit: Callable[[Path], None] | None = None,
    ) -> LockInfo | None:
        """Take the context in a new generation; return the previous (stale) holder's info when this was a
        takeover.  ``admit(directory)`` may refuse by raising, before anything changes.

        Raises :class:`LockHeldError` while a live holder has it.
        """
        try:
            with self.mutex():
                # The time is read once the mutex is ours: a long wait must not write a lock already stale.
                previous, old = self._take_over(clock(), stale_after_s, hung_after_s, admit)
        except filelock.Timeout as exc:
            raise LockHeldError(f"{self.path}: lock mutex busy for {MUTEX_TIMEOUT_S}s") from exc
        if old is not None:
            discard(old)  # the old generation: only a fenced holder still writes there
        return previous

    def _take_over(
        self, now: datetime, stale_after_s: float, hung_after_s: float | None, admit: Callable[[Path], None] | None
    ) -> tuple[LockInfo | None, Path | None]:
        current = read_lock(self.path)
        if current is not None:
            self._refuse_live(current, now, stale_after_s, hung_after_s)
        directory = self.path.parent
        if admit is not None:
            admit(directory)
        info = LockInfo(self.pid, self.hostname, now, now, self.owner, self.incarnation)
        if current is None:
            # Free: its last holder released it, and a holder removes its .lock only after closing its files, so
            # nobody can write into this generation any more; it is taken as it is (no copy, however long).
            self._adopt(directory, info)
            return None, None
        staging = self.staging_dir / f"{directory.name}.gen.{secrets.token_hex(4)}"
        staging.mkdir(mode=DIR_MODE)
        try:
            copy_generation(directory, staging)
            self._adopt(staging, info)
            exchange(directory, staging)  # the fence: from here on the previous holder writes into `staging`
        except BaseException:
            self.close()
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(directory.parent)
        return current, staging

    def acquire_new(self, now: datetime) -> None:
        """Hold a context being created (its directory is still private to the creator): write the ``.lock``."""
        self._adopt(self.path.parent, LockInfo(self.pid, self.hostname, now, now, self.owner, self.incarnation))

    def _refuse_live(self, current: LockInfo, now: datetime, stale_after_s: float, hung_after_s: float | None) -> None:
        alive = holder_alive(current, self.hostname)
        if not is_stale(current, now, stale_after_s, self.hostname, alive, hung_after_s):
            raise LockHeldError(f"context is held by {current.worker} (heartbeat {iso(current.heartbeat_at)})")

    def _adopt(self, directory: Path, info: LockInfo) -> None:
        """Make ``directory`` this holder's home and write its ``.lock`` there."""
        fd = open_directory(directory)
        with self._guard:
            self._dir_fd, self._dir_id = fd, identity(fd)
            self.home = home_of(fd, directory)
        self._write(info)

    def refresh(self, now: datetime) -> None:
        """Heartbeat: rewrite ``heartbeat_at`` in the home; raises :class:`FencedError` if the lock was taken
        over.  A heartbeat that passes the check and is then paused writes into a generation nobody reads."""
        self.check()
        assert self.info is not None  # noqa: S101 - check() raised otherwise
        self._write(LockInfo(self.pid, self.hostname, self.info.acquired_at, now, self.owner, self.incarnation))

    def check(self) -> None:
        """Fencing before a write, to stop early: is the context's name still this holder's generation?
        (Safety does not rest on it: a write that passes it and is then paused lands in the old generation.)"""
        if self.fenced or self.info is None or self._dir_id is None:
            raise FencedError(f"{self.path}: lock lost; this holder must not write")
        try:
            with self._guard:  # one lookup of one name, relative to running/ held open: this runs on every write
                if self._parent_fd < 0:
                    self._parent_fd = os.open(self._parent_str, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                st = os.stat(self._dir_name, dir_fd=self._parent_fd)
        except FileNotFoundError:
            self._fence("context moved on")
        if (st.st_dev, st.st_ino) != self._dir_id:
            self._fence("lock taken over")

    @property
    def path(self) -> Path:
        """The ``.lock`` at the context's public name (it moves from the staging directory into ``running/``)."""
        return self._path

    @path.setter
    def path(self, value: Path) -> None:
        self._path = value
        self._dir_name = value.parent.name
        self._parent_str = os.fspath(value.parent.parent)
        self._close_parent()

    def _close_parent(self) -> None:
        with self._guard:
            if self._parent_fd >= 0:
                os.close(self._parent_fd)
            self._parent_fd = -1

    def close(self) -> None:
        """Let go of the home (the lock itself stays as it is)."""
        with self._guard:
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1
                self.home = self.path.parent
        self._close_parent()

    def release(self) -> None:
        """Remove the lock if it is still ours (handing the task back on shutdown); no mutex: the ``.lock``
        removed is the one in this holder's own generation (call it before :meth:`close`)."""
        if self.info is None:
            return
        try:
            with contextlib.suppress(FencedError, FileNotFoundError):  # FileNotFound: the old generation is gone
                self.check()
                os.unlink(self.home / LOCK_FILE)
        finally:
            self.info = None
            self._close_parent()

    def release_under_mutex(self) -> bool:
        """Remove the lock at the public name if it is ours, for a caller holding :meth:`mutex` (finishing):
        under the mutex no takeover can swap generations, so an owner match means the name is ours."""
        current = read_lock(self.path)
        ours = current is not None and current.owner == self.owner
        if ours:
            os.unlink(self.path)
        self.info = None
        return ours

    def _fence(self, why: str) -> NoReturn:
        self.fenced = True
        raise FencedError(f"{self.path.parent.name}: {why}; this holder stops writing")

    def _write(self, info: LockInfo) -> None:
        with self._guard:
            write_bytes_atomic(self.home / LOCK_FILE, json.dumps(info.to_json()).encode() + b"\n")
            self.info = info


def lock_mutex_path(mutex_dir: Path, uuid: str) -> Path:
    """Where the flock mutex of ``uuid`` lives (outside the context, so it exists before the context)."""
    with contextlib.suppress(FileExistsError):
        mutex_dir.mkdir(mode=0o700, parents=True)
    return mutex_dir / uuid
