"""What the viewer and the statistics read (001 §9.1, §9.2): summaries of contexts, details, totals."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.atomic import read_json
from contexts.errors import ContextNotFoundError, CorruptRecordError
from contexts.names import (
    COMPLETED_DIR,
    FINAL_STATUSES,
    MESSAGES_FILE,
    METADATA_FILE,
    RUNNING_DIR,
    SUMMARIES_FILE,
    TOOLS_FILE,
)
from contexts.state import read_state
from contexts.store import ContextStore
from contexts.summary import STATUSES, ContextSummary, Damaged, context_uuids, disk_usage, summarize
from contexts.totals import Totals, fold, tally_of

__all__ = ["STATUSES", "ContextSummary", "Damaged", "disk_usage", "summarize"]  # their home is contexts.summary


@dataclass(frozen=True)
class Listing:
    """The readable contexts, newest first, and the damaged ones that were skipped."""

    items: list[ContextSummary]
    damaged: list[Damaged]


def _read(store: ContextStore, location: str, status: str | None, user: str | None) -> Listing:
    items, damaged = [], []
    for uuid in context_uuids(store.base_dir / location):
        directory = store.base_dir / location / uuid
        try:
            item = summarize(directory)
        except (OSError, CorruptRecordError) as exc:
            if directory.is_dir():  # else it vanished mid-listing (moved to completed/ or deleted)
                damaged.append(Damaged(uuid, directory, str(exc)))
            continue
        if (status is None or item.status == status) and (user is None or item.user == user):
            items.append(item)
    return Listing(items, damaged)


def read_contexts(store: ContextStore, *, status: str | None = None, user: str | None = None) -> Listing:
    """Every readable context, newest first, optionally filtered; damaged ones are listed apart.

    Reads every context directory: what the index is checked against. The commands read :func:`list_page`."""
    running, completed = (_read(store, location, status, user) for location in (RUNNING_DIR, COMPLETED_DIR))
    items = sorted([*running.items, *completed.items], key=lambda item: item.created_at, reverse=True)
    return Listing(items, [*running.damaged, *completed.damaged])


@dataclass(frozen=True)
class Page:
    """One page of the newest contexts, how many match in all, and the damaged ones known."""

    items: list[ContextSummary]
    total: int
    damaged: list[Damaged]


def every_summary(store: ContextStore) -> Listing:
    """Every context, newest first: running ones read from their directories (few), completed ones from the
    index (one query, not a directory read each), as the spend report and the daily counters' rebuild need."""
    running = _read(store, RUNNING_DIR, None, None)
    completed = store.index.summaries(location=COMPLETED_DIR, limit=None)
    running.items.extend(store.index.elsewhere())
    return Listing(_newest_first(running.items, completed), [*running.damaged, *_damaged_completed(store)])


def _newest_first(running: list[ContextSummary], completed: list[ContextSummary]) -> list[ContextSummary]:
    """Running and completed contexts together, newest first; one that finished between the two reads is taken
    once, as it ended."""
    moved = {item.uuid for item in completed}
    return sorted([*(item for item in running if item.uuid not in moved), *completed],
                  key=lambda item: item.created_at, reverse=True)


def list_page(
    store: ContextStore, *, status: str | None = None, user: str | None = None, limit: int = 50, offset: int = 0
) -> Page:
    """The newest contexts: running ones read from their directories (few), completed ones from the index (a page
    costs the same at 10 and at 10,000 completed contexts)."""
    running = _read(store, RUNNING_DIR, status, user)
    running.items.extend(store.index.elsewhere(status=status, user=user))  # fleet mode: other hosts' running ones
    completed = store.index.summaries(status=status, user=user, location=COMPLETED_DIR, limit=offset + limit)
    newest = _newest_first(running.items, completed)
    total = len(running.items) + store.index.count(status=status, user=user, location=COMPLETED_DIR)
    return Page(newest[offset : offset + limit], total, [*running.damaged, *_damaged_completed(store)])


def _damaged_completed(store: ContextStore) -> list[Damaged]:
    return [damaged for damaged in store.index.damaged() if damaged.path.parent.name == COMPLETED_DIR]


def list_contexts(store: ContextStore, *, status: str | None = None, user: str | None = None) -> list[ContextSummary]:
    """Every readable context, newest first, optionally filtered by status and user."""
    return read_contexts(store, status=status, user=user).items


@dataclass
class ContextDetail:
    """The viewer's full picture of one context."""

    summary: ContextSummary
    metadata: dict[str, Any]
    state: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)


