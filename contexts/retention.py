"""Retention of completed contexts (001 §8.1): gzip after N days, delete after M days.

``plan_retention`` is pure (it takes ``now``); ``apply_retention`` carries a plan out.  Gzipping
writes ``x.jsonl.gz`` beside ``x.jsonl`` and only then removes the original, so a crash leaves both
(readers prefer the plain file) and never neither.
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

from contexts.atomic import fsync_dir
from contexts.clock import parse_iso
from contexts.names import FILE_MODE, GZIP_SUFFIX, JSONL_FILES, MUTEX_DIR
from contexts.state import read_state
from contexts.store import ContextStore


@dataclass(frozen=True)
class RetentionAction:
    """One thing retention will do (or did) to one completed context."""

    uuid: str
    action: Literal["gzip", "delete"]
    completed_at: datetime


def plan_retention(
    completed: list[tuple[str, datetime, bool]],
    now: datetime,
    gzip_after_days: float,
    delete_after_days: float,
) -> list[RetentionAction]:
    """Given ``(uuid, completed_at, already_gzipped)`` triples, what to gzip and what to delete."""
    actions = []
    for uuid, completed_at, gzipped in completed:
        age = now - completed_at
        if age > timedelta(days=delete_after_days):
            actions.append(RetentionAction(uuid, "delete", completed_at))
        elif age > timedelta(days=gzip_after_days) and not gzipped:
            actions.append(RetentionAction(uuid, "gzip", completed_at))
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
    """Compress the context's JSONL files in place."""
    for name in JSONL_FILES:
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


def _carry_out(store: ContextStore, action: RetentionAction) -> None:
    """Gzip or delete one context, and its index row after it (gzipped: its new size; deleted: gone)."""
    path = store.completed_path(action.uuid)
    if action.action == "gzip":
        gzip_context(path)
        store.mirror(lambda index: index.record(path))
    else:
        delete_context(store, action.uuid)
        store.mirror(lambda index: index.forget(action.uuid))


def apply_retention(
    store: ContextStore, now: datetime, gzip_after_days: float, delete_after_days: float, *, dry_run: bool = False
) -> list[RetentionAction]:
    """Plan and (unless ``dry_run``) carry out retention; returns the actions."""
    actions = plan_retention(completed_inventory(store), now, gzip_after_days, delete_after_days)
    if not dry_run:
        for action in actions:
            _carry_out(store, action)
        # Retention reads every completed context anyway: the one daily pass that also mends rows nothing else would
        # (a row whose delete was lost, a context copied in by hand).
        store.mirror(lambda index: index.reconcile(everything=True))
    return actions
