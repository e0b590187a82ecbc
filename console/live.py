"""Following a running task (SPEC §15): what was appended to its context since the page last saw it, and when
it ended. The files are only ever appended to, so "new" is "seq after the last one seen"."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.errors import ContextNotFoundError
from contexts.names import FINAL_STATUSES, MESSAGES_FILE, STATE_FILE, SUMMARIES_FILE, TOOLS_FILE
from contexts.state import read_state
from contexts.store import ContextStore

POLL_S = 0.25  # how often a followed context's files are looked at (a stat each; read only when they grew)


@dataclass(frozen=True)
class Seen:
    """How far the page has got: the last message ``seq`` and the last ``summary_id`` it shows."""

    messages: int
    summaries: int


@dataclass(frozen=True)
class News:
    """What was appended since :class:`Seen`, the tool records to show with it, and whether the task ended."""

    messages: list[dict[str, Any]]
    summaries: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    ended: bool
    status: str


def _after(path: Path, key: str, last: int) -> list[dict[str, Any]]:
    """Records of ``path`` whose ``key`` is above ``last``, oldest first (read from the end backwards)."""
    found: list[dict[str, Any]] = []
    for record in jsonl.iter_records_reversed(path):
        if int(record.get(key, 0)) <= last:
            break
        found.append(record)
    return found[::-1]


def _recent_tools(path: Path, call_ids: set[str]) -> list[dict[str, Any]]:
    if not call_ids:
        return []
    found = []
    for record in jsonl.iter_records_reversed(path):
        if record.get("tool_call_id") in call_ids:
            found.append(record)
            call_ids.discard(str(record["tool_call_id"]))
            if not call_ids:
                break
    return found


def sizes(store: ContextStore, uuid: str) -> tuple[Path, int, int, int]:
    """Where the context is now, the sizes of its messages and summaries, and when its state last changed:
    what a poll compares."""
    directory = store.locate_inside(uuid)
    return (directory, _stat(directory / MESSAGES_FILE).st_size, _stat(directory / SUMMARIES_FILE).st_size,
            _stat(directory / STATE_FILE).st_mtime_ns)


def _stat(path: Path) -> os.stat_result | _Missing:
    try:
        return path.stat()
    except FileNotFoundError:  # gzipped by retention, or moved meanwhile
        return _MISSING


class _Missing:
    st_size = -1
    st_mtime_ns = -1


_MISSING = _Missing()


def news(store: ContextStore, uuid: str, seen: Seen) -> News:
    """What the context gained since ``seen``; ``ended`` once it reached a final status."""
    directory = store.locate_inside(uuid)
    status = str(read_state(directory).get("status"))
    messages = _after(directory / MESSAGES_FILE, "seq", seen.messages)
    summaries = _after(directory / SUMMARIES_FILE, "summary_id", seen.summaries)
    call_ids = {str(m["tool_call_id"]) for m in messages if m.get("tool_call_id")}
    tools = _recent_tools(directory / TOOLS_FILE, call_ids)
    return News(messages, summaries, tools, status in FINAL_STATUSES, status)


def follow(store: ContextStore, uuid: str, seen: Seen) -> Iterator[tuple[Seen, News | None]]:
    """One answer per poll (the caller waits POLL_S between them): the news when the files grew or the task
    ended, else None. Stops after the poll that saw the end, or when the context is gone."""
    last_sizes: tuple[Path, int, int, int] | None = None
    while True:
        try:
            now_sizes = sizes(store, uuid)
            if now_sizes == last_sizes:
                yield seen, None
                continue
            last_sizes = now_sizes
            found = news(store, uuid, seen)
        except ContextNotFoundError:
            return
        if found.messages:
            seen = Seen(int(found.messages[-1]["seq"]), seen.summaries)
        if found.summaries:
            seen = Seen(seen.messages, int(found.summaries[-1]["summary_id"]))
        yield seen, found
        if found.ended:
            return
