"""What the templates get: the task page's view of a context, and the filters that format values."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import takewhile
from pathlib import Path
from typing import Any

from console.diff import BranchDiff, branch_diff
from console.live import News, Seen
from console.timeline import Entry, TokenChart, TokenTally, compression_entry, entries, message_entry, token_chart
from contexts import jsonl
from contexts.atomic import read_json
from contexts.clock import parse_iso
from contexts.names import ACTIVE_STATUSES, FINAL_STATUSES, MESSAGES_FILE, METADATA_FILE, SUMMARIES_FILE
from contexts.queries import ContextDetail, show_context
from contexts.store import ContextStore
from worker.settings_models import Settings

STATUSES = (*ACTIVE_STATUSES, *FINAL_STATUSES)


def duration(seconds: float | None) -> str:
    """``42s``, ``5m 03s``, ``2h 05m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(round(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def when(value: Any) -> str:
    """``2026-01-15 10:30:00 UTC`` from a datetime or an ISO string; ``-`` when absent or unreadable."""
    if isinstance(value, str) and value:
        text = value
        try:
            value = parse_iso(text)
        except ValueError:
            return text
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "-"


def web_link(value: Any) -> str | None:
    """``value`` when it is an http(s) URL, else None: a ``javascript:`` or ``data:`` URL never becomes a link."""
    if isinstance(value, str) and value.startswith(("https://", "http://")) and '"' not in value:
        return value
    return None


FILTERS = {"duration": duration, "when": when, "web_link": web_link}


@dataclass(frozen=True)
class TaskView:
    """Everything the task page shows of one context."""

    detail: ContextDetail
    timeline: list[Entry]
    chart: TokenChart
    diff: BranchDiff
    running: bool
    issue: dict[str, Any]
    result: dict[str, Any]
    memory: dict[str, Any] | None
    environment: dict[str, Any] | None  # state.json's environment: how the task got it (SPEC §17)
    setup: dict[str, Any] | None  # the newest setup record's result: its log tail, what it created
    last_seq: int
    last_summary: int

    @property
    def uuid(self) -> str:
        """The task's UUID."""
        return self.detail.summary.uuid


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def task_view(settings: Settings, store: ContextStore, uuid: str) -> TaskView:
    """Read one context whole (``uuid`` checked against the store: no ``../``, no symlink out of it)."""
    store.locate_inside(uuid)
    detail = show_context(store, uuid, limit=None)
    request = _dict(detail.metadata.get("request"))
    workspace = Path(settings.contexts.workspaces_dir) / detail.summary.uuid
    return TaskView(
        detail=detail,
        timeline=entries(detail.messages, detail.tools, detail.summaries),
        chart=token_chart(detail.messages, detail.summaries, _dict(detail.metadata.get("config"))),
        diff=branch_diff(workspace, detail.metadata, detail.state),
        running=detail.summary.status not in FINAL_STATUSES,
        issue=_dict(request.get("issue")),
        result=_dict(detail.state.get("result")),
        memory=_dict(detail.state.get("memory")) or None,
        environment=_dict(detail.state.get("environment")) or None,
        setup=next((_dict(t.get("result")) for t in reversed(detail.tools) if t.get("tool_name") == "setup"), None),
        last_seq=int(detail.messages[-1]["seq"]) if detail.messages else 0,
        last_summary=int(detail.summaries[-1]["summary_id"]) if detail.summaries else 0,
    )


def tally_until(store: ContextStore, uuid: str, seen: Seen) -> TokenTally:
    """The chart's tally of the history a page already shows (messages up to ``seen``), for its live points."""
    directory = store.locate_inside(uuid)
    tally = TokenTally(_dict(read_json(directory / METADATA_FILE).get("config")))
    tally.add_summaries(takewhile(lambda r: int(r.get("summary_id", 0)) <= seen.summaries,
                                  jsonl.iter_records(directory / SUMMARIES_FILE)))
    tally.add_messages(takewhile(lambda r: int(r.get("seq", 0)) <= seen.messages,
                                 jsonl.iter_records(directory / MESSAGES_FILE)))
    return tally


def news_entries(found: News) -> list[Entry]:
    """The timeline entries of what a running task appended (compressions after the messages they replaced)."""
    by_call = {str(t["tool_call_id"]): t for t in found.tools if t.get("tool_call_id")}
    out = [message_entry(m, by_call) for m in found.messages]
    out.extend(compression_entry(s) for s in found.summaries)
    return out
