"""Repairs of interrupted completions (SPEC §3 rule 9), carried out for the monitor.

Completion is: state ``completing`` → remove ``.lock`` → rename to ``completed/`` → final status.  A crash
can stop it between any two steps.  The monitor decides from what it read; each function here re-reads
under the context's lock mutex (the one every ``.lock`` change takes) and raises :class:`RepairSkipped`
when the context no longer needs the repair — so two monitors at once, or a monitor racing a live
finisher, never do it twice or touch a live holder.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import uuid as uuid_module
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import filelock

from contexts.atomic import fsync_dir
from contexts.clock import parse_iso
from contexts.durable import NO_WRITER, DurableWriter
from contexts.errors import ContextCompletedError, ContextError, ContextNotFoundError, LockHeldError
from contexts.filelocks import file_lock
from contexts.lock import MUTEX_TIMEOUT_S, LockInfo, holder_alive, is_stale, lock_mutex_path, read_lock
from contexts.names import FINAL_STATUSES, GZIP_SUFFIX, LOCK_FILE, MUTEX_DIR, RECORD_FILES, STAGING_DIR
from contexts.state import read_state, update_state
from contexts.store import ContextStore

_CHUNK = 1 << 20


class RepairSkipped(ContextError):
    """The context does not (or no longer) need this repair, or it is not safe; nothing was changed."""


def final_status_of(state: dict[str, Any]) -> str:
    """The status a context stopped in ``completing`` ends with: the one its holder recorded
    (``final_status``), else ``failed`` when it carries an error, else ``completed``."""
    recorded = state.get("final_status")
    if recorded in FINAL_STATUSES:
        return str(recorded)
    return "failed" if state.get("error") else "completed"


def holder_is_live(lock: LockInfo, store: ContextStore, now: datetime) -> bool:
    """True unless the lock is stale by SPEC §4's rule (old heartbeat and a holder that cannot be alive)."""
    alive = holder_alive(lock, store.hostname)
    return not is_stale(lock, now, store.stale_after_s, store.hostname, alive)


@contextlib.contextmanager
def _mutex(store: ContextStore, uuid: str) -> Iterator[None]:
    try:
        with file_lock(lock_mutex_path(store.base_dir / MUTEX_DIR, uuid), MUTEX_TIMEOUT_S):
            yield
    except filelock.Timeout:
        raise RepairSkipped(f"{uuid}: lock mutex busy") from None


def _quiet_for(state: dict[str, Any], store: ContextStore, now: datetime) -> bool:
    # A live finisher updates state.json right before each step: an old updated_at means nobody is finishing.
    updated = state.get("updated_at")
    return updated is not None and (now - parse_iso(updated)).total_seconds() > store.stale_after_s


def _remove_lock_unless_live(directory: Path, store: ContextStore, now: datetime) -> bool:
    lock = read_lock(directory / LOCK_FILE)
    if lock is None:
        return False
    if holder_is_live(lock, store, now):
        raise RepairSkipped(f"{directory.name}: held by a live holder ({lock.worker})")
    os.unlink(directory / LOCK_FILE)
    return True


@contextlib.contextmanager
def _repairers_lease(store: ContextStore, uuid: str) -> Iterator[DurableWriter]:
    """Fleet mode: the repairer's own lease on the context, for its final state in the durable copy (a new epoch:
    whatever the dead holder still tried is fenced), released at the end. :class:`RepairSkipped`, before anything
    is changed, while the holder's lease is still live. One host, or a durable copy that already has the final
    state (or never had the context): no lease, nothing written there."""
    try:
        writer = store.durable.take(uuid, store.holder)
    except LockHeldError as exc:
        raise RepairSkipped(f"{uuid}: its fleet lease is still live ({exc})") from None
    except (ContextCompletedError, ContextNotFoundError):
        writer = NO_WRITER
    try:
        yield writer
    finally:
        writer.release()


def _still_completing(directory: Path, copy: str, store: ContextStore, now: datetime) -> dict[str, Any]:
    """The state of a ``copy`` (running, completed) stopped in ``completing`` whose finisher is gone (quiet for
    ``stale_after_s``); :class:`RepairSkipped` otherwise. Under the lock mutex."""
    if not directory.is_dir():
        raise RepairSkipped(f"{directory.name}: no {copy} copy")
    state = read_state(directory)
    if state.get("status") != "completing":
        raise RepairSkipped(f"{directory.name}: status is {state.get('status')}, not completing")
    if not _quiet_for(state, store, now):
        raise RepairSkipped(f"{directory.name}: finishing right now")
    return state


