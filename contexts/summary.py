"""What one context directory says about its task: the summary the list, the index and the statistics read."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.atomic import read_json
from contexts.clock import parse_iso
from contexts.errors import BAD_DATA_ERRORS, CorruptRecordError
from contexts.names import ACTIVE_STATUSES, FINAL_STATUSES, MESSAGES_FILE, METADATA_FILE
from contexts.state import read_state

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
        )
    except BAD_DATA_ERRORS as exc:  # a field missing or of the wrong type
        raise CorruptRecordError(f"{directory.name}: {type(exc).__name__}: {exc}") from exc


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


def context_uuids(directory: Path) -> list[str]:
    """Names of the context directories directly under ``directory`` (``running/`` or ``completed/``)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            # A symlinked directory is never a context: it could point out of the contexts root.
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                out.append(entry.name)
    return out
