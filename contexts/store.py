"""The context store: where contexts live, and how one is created, resumed or found (SPEC §3, §4)."""

from __future__ import annotations

import os
import shutil
import socket
import uuid as uuid_module
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import filelock
import structlog

from contexts.atomic import fsync_dir, write_json_atomic
from contexts.clock import iso, utc_now
from contexts.context import Context, HeartbeatHook
from contexts.durable import NO_WRITER, ONE_HOST, DurableCopy, DurableWriter
from contexts.errors import (
    ContextCompletedError,
    ContextError,
    ContextExistsError,
    ContextNotFoundError,
    InvalidUUIDError,
    LockHeldError,
)
from contexts.index import ContextIndex, Index
from contexts.jsonl import FSYNC_POLICIES, FsyncPolicy
from contexts.lock import MUTEX_TIMEOUT_S, ContextLock, LockInfo, lock_mutex_path, read_lock
from contexts.masking import mask_value
from contexts.names import (
    COMPLETED_DIR,
    DIR_MODE,
    FILE_MODE,
    JSONL_FILES,
    LOCK_FILE,
    METADATA_FILE,
    MUTEX_DIR,
    RUNNING_DIR,
    STAGING_DIR,
    STATE_FILE,
)
from contexts.state import initial_state, read_state, update_state
from contexts.summary import context_uuids

log = structlog.get_logger(__name__)

STORE_DIRS = (RUNNING_DIR, COMPLETED_DIR, STAGING_DIR, MUTEX_DIR)  # what a store's root holds

TASK_KEY_FIELDS = ("task_source", "owner", "repo", "task_type", "task_id")


def validate_uuid(text: str) -> str:
    """Return the canonical form of a context UUID, or raise :class:`InvalidUUIDError`."""
    try:
        parsed = uuid_module.UUID(str(text))
    except ValueError:
        raise InvalidUUIDError(f"not a context UUID: {str(text)[:80]!r}") from None
    if str(parsed) != str(text).lower():  # no braces, urn: prefixes or path tricks
        raise InvalidUUIDError(f"not a context UUID: {str(text)[:80]!r}")
    return str(parsed)


