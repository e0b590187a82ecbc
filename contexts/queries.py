"""What the viewer and the statistics read (001 §9.1, §9.2): summaries of contexts, details, totals."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.atomic import read_json
from contexts.clock import parse_iso
from contexts.errors import BAD_DATA_ERRORS, CorruptRecordError
from contexts.names import (
    ACTIVE_STATUSES,
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

STATUSES = (*ACTIVE_STATUSES, *FINAL_STATUSES)


@dataclass(frozen=True)
class ContextSummary:
    """One context as the list, the viewer header and the statistics see it."""

    uuid: str
    location: str  # running | completed
    status: str
    task_key: dict[str, str]
    user: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    llm_call_count: int
    tool_call_count: int
    total_tokens_used: int
    compression_count: int
    attempt: int
    worker: str | None
    message_count: int
    error: str | None
    path: Path
    compression_queue_wait_ms: int = 0
    compression_run_ms: int = 0
    usage: dict[str, Any] | None = None  # state.json's spend totals (SPEC §16); None before metering

    @property
    def cost_usd(self) -> float | None:
        """USD of the task's priced model calls (``None``: none was priced)."""
        cost = (self.usage or {}).get("cost_usd")
        return float(cost) if cost is not None else None

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to completion (``None`` while running)."""
        if self.started_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.started_at).total_seconds()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps as ISO strings)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, datetime):
                data[key] = value.isoformat()
        data["path"] = str(self.path)
        data["duration_s"] = self.duration_s
        return data


@dataclass(frozen=True)
class Damaged:
    """A context directory whose files cannot be read as a context: skipped and reported, never fatal."""

    uuid: str
    path: Path
    reason: str


@dataclass(frozen=True)
class Listing:
    """The readable contexts, newest first, and the damaged ones that were skipped."""

    items: list[ContextSummary]
    damaged: list[Damaged]


def _opt_time(value: Any) -> datetime | None:
    return parse_iso(value) if value else None


def _count(state: dict[str, Any], name: str, default: int = 0) -> int:
    value = state.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CorruptRecordError(f"state.json: {name} = {value!r} is not a count")
    return int(value)


def summarize(directory: Path) -> ContextSummary:
    """Read one context directory's metadata, state and message count; CorruptRecordError if damaged."""
    try:
        metadata = read_json(directory / METADATA_FILE)
        state = read_state(directory)
        last = jsonl.last_record(directory / MESSAGES_FILE)
        status = state.get("status")
        if status not in STATUSES:
            raise CorruptRecordError(f"state.json: status {status!r} is not one of {', '.join(STATUSES)}")
        return ContextSummary(
            uuid=str(metadata["uuid"]),
            location=directory.parent.name,
            status=status,
            task_key=dict(metadata["task_key"]),
            user=metadata.get("user"),
            created_at=parse_iso(metadata["created_at"]),
            started_at=_opt_time(state.get("started_at")),
            completed_at=_opt_time(state.get("completed_at")),
            llm_call_count=_count(state, "llm_call_count"),
            tool_call_count=_count(state, "tool_call_count"),
            total_tokens_used=_count(state, "total_tokens_used"),
            compression_count=_count(state, "compression_count"),
            attempt=_count(state, "attempt", 1),
            worker=state.get("worker"),
            message_count=_count(last, "seq") if last else 0,
            error=state.get("error"),
            path=directory,
            compression_queue_wait_ms=_count(state, "compression_queue_wait_ms"),
            compression_run_ms=_count(state, "compression_run_ms"),
            usage=state["usage"] if isinstance(state.get("usage"), dict) else None,
        )
    except BAD_DATA_ERRORS as exc:  # a field missing or of the wrong type
        raise CorruptRecordError(f"{directory.name}: {type(exc).__name__}: {exc}") from exc


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


def disk_usage(directory: Path) -> int:
    """Bytes the files below ``directory`` occupy on disk (like ``du``: allocated blocks, so what the alerts
    and the statistics report is the space a full disk runs out of); files vanishing meanwhile are skipped."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += stat.st_blocks * 512 if hasattr(stat, "st_blocks") else stat.st_size
    return total


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
        total_tokens=sum(item.total_tokens_used for item in items),
        total_cost_usd=_sum_costs(item.cost_usd for item in items),
    )


def _sum_costs(costs: Iterable[float | None]) -> float | None:
    priced = [cost for cost in costs if cost is not None]
    return round(sum(priced), 9) if priced else None
