"""The context index's tables, and how one context directory becomes one row (see :mod:`contexts.index`)."""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts.atomic import read_json
from contexts.clock import parse_iso
from contexts.names import ACTIVE_STATUSES, METADATA_FILE
from contexts.summary import ContextSummary, disk_usage
from contexts.totals import nano_usd

SCHEMA_VERSION = "2"  # 2: spend (cost_nusd, priced)

# The tallies are keyed by (location, status, user_key): the unfiltered and the status/user-filtered totals read
# a handful of tally rows, never the context rows.  ``newest`` orders ties as a newest-first count would.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contexts (
    uuid TEXT PRIMARY KEY,
    location TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    duration_us INTEGER,
    task_source TEXT NOT NULL,
    repository TEXT NOT NULL,
    user TEXT,
    user_key TEXT NOT NULL,
    task_type TEXT NOT NULL,
    task_id TEXT NOT NULL,
    title TEXT,
    steps INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    messages INTEGER NOT NULL,
    compressions INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    summary TEXT NOT NULL,
    cost_nusd INTEGER NOT NULL,
    priced INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS contexts_newest ON contexts (created_at, uuid);
CREATE INDEX IF NOT EXISTS contexts_location ON contexts (location, created_at, uuid);
CREATE INDEX IF NOT EXISTS contexts_status ON contexts (status, created_at, uuid);
CREATE INDEX IF NOT EXISTS contexts_user ON contexts (user, created_at, uuid);
CREATE INDEX IF NOT EXISTS contexts_repository ON contexts (repository, created_at, uuid);
CREATE INDEX IF NOT EXISTS contexts_ended ON contexts (location, ended_at);
CREATE INDEX IF NOT EXISTS contexts_tally ON contexts (location, status, user_key, created_at);
CREATE TABLE IF NOT EXISTS damaged (uuid TEXT PRIMARY KEY, location TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tallies (
    location TEXT NOT NULL,
    status TEXT NOT NULL,
    user_key TEXT NOT NULL,
    n INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    messages INTEGER NOT NULL,
    compressions INTEGER NOT NULL,
    duration_us INTEGER NOT NULL,
    durations INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    newest REAL NOT NULL,
    cost_nusd INTEGER NOT NULL,
    priced INTEGER NOT NULL,
    PRIMARY KEY (location, status, user_key)
);
"""
_ADD = """
INSERT INTO tallies VALUES (new.location, new.status, new.user_key, 1, new.tokens, new.messages, new.compressions,
    IFNULL(new.duration_us, 0), new.duration_us IS NOT NULL, new.disk_bytes, new.created_at, new.cost_nusd,
    new.priced)
ON CONFLICT DO UPDATE SET n = n + 1, tokens = tokens + excluded.tokens, messages = messages + excluded.messages,
    compressions = compressions + excluded.compressions, duration_us = duration_us + excluded.duration_us,
    durations = durations + excluded.durations, disk_bytes = disk_bytes + excluded.disk_bytes,
    newest = MAX(newest, excluded.newest), cost_nusd = cost_nusd + excluded.cost_nusd,
    priced = priced + excluded.priced;
"""
_REMOVE = """
UPDATE tallies SET n = n - 1, tokens = tokens - old.tokens, messages = messages - old.messages,
    compressions = compressions - old.compressions, duration_us = duration_us - IFNULL(old.duration_us, 0),
    durations = durations - (old.duration_us IS NOT NULL), disk_bytes = disk_bytes - old.disk_bytes,
    cost_nusd = cost_nusd - old.cost_nusd, priced = priced - old.priced,
    newest = IFNULL((SELECT MAX(created_at) FROM contexts c WHERE c.location = old.location
        AND c.status = old.status AND c.user_key = old.user_key), 0)
WHERE location = old.location AND status = old.status AND user_key = old.user_key;
DELETE FROM tallies WHERE n <= 0;
"""
TRIGGERS = (
    f"CREATE TRIGGER tally_insert AFTER INSERT ON contexts BEGIN {_ADD} END",
    f"CREATE TRIGGER tally_delete AFTER DELETE ON contexts BEGIN {_REMOVE} END",
    f"CREATE TRIGGER tally_update AFTER UPDATE ON contexts BEGIN {_REMOVE} {_ADD} END",
)
_COLUMNS = (
    "uuid, location, status, created_at, ended_at, duration_us, task_source, repository, user, user_key, "
    "task_type, task_id, title, steps, tokens, messages, compressions, disk_bytes, summary, cost_nusd, priced"
)
ENTRY_COLUMNS = (
    "uuid, status, created_at, ended_at, repository, user, task_type, task_id, title, steps, tokens, "
    "location, task_source, disk_bytes"
)
# A context never goes back from completed/ to running/: a late write of an older running row loses.
_MARKS = ", ".join("?" * len(_COLUMNS.split(", ")))
UPSERT = (  # column names are constants, values are parameters
    f"INSERT INTO contexts ({_COLUMNS}) VALUES ({_MARKS}) "  # noqa: S608
    "ON CONFLICT (uuid) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _COLUMNS.split(", ")[1:])
    # A completed row whose status is final is never overwritten by a snapshot read before the final status was
    # written (another process's reconciliation can read completed/X while it is still `completing`, and write
    # after its holder indexed it `failed`): only another final status replaces it.
    + " WHERE contexts.location = 'running' OR (excluded.location = 'completed' AND ("
    + f"excluded.status NOT IN ({', '.join(repr(s) for s in ACTIVE_STATUSES)}) "
    + f"OR contexts.status IN ({', '.join(repr(s) for s in ACTIVE_STATUSES)})))"
)


# Rows that may be stale after a crash: every running one, and completed ones not yet final (both by index).
UNFINISHED = (
    "SELECT uuid, location FROM contexts WHERE location = 'running' UNION ALL SELECT uuid, location FROM contexts "  # noqa: S608
    f"WHERE location = 'completed' AND status IN ({', '.join('?' * len(ACTIVE_STATUSES))})"
)


def repository_name(task_key: dict[str, str]) -> str:
    """``owner/repo``; a local task's repository by its name alone."""
    if task_key.get("task_source") == "local":
        return str(task_key.get("repo", ""))
    return f"{task_key.get('owner', '')}/{task_key.get('repo', '')}"


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _title(directory: Path) -> str | None:
    with suppress(OSError, ValueError, AttributeError):
        request = read_json(directory / METADATA_FILE).get("request") or {}
        title = (request.get("issue") or {}).get("title")
        return str(title) if title else None
    return None


def _summary_json(item: ContextSummary) -> str:
    # Not asdict: it deep-copies the usage totals only for json.dumps to read them. The path is rebuilt from the
    # root on reading (the store may have moved).
    data = {f.name: getattr(item, f.name) for f in fields(item) if f.name != "path"}
    return json.dumps(data, default=lambda value: value.isoformat(), ensure_ascii=False)


def summary_from_json(text: str, root: Path) -> ContextSummary:
    """A :class:`ContextSummary` stored by the index, its path under ``root``."""
    data = json.loads(text)
    for name in ("created_at", "started_at", "completed_at"):
        data[name] = parse_iso(data[name]) if data[name] else None
    return ContextSummary(**data, path=root / data["location"] / data["uuid"])


def row_of(item: ContextSummary, directory: Path) -> tuple[Any, ...]:
    """The ``contexts`` row of one context (``_COLUMNS``' order), its disk use measured now."""
    key = item.task_key
    duration = item.duration_s
    return (
        item.uuid,
        item.location,
        item.status,
        item.created_at.timestamp(),
        _epoch(item.completed_at),
        None if duration is None else round(duration * 1_000_000),
        key.get("task_source", ""),
        repository_name(key),
        item.user,
        item.user or "",
        key.get("task_type", ""),
        str(key.get("task_id", "")),
        _title(directory),
        item.llm_call_count,
        item.total_tokens_used,
        item.message_count,
        item.compression_count,
        disk_usage(directory),
        _summary_json(item),
        nano_usd(item.cost_usd),
        item.cost_usd is not None,
    )