class ContextStore:
    """Contexts under ``base_dir``: ``running/{uuid}`` while held, ``completed/{uuid}`` when done."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        heartbeat_interval_s: float = 30,
        stale_after_s: float = 60,
        fsync: FsyncPolicy = "step",
        hostname: str | None = None,
        on_heartbeat: HeartbeatHook | None = None,
        clock: Callable[[], datetime] = utc_now,
        hung_after_s: float | None = None,
        durable: DurableCopy = ONE_HOST,
        index: Callable[[Path], Index] = ContextIndex,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.base_dir = Path(base_dir).absolute()
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stale_after_s = stale_after_s
        self.hung_after_s = hung_after_s  # a live local holder silent this long is taken over too (None: never)
        self.fsync: FsyncPolicy = fsync
        self.hostname = hostname or socket.gethostname()
        self.on_heartbeat = on_heartbeat
        self.clock = clock
        self.durable = durable  # fleet mode: every context's copy and lease beside the directories (SPEC §12)
        # The base itself too: as a mere parent of running/ it would get the umask's 0755 (SPEC §3 rule 6).
        self.base_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        for name in STORE_DIRS:
            (self.base_dir / name).mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        self._make_index = index  # fleet mode: every host's contexts in the fleet's database (worker/stores.py)
        self._index: Index | None = None

    def intact(self) -> bool:
        """Whether the store's directories are still there (a kept store checks before each task)."""
        return all((self.base_dir / name).is_dir() for name in STORE_DIRS)

    # -- the index -------------------------------------------------------------------------------

    @property
    def index(self) -> Index:
        """The index of this store's contexts (opened, and rebuilt or reconciled as needed, on first use)."""
        if self._index is None:
            self._index = self._make_index(self.base_dir)
        return self._index

    def mirror(self, write: Callable[[Index], object]) -> None:
        """Apply one write to the index.  The directories are the truth: a failed index write is logged, never
        raised, and the next open's reconciliation (or ``tasuki context reindex``) repairs the row."""
        try:
            write(self.index)
        except (ContextError, OSError) as exc:
            log.warning("context index not updated", error=str(exc)[:300])

    # -- where things are ----------------------------------------------------------------------

    def running_path(self, uuid: str) -> Path:
        """``running/{uuid}`` (whether or not it exists)."""
        return self.base_dir / RUNNING_DIR / validate_uuid(uuid)

    def completed_path(self, uuid: str) -> Path:
        """``completed/{uuid}`` (whether or not it exists)."""
        return self.base_dir / COMPLETED_DIR / validate_uuid(uuid)

    def locate(self, uuid: str) -> Path:
        """The directory of ``uuid``, running or completed; raises when there is none."""
        for path in (self.running_path(uuid), self.completed_path(uuid)):
            if path.is_dir() and not path.is_symlink():
                return path
        raise ContextNotFoundError(f"no context {uuid} under {self.base_dir}")

    def locate_inside(self, uuid: str) -> Path:
        """:meth:`locate`, refusing a directory that resolves outside the contexts root (a symlink on its way):
        what every reader that takes a UUID from a person (the viewer, the console) goes through."""
        directory = self.locate(uuid)  # also rejects anything that is not a canonical UUID, e.g. ../../etc
        root = self.base_dir.resolve()
        if not directory.resolve().is_relative_to(root):
            raise InvalidUUIDError(f"context {uuid} leads outside the contexts root {root}")
        return directory

    def running_uuids(self) -> list[str]:
        """UUIDs of the contexts under ``running/``."""
        return context_uuids(self.base_dir / RUNNING_DIR)

    def completed_uuids(self) -> list[str]:
        """UUIDs of the contexts under ``completed/``."""
        return context_uuids(self.base_dir / COMPLETED_DIR)

    def read_lock(self, uuid: str) -> LockInfo | None:
        """The ``.lock`` of a running context, if any."""
        return read_lock(self.running_path(uuid) / LOCK_FILE)

    def _new_lock(self, directory: Path, uuid: str) -> ContextLock:
        mutex = lock_mutex_path(self.base_dir / MUTEX_DIR, uuid)
        return ContextLock(directory / LOCK_FILE, mutex, self.hostname, staging_dir=self.base_dir / STAGING_DIR)

    # -- create, open ------------------------------------------------------------------------------

    def create(
        self,
        task_key: dict[str, Any],
        config: dict[str, Any],
        user: str | None = None,
        uuid: str | None = None,
        *,
        heartbeat: bool = True,
        extra_metadata: dict[str, Any] | None = None,
    ) -> Context:
        """Create ``running/{uuid}`` whole (metadata, state, empty logs, ``.lock``) and hold it.

        ``extra_metadata`` adds fields to ``metadata.json`` (the worker records the task request there, so
        the monitor can re-enqueue a lost task); it may not replace a field the store writes.
        """
        uuid = validate_uuid(uuid) if uuid else str(uuid_module.uuid4())
        missing = [f for f in TASK_KEY_FIELDS if f not in task_key]
        if missing:
            raise ValueError(f"task_key lacks {', '.join(missing)}")
        now = self.clock()
        staging = self.base_dir / STAGING_DIR / f"{uuid}.{os.getpid()}.{uuid_module.uuid4().hex[:8]}"
        staging.mkdir(mode=DIR_MODE)
        try:
            lock = self._new_lock(staging, uuid)
            metadata = {
                "uuid": uuid,
                "task_key": {k: str(v) for k, v in task_key.items()},
                "created_at": iso(now),
                "process_id": os.getpid(),
                "hostname": self.hostname,
                "config": config,
                "user": user,
            }
            clashing = sorted(set(metadata) & set(extra_metadata or {}))
            if clashing:
                raise ValueError(f"extra_metadata may not replace {', '.join(clashing)}")
            metadata.update(extra_metadata or {})
            metadata = mask_value(metadata)  # type: ignore[assignment]
            state = initial_state(now, self.holder)
            write_json_atomic(staging / METADATA_FILE, metadata)
            write_json_atomic(staging / STATE_FILE, state)
            for name in JSONL_FILES:
                os.close(os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
            target = self.running_path(uuid)
            try:
                with lock.mutex():
                    if target.exists() or self.completed_path(uuid).exists():
                        raise ContextExistsError(f"context {uuid} already exists")
                    # Known to the fleet before it appears here: a UUID another host created is refused.
                    writer = self.durable.create(uuid, self.holder, metadata, state)
                    # Stamped under the mutex, right before the rename: the lock appears fresh however long
                    # the staging writes and the wait for the mutex took.
                    lock.acquire_new(self.clock())
                    fsync_dir(staging)
                    try:
                        os.rename(staging, target)
                    except OSError as exc:  # another creator won the race for the same UUID
                        writer.release()
                        raise ContextExistsError(f"context {uuid} already exists") from exc
            except filelock.Timeout as exc:
                raise LockHeldError(f"context {uuid}: lock mutex busy for {MUTEX_TIMEOUT_S}s") from exc
            lock.path = target / LOCK_FILE
            fsync_dir(target.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.mirror(lambda index: index.record(target))
        return self._hold(uuid, target, lock, heartbeat, writer)

    def open(self, uuid: str, *, resume: bool = True, heartbeat: bool = True) -> Context:
        """Hold a running context: free, or stale and taken over.  ``resume`` counts a new ``attempt``.

        Raises :class:`LockHeldError` while a live holder has it, :class:`ContextCompletedError` once it
        is finished (or finishing), :class:`ContextNotFoundError` when it never existed.
        """
        directory = self.running_path(uuid)
        # Fleet mode: the lease first (a new epoch fences the previous holder wherever it runs), then this host's
        # directory as the durable copy has it — a host that never held the task, or held it before another did,
        # starts from the last committed step (SPEC §12). One host: NO_WRITER, and the directory as it is.
        writer = self.durable.take(uuid, self.holder)
        try:
            rebuilt = writer.epoch > 0 and not directory.is_dir() and self._rebuild_into_running(uuid, directory)
            if not directory.is_dir():
                self._raise_missing(uuid)
            lock = self._new_lock(directory, uuid)
            try:
                previous = lock.acquire(
                    self.clock, self.stale_after_s, hung_after_s=self.hung_after_s, admit=_not_completing
                )
            except FileNotFoundError:
                self._raise_missing(uuid)
            # From here on every write goes to this holder's own generation (lock.home), never by the public name.
            if writer.epoch > 0 and not rebuilt:
                self.durable.rebuild(uuid, lock.home)
            state = read_state(lock.home)
            fields: dict[str, Any] = {"worker": lock.info.worker if lock.info else None}
            if resume:
                fields["attempt"] = int(state.get("attempt", 1)) + 1
            writer.commit(update_state(lock.home, self.clock(), fsync=self.fsync != "never", set_fields=fields))
        except BaseException:
            writer.release()
            raise
        ctx = self._hold(uuid, directory, lock, heartbeat, writer)
        ctx.previous_holder = previous
        return ctx

    def _rebuild_into_running(self, uuid: str, directory: Path) -> bool:
        """Rebuild a context this host has no directory of into ``running/`` whole (built in staging, renamed)."""
        staging = self.base_dir / STAGING_DIR / f"{uuid}.rebuild.{os.getpid()}.{uuid_module.uuid4().hex[:8]}"
        try:
            self.durable.rebuild(uuid, staging)
            with self._new_lock(directory, uuid).mutex():
                if directory.exists() or self.completed_path(uuid).exists():
                    return False
                os.rename(staging, directory)
            fsync_dir(directory.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.mirror(lambda index: index.record(directory))
        return True

    @property
    def holder(self) -> str:
        """This process as a holder: ``hostname:pid`` (state.json's ``worker``, the fleet lease's ``holder``)."""
        return f"{self.hostname}:{os.getpid()}"

    def _hold(
        self, uuid: str, directory: Path, lock: ContextLock, heartbeat: bool, writer: DurableWriter = NO_WRITER
    ) -> Context:
        ctx = Context(self, uuid, directory, lock, writer)
        if self.on_heartbeat is not None:
            self.on_heartbeat(uuid, self.clock(), ctx.status)
        if heartbeat:
            ctx.start_heartbeat()
        return ctx

    def _raise_missing(self, uuid: str) -> None:
        if self.completed_path(uuid).is_dir():
            raise ContextCompletedError(f"context {uuid} is already completed")
        raise ContextNotFoundError(f"no context {uuid} under {self.base_dir}")

    def is_held(self, uuid: str) -> bool:
        """True while a live (non-stale) holder has the context's lock."""
        try:
            lock = self._new_lock(self.running_path(uuid), uuid)
            current = read_lock(lock.path)
        except LockHeldError:
            return True
        if current is None:
            return False
        from contexts.lock import holder_alive, is_stale

        alive = holder_alive(current, self.hostname)
        return not is_stale(current, self.clock(), self.stale_after_s, self.hostname, alive, self.hung_after_s)


def _not_completing(directory: Path) -> None:
    """Refuse to take over a context whose finishing was interrupted: the monitor completes it."""
    if read_state(directory).get("status") == "completing":
        raise ContextCompletedError(f"context {directory.name} is completing")