def newest(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """The newest ``limit`` records of a JSONL file (all when ``None``), oldest first."""
    if limit is None:
        return list(jsonl.iter_records(path))
    out: list[dict[str, Any]] = []
    for record in jsonl.iter_records_reversed(path):
        if len(out) >= limit:
            break
        out.append(record)
    return out[::-1]


def show_context(store: ContextStore, uuid: str, *, limit: int | None = 10) -> ContextDetail:
    """Metadata, state, and the newest ``limit`` messages, summaries and tool calls of ``uuid``."""
    directory = store.locate(uuid)
    return ContextDetail(
        summary=summarize(directory),
        metadata=read_json(directory / METADATA_FILE),
        state=read_state(directory),
        messages=newest(directory / MESSAGES_FILE, limit),
        summaries=newest(directory / SUMMARIES_FILE, None),
        tools=newest(directory / TOOLS_FILE, limit),
    )


@contextmanager
def readable(store: ContextStore, uuid: str) -> Iterator[tuple[ContextStore, bool]]:
    """A store that has ``uuid``'s directory, and whether it is this host's: this one when the context is here, else
    (fleet mode) a private temporary store with the context rebuilt from the durable copy as its last committed step
    left it, removed on the way out. :class:`ContextNotFoundError` when neither has it."""
    try:
        store.locate_inside(uuid)
    except ContextNotFoundError:
        if not store.durable.knows(uuid):
            raise
    else:
        yield store, True
        return
    with tempfile.TemporaryDirectory(prefix="tasuki-context-") as temporary:
        copy = ContextStore(temporary, fsync="never")
        staging = copy.base_dir / "rebuilt" / uuid
        store.durable.rebuild(uuid, staging)
        final = read_state(staging).get("status") in FINAL_STATUSES
        staging.rename(copy.completed_path(uuid) if final else copy.running_path(uuid))
        yield copy, False


@dataclass(frozen=True)
class Stats:
    """001 §9.2's statistics over a filtered set of contexts."""

    total: int
    running: int
    completed: int
    by_status: dict[str, int]
    disk_running_bytes: int
    disk_completed_bytes: int
    avg_messages: float
    avg_tokens: float
    avg_duration_s: float | None
    avg_compressions: float
    by_user: dict[str, int]
    damaged: list[dict[str, str]] = field(default_factory=list)  # {uuid, reason} of contexts skipped as unreadable
    total_tokens: int = 0
    total_cost_usd: float | None = None  # None: no model call of these tasks was priced

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _within(item: ContextSummary, date_from: date | None, date_to: date | None) -> bool:
    day = item.created_at.astimezone(UTC).date()
    return (date_from is None or day >= date_from) and (date_to is None or day <= date_to)


def _stats(totals: Totals, running_bytes: int, completed_bytes: int, damaged: list[Damaged]) -> Stats:
    count = totals.count or 1
    return Stats(
        total=totals.count,
        running=totals.by_location.get(RUNNING_DIR, 0),
        completed=totals.by_location.get(COMPLETED_DIR, 0),
        by_status=totals.by_status,
        disk_running_bytes=running_bytes,
        disk_completed_bytes=completed_bytes,
        avg_messages=totals.messages / count,
        avg_tokens=totals.tokens / count,
        avg_duration_s=totals.duration_s / totals.durations if totals.durations else None,
        avg_compressions=totals.compressions / count,
        by_user=totals.by_user,
        damaged=[{"uuid": item.uuid, "reason": item.reason} for item in damaged],
        total_tokens=totals.tokens,
        total_cost_usd=None if totals.cost_usd is None else round(totals.cost_usd, 9),
    )


def compute_stats(
    store: ContextStore,
    *,
    user: str | None = None,
    status: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> Stats:
    """Statistics over contexts created between ``date_from`` and ``date_to`` (inclusive, UTC), read from every
    context directory: what the index is checked against. The commands read :func:`indexed_stats`."""
    listing = read_contexts(store, status=status, user=user)
    totals = fold(tally_of(item) for item in listing.items if _within(item, date_from, date_to))
    running, completed = (disk_usage(store.base_dir / location) for location in (RUNNING_DIR, COMPLETED_DIR))
    return _stats(totals, running, completed, listing.damaged)


def indexed_stats(
    store: ContextStore,
    *,
    user: str | None = None,
    status: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> Stats:
    """:func:`compute_stats` from the index's running tallies plus the running contexts' own directories: without
    filters (or filtered by user and status) it costs the same at 10 and at 10,000 completed contexts."""
    running = _read(store, RUNNING_DIR, status, user)
    running.items.extend(store.index.elsewhere(status=status, user=user))
    since = datetime.combine(date_from, time.min, UTC) if date_from else None
    until = datetime.combine(date_to + timedelta(days=1), time.min, UTC) if date_to else None
    tallies = store.index.tallies(since=since, until=until, status=status, user=user, location=COMPLETED_DIR)
    totals = fold([*tallies, *(tally_of(item) for item in running.items if _within(item, date_from, date_to))])
    completed_bytes = store.index.totals(location=COMPLETED_DIR).disk_bytes
    damaged = [*running.damaged, *_damaged_completed(store)]
    return _stats(totals, disk_usage(store.base_dir / RUNNING_DIR), completed_bytes, damaged)