def finish_move(store: ContextStore, uuid: str, now: datetime) -> str:
    """A running context stopped in ``completing``: drop its dead lock, move it to ``completed/``, set its status
    (in a fleet, in the durable copy too, under the repairer's own lease)."""
    running, target = store.running_path(uuid), store.completed_path(uuid)
    with contextlib.ExitStack() as leased:
        with _mutex(store, uuid):
            state = _still_completing(running, "running", store, now)
            if target.exists():
                raise RepairSkipped(f"{uuid}: a completed copy exists too")
            _remove_lock_unless_live(running, store, now)
            writer = leased.enter_context(_repairers_lease(store, uuid))
            os.rename(running, target)
            fsync_dir(target.parent)
        status = final_status_of(state)
        writer.commit(update_state(target, now, fsync=True, set_fields={"status": status}))
    store.mirror(lambda index: index.record(target))
    return f"moved to completed/ as {status}"


def finish_status(store: ContextStore, uuid: str, now: datetime) -> str:
    """A completed context still ``completing`` (a crash after the rename): set its final status (in a fleet, in the
    durable copy too, under the repairer's own lease)."""
    directory = store.completed_path(uuid)
    with _mutex(store, uuid):
        state = _still_completing(directory, "completed", store, now)
        status = final_status_of(state)
        with _repairers_lease(store, uuid) as writer:
            writer.commit(update_state(directory, now, fsync=True, set_fields={"status": status}))
    store.mirror(lambda index: index.record(directory))
    return f"status set to {status}"


def remove_completed_lock(store: ContextStore, uuid: str, now: datetime) -> str:
    """A ``.lock`` left inside ``completed/{uuid}``: remove it unless its holder is live."""
    directory = store.completed_path(uuid)
    with _mutex(store, uuid):
        if not directory.is_dir() or not _remove_lock_unless_live(directory, store, now):
            raise RepairSkipped(f"{uuid}: no lock in the completed copy")
    return "leftover .lock removed from completed/"


def drop_running_copy(store: ContextStore, uuid: str, now: datetime) -> str:
    """A context in both places: remove the running copy only when it holds nothing the completed one lacks.

    "Nothing" means every JSONL file of the running copy is a byte prefix of (or equal to) its completed
    counterpart; otherwise both stay and the caller reports a conflict for an operator.
    """
    running, completed = store.running_path(uuid), store.completed_path(uuid)
    with _mutex(store, uuid):
        if not (running.is_dir() and completed.is_dir()):
            raise RepairSkipped(f"{uuid}: not in both running/ and completed/")
        lock = read_lock(running / LOCK_FILE)
        if lock is not None and holder_is_live(lock, store, now):
            raise RepairSkipped(f"{uuid}: the running copy is held by a live holder ({lock.worker})")
        newer = [name for name in RECORD_FILES if not _is_prefix(running / name, completed, name)]
        if newer:
            raise RepairSkipped(
                f"{uuid}: conflict, the running copy has records the completed one lacks ({', '.join(newer)}); "
                "both kept for an operator"
            )
        trash = store.base_dir / STAGING_DIR / f"{uuid}.dropped.{uuid_module.uuid4().hex[:8]}"
        os.rename(running, trash)  # gone from running/ at once, even if rmtree is interrupted
        fsync_dir(running.parent)
    shutil.rmtree(trash, ignore_errors=True)
    store.mirror(lambda index: index.record(completed))
    return "running copy removed (the completed copy holds all of it)"


def _open_jsonl(directory: Path, name: str) -> IO[bytes] | gzip.GzipFile | None:
    plain = directory / name
    if plain.exists():  # a crash mid-gzip leaves both; the plain file is the complete one
        return open(plain, "rb")
    zipped = directory / (name + GZIP_SUFFIX)
    if zipped.exists():
        return gzip.GzipFile(zipped, "rb")
    return None


def _is_prefix(path: Path, other_dir: Path, name: str) -> bool:
    """Is the file at ``path`` (absent counts as empty) a byte prefix of ``other_dir``'s copy of ``name``?"""
    if not path.exists():
        return True
    with open(path, "rb") as mine:
        other = _open_jsonl(other_dir, name)
        if other is None:
            return not mine.read(1)
        with other:
            while chunk := mine.read(_CHUNK):
                if other.read(len(chunk)) != chunk:
                    return False
    return True
