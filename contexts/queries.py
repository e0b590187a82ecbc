"""What the viewer and the statistics read (001 §9.1, §9.2): summaries of contexts, details, totals."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.atomic import read_json
from contexts.errors import CorruptRecordError
from contexts.names import COMPLETED_DIR, MESSAGES_FILE, METADATA_FILE, RUNNING_DIR, SUMMARIES_FILE, TOOLS_FILE
from contexts.state import read_state
from contexts.store import ContextStore
from contexts.summary import STATUSES, ContextSummary, Damaged, disk_usage, summarize

__all__ = ["STATUSES", "ContextSummary", "Damaged", "disk_usage", "summarize"]  # their home is contexts.summary


@dataclass(frozen=True)
class Listing:
    """The readable contexts, newest first, and the damaged ones that were skipped."""

    items: list[ContextSummary]
    damaged: list[Damaged]


def read_contexts(store: ContextStore, *, status: str | None = None, user: str | None = None) -> Listing:
    """Every readable context, newest first, optionally filtered; damaged ones are listed apart."""
    items, damaged = [], []
    for location, uuids in ((RUNNING_DIR, store.running_uuids()), (COMPLETED_DIR, store.completed_uuids())):
        for uuid in uuids:
            directory = store.base_dir / location / uuid
            try:
                item = summarize(directory)
            except (OSError, CorruptRecordError) as exc:
                if directory.is_dir():  # else it vanished mid-listing (moved to completed/ or deleted)
                    damaged.append(Damaged(uuid, directory, str(exc)))
                continue
            if (status is None or item.status == status) and (user is None or item.user == user):
                items.append(item)
    items.sort(key=lambda item: item.created_at, reverse=True)
    return Listing(items, damaged)


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

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def compute_stats(
    store: ContextStore,
    *,
    user: str | None = None,
    status: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> Stats:
    """Statistics over contexts created between ``date_from`` and ``date_to`` (inclusive, UTC)."""
    listing = read_contexts(store, status=status, user=user)
    items = [
        item
        for item in listing.items
        if (date_from is None or item.created_at.date() >= date_from)
        and (date_to is None or item.created_at.date() <= date_to)
    ]
    count = len(items) or 1
    durations = [d for d in (item.duration_s for item in items) if d is not None]
    return Stats(
        total=len(items),
        running=sum(1 for item in items if item.location == RUNNING_DIR),
        completed=sum(1 for item in items if item.location == COMPLETED_DIR),
        by_status=dict(Counter(item.status for item in items).most_common()),
        disk_running_bytes=disk_usage(store.base_dir / RUNNING_DIR),
        disk_completed_bytes=disk_usage(store.base_dir / COMPLETED_DIR),
        avg_messages=sum(item.message_count for item in items) / count,
        avg_tokens=sum(item.total_tokens_used for item in items) / count,
        avg_duration_s=sum(durations) / len(durations) if durations else None,
        avg_compressions=sum(item.compression_count for item in items) / count,
        by_user=dict(Counter(item.user or "(none)" for item in items).most_common()),
        damaged=[{"uuid": damaged.uuid, "reason": damaged.reason} for damaged in listing.damaged],
    )
