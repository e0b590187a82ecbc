"""Retention of completed contexts (001 §8.1): gzip after N days, delete after M days.

``plan_retention`` is pure (it takes ``now``); ``apply_retention`` carries a plan out.  Gzipping
writes ``x.jsonl.gz`` beside ``x.jsonl`` and only then removes the original, so a crash leaves both
(readers prefer the plain file) and never neither.

In fleet mode (SPEC §12) a context is kept twice: its directory on the host that ran it, and its durable copy
beside every host's (:class:`~contexts.durable.DurableCopy`). A delete removes the directory, then forgets the
durable copy, or the context would come back: any host rebuilds a context it has no directory of from that copy.
And a pass on any host also forgets the copies (and index rows) of old finished contexts whose directories are on
other hosts, so the fleet's contexts expire when only one host's maintenance worker runs the daily job; those
directories stay on their hosts until each host's own pass deletes them.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import structlog

from contexts.atomic import fsync_dir
from contexts.clock import parse_iso
from contexts.errors import StoreUnavailable
from contexts.names import FILE_MODE, GZIP_SUFFIX, JSONL_FILES, MUTEX_DIR, RECORD_FILES
from contexts.state import read_state
from contexts.store import ContextStore

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RetentionAction:
    """One thing retention will do (or did) to one completed context: gzip or delete this host's directory, or
    forget the durable copy and index row of a context whose directory is not on this host (fleet mode)."""

    uuid: str
    action: Literal["gzip", "delete", "forget"]
    completed_at: datetime


def plan_retention(
    completed: list[tuple[str, datetime, bool]],
    now: datetime,
    gzip_after_days: float,
    delete_after_days: float,
    elsewhere: list[tuple[str, datetime]] | None = None,
) -> list[RetentionAction]:
    """Given ``(uuid, completed_at, already_gzipped)`` triples, what to gzip and what to delete; and of
    ``elsewhere``, ``(uuid, completed_at)`` of finished contexts whose directory is not on this host (the fleet's
    durable copy), what to forget: those as old as a delete."""
    actions = []
    for uuid, completed_at, gzipped in completed:
        age = now - completed_at
        if age > timedelta(days=delete_after_days):
            actions.append(RetentionAction(uuid, "delete", completed_at))
        elif age > timedelta(days=gzip_after_days) and not gzipped:
            actions.append(RetentionAction(uuid, "gzip", completed_at))
    here = {uuid for uuid, _, _ in completed}
    for uuid, completed_at in elsewhere or []:
        if uuid not in here and now - completed_at > timedelta(days=delete_after_days):
            actions.append(RetentionAction(uuid, "forget", completed_at))
    return actions


def completed_inventory(store: ContextStore) -> list[tuple[str, datetime, bool]]:
    """``(uuid, completed_at, gzipped)`` for every completed context with a readable state."""
    out = []
    for uuid in store.completed_uuids():
        directory = store.completed_path(uuid)
        try:
            completed_at = read_state(directory).get("completed_at")
        except (OSError, ValueError):
            continue  # unreadable contexts are reported by the viewer, never deleted blindly
        if completed_at:
            gzipped = not any((directory / name).exists() for name in JSONL_FILES)
            out.append((uuid, parse_iso(completed_at), gzipped))
    return out


def gzip_context(directory: Path) -> None:
    """Compress the context's JSONL files in place (``requests.jsonl`` too, where the context has one)."""
    for name in RECORD_FILES:
        source = directory / name
        if not source.exists():
            continue
        target = directory / (name + GZIP_SUFFIX)
        tmp = directory / f".{name}{GZIP_SUFFIX}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as zipped, open(source, "rb") as src:
            shutil.copyfileobj(src, zipped)
        with open(tmp, "rb") as done:
            os.fsync(done.fileno())
        os.replace(tmp, target)
        fsync_dir(directory)
        os.unlink(source)


def delete_context(store: ContextStore, uuid: str) -> None:
    """Remove a completed context and its lock mutex file."""
    directory = store.completed_path(uuid)
    trash = directory.with_name(f".deleting-{uuid}")
    os.rename(directory, trash)  # gone from listings at once, even if rmtree is interrupted
    shutil.rmtree(trash)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(store.base_dir / MUTEX_DIR / uuid)


def elsewhere_inventory(store: ContextStore, before: datetime) -> list[tuple[str, datetime]]:
    """``(uuid, completed_at)`` of the durable copy's finished contexts last written before ``before`` that have no
    directory on this host (one host: none). A store out of reach is logged: this host's directories go on."""
    try:
        ended = store.durable.ended_before(before)
    except StoreUnavailable as exc:
        log.warning("retention: the fleet's durable copy not read; its contexts expire next time", error=str(exc)[:300])
        return []
    return [
        (uuid, completed_at)
        for uuid, completed_at in ended
        if not (store.completed_path(uuid).exists() or store.running_path(uuid).exists())
    ]


def _forget_copy(store: ContextStore, uuid: str) -> bool:
    """Forget the context's durable copy; whether it is gone. A store out of reach is logged: a copy whose directory
    is gone is found again by the next pass (:func:`elsewhere_inventory`)."""
    try:
        forgotten = store.durable.forget(uuid)
    except StoreUnavailable as exc:
        log.warning("retention: durable copy not forgotten", uuid=uuid, error=str(exc)[:300])
        return False
    if not forgotten:
        log.warning("retention: durable copy kept: its committed status is not final", uuid=uuid)
    return forgotten


def _carry_out(store: ContextStore, action: RetentionAction) -> None:
    """Gzip, delete or forget one context, and its index row after it (gzipped: its new size; deleted: gone)."""
    path = store.completed_path(action.uuid)
    if action.action == "gzip":
        gzip_context(path)
        store.mirror(lambda index: index.record(path))
    elif action.action == "delete":
        delete_context(store, action.uuid)
        _forget_copy(store, action.uuid)  # after the directory: a crash between leaves a copy the next pass finds
        store.mirror(lambda index: index.forget(action.uuid))
    elif _forget_copy(store, action.uuid):
        store.mirror(lambda index: index.forget(action.uuid, anywhere=True))


def apply_retention(
    store: ContextStore, now: datetime, gzip_after_days: float, delete_after_days: float, *, dry_run: bool = False
) -> list[RetentionAction]:
    """Plan and (unless ``dry_run``) carry out retention; returns the actions."""
    elsewhere = elsewhere_inventory(store, now - timedelta(days=delete_after_days))
    actions = plan_retention(completed_inventory(store), now, gzip_after_days, delete_after_days, elsewhere)
    if not dry_run:
        for action in actions:
            _carry_out(store, action)
        # Retention reads every completed context anyway: the one daily pass that also mends rows nothing else would
        # (a row whose delete was lost, a context copied in by hand).
        store.mirror(lambda index: index.reconcile(everything=True))
    return actions
