"""What the viewer and the statistics print (001 §9.1, §9.2): query results formatted for a terminal or JSON.

Every string read from a context is made safe for a terminal first: the files hold what an LLM and a
repository's tools produced, and an escape sequence in them must not reach the operator's terminal.
"""

from __future__ import annotations

import json
import textwrap
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime
from typing import Any

from cli.environment_view import environment_line, failure_tail
from contexts import jsonl
from contexts.clock import parse_iso
from contexts.errors import ContextNotFoundError
from contexts.names import FINAL_STATUSES, MESSAGES_FILE
from contexts.queries import ContextDetail, ContextSummary, Stats, readable
from contexts.state import read_state
from contexts.store import ContextStore
from contexts.usage import format_cost, format_tokens

SHOWN_BY_DEFAULT = 10  # newest messages (and summaries) the viewer shows without --messages / --summaries
ELLIPSIS = "…"
INDENT = "      "  # full-text blocks sit under their "[n] ..." line
_KEEP = frozenset("\n\t")

# -- values ----------------------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """``15m 23s``, ``2h 05m 00s``, ``3d 04h 10m``, ``42s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    days, rest = divmod(max(round(seconds), 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def format_bytes(count: int) -> str:
    """``512 B``, ``5.4 GB``, ``120 MB`` (powers of 1024)."""
    value, unit = float(count), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):  # the unit left after the loop is the one to print
        if value < 1024 or unit == "TB":
            break
        value /= 1024
    if unit == "B":
        return f"{count} B"
    return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"


def format_time(moment: datetime | str | None) -> str:
    """``2024-01-15 10:30:00 UTC`` from a datetime or a file's ISO timestamp; ``-`` when absent."""
    if isinstance(moment, str):
        text = moment
        try:
            moment = parse_iso(text)
        except ValueError:
            return safe(text)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "-"


def repository(task_key: Mapping[str, str], metadata: Mapping[str, Any] | None = None) -> str:
    """``github/notfolder/coding_agent``; a local task's repository is its path (``metadata.json``'s request keeps
    it), not ``local/local/NAME``."""
    if task_key.get("task_source") == "local":
        request = (metadata or {}).get("request")
        path = request.get("repo_path") if isinstance(request, Mapping) else None
        return safe(f"{path} (local)" if path else f"local {task_key.get('repo', '?')}")
    return safe(f"{task_key.get('task_source', '?')}/{task_key.get('owner', '?')}/{task_key.get('repo', '?')}")


def model_label(config: Any) -> str:
    """The model a task runs with, from ``metadata.json.config``: ``PROFILE (provider model)``."""
    if not isinstance(config, Mapping) or not config.get("model"):
        return "-"
    provider_model = safe(f"{config.get('llm_provider') or '?'} {config['model']}")
    return f"{safe(str(config['profile']))} ({provider_model})" if config.get("profile") else provider_model


def task_label(task_key: Mapping[str, str]) -> str:
    """``issue #27``."""
    return safe(f"{task_key.get('task_type', '?')} #{task_key.get('task_id', '?')}")


def created_within(item: ContextSummary, date_from: date | None, date_to: date | None) -> bool:
    """Whether ``item`` was created on a UTC day between ``date_from`` and ``date_to`` (inclusive)."""
    day = item.created_at.astimezone(UTC).date()
    return (date_from is None or day >= date_from) and (date_to is None or day <= date_to)


# -- text ------------------------------------------------------------------------------------------


def safe(text: str, *, keep: frozenset[str] = frozenset()) -> str:
    """``text`` with control characters (escape sequences, carriage returns) shown as ``\\xNN``."""
    return "".join(
        ch if ch in keep or unicodedata.category(ch)[0] != "C" else ch.encode("unicode_escape").decode() for ch in text
    )


def _cell_width(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal cells, ending in ``…`` when cut (wide CJK characters count 2)."""
    if sum(_cell_width(ch) for ch in text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        used += _cell_width(ch)
        if used > width - 1:
            break
        out.append(ch)
    return "".join(out) + ELLIPSIS


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, with ``…`` when more follows."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0].strip() + (ELLIPSIS if len(lines) > 1 else "")


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _indented(text: str) -> list[str]:
    return [INDENT + line for line in safe(text, keep=_KEEP).expandtabs(4).splitlines()] or [INDENT]


# -- records ---------------------------------------------------------------------------------------


def _tool_calls(record: Mapping[str, Any]) -> list[str]:
    """``name(arguments)`` of each native tool call an assistant message made."""
    calls = []
    for call in record.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        calls.append(f"{function.get('name', '?')}({_compact(function.get('arguments', ''))})")
    return calls


def message_text(record: Mapping[str, Any]) -> str:
    """What a message says: its content, the tool it answers, the tools it calls."""
    parts = []
    if record.get("role") == "tool" and record.get("tool_name"):
        parts.append(f"{record['tool_name']} ->")
    if record.get("content"):
        parts.append(str(record["content"]))
    calls = _tool_calls(record)
    if calls:
        parts.append("-> " + ", ".join(calls))
    return " ".join(parts)


def message_line(record: Mapping[str, Any], width: int) -> str:
    """``  [149] tool: github_create_commit -> Success`` within ``width`` cells."""
    text = first_line(message_text(record))
    return clip(safe(f"  [{record.get('seq')}] {record.get('role', '?')}: {text}"), width)


def message_block(record: Mapping[str, Any]) -> list[str]:
    """A message in full: ``[seq] role  time  tokens`` and its text indented below."""
    when = format_time(record.get("timestamp"))
    head = f"  [{record.get('seq')}] {record.get('role', '?')}  {when}  {int(record.get('token_count', 0)):,} tokens"
    if record.get("truncated_from"):
        head += f"  (cut from {int(record['truncated_from']):,} chars for the prompt)"
    return [safe(head), *_indented(message_text(record))]


def summary_line(record: Mapping[str, Any], width: int) -> str:
    """``  [1] seq 10-50: Fixed authentication bug...``."""
    text = first_line(str(record.get("summary", "")))
    return clip(
        safe(f"  [{record.get('summary_id')}] seq {record.get('start_seq')}-{record.get('end_seq')}: {text}"), width
    )


def how_made(record: Mapping[str, Any]) -> str:
    """Where a summary ran and how long it waited and took (records written before these facts: nothing)."""
    if "via" not in record:
        return ""
    return (f"  via {record['via']}, waited {int(record.get('queue_wait_ms', 0)) / 1000:.1f}s, "
            f"ran {int(record.get('run_ms', 0)) / 1000:.1f}s")


def summary_block(record: Mapping[str, Any]) -> list[str]:
    """A summary in full, with its token counts."""
    head = (
        f"  [{record.get('summary_id')}] seq {record.get('start_seq')}-{record.get('end_seq')}  "
        f"{int(record.get('original_tokens', 0)):,} -> {int(record.get('summary_tokens', 0)):,} tokens "
        f"(ratio {record.get('compression_ratio', '-')})  {format_time(record.get('created_at'))}{how_made(record)}"
    )
    return [safe(head), *_indented(str(record.get("summary", "")))]


def tool_lines(record: Mapping[str, Any], width: int) -> list[str]:
    """``  [3] read_file success 234ms {"path":"main.py"}``, and the error on a second line."""
    head = (
        f"  [{record.get('seq')}] {record.get('tool_name', '?')} {record.get('status', '?')} "
        f"{int(record.get('duration_ms', 0))}ms {_compact(record.get('arguments', {}))}"
    )
    lines = [clip(safe(head), width)]
    if record.get("error"):
        lines.append(clip(safe(f"{INDENT}error: {first_line(str(record['error']))}"), width))
    return lines


# -- the viewer (001 §9.1) -------------------------------------------------------------------------


def format_detail(
    detail: ContextDetail,
    *,
    now: datetime,
    width: int,
    all_messages: bool = False,
    all_summaries: bool = False,
    show_tools: bool = False,
    priced: bool = False,
    setup: Mapping[str, Any] | None = None,
) -> str:
    """The viewer: header (with the environment, and ``setup``'s last lines when it failed: its ``tools.jsonl``
    record), statistics (``priced``: a price table is configured), the newest messages and the summaries (all of
    them, in full, on request)."""
    item = detail.summary
    duration = format_duration(item.duration_s)
    if item.duration_s is None and item.started_at is not None:
        duration = f"{format_duration((now - item.started_at).total_seconds())} so far"
    lines = [
        f"Task UUID: {item.uuid}",
        f"Status: {safe(item.status)}",
        f"Repository: {repository(item.task_key, detail.metadata)}",
        f"Task: {task_label(item.task_key)}",
        f"Model: {model_label(detail.metadata.get('config'))}",
        f"Started: {format_time(item.started_at)}",
        f"Completed: {format_time(item.completed_at)}",
        f"Duration: {duration}",
        f"Attempt: {item.attempt}",
        f"Worker: {safe(item.worker or '-')}",
        *environment_detail(detail.state.get("environment"), setup, width),
        clip(f"Error: {safe(first_line(item.error or '') or '-')}", width),
        "",
        "Statistics:",
        f"  LLM calls: {item.llm_call_count:,}",
        f"  Tool calls: {item.tool_call_count:,}",
        f"  Total tokens: {format_tokens(detail.state)}",
        *([f"  Cost: {format_cost(item.cost_usd, priced)}"] if item.usage else []),  # none before metering
        f"  Compressions: {item.compression_count:,}"
        + (f" (waited {item.compression_queue_wait_ms / 1000:.1f}s to start, ran {item.compression_run_ms / 1000:.1f}s)"
           if item.compression_count else ""),
        *memory_lines(detail.state.get("memory"), width),
        *egress_lines(detail.state.get("egress_refused"), width),
        "",
    ]
    messages = detail.messages if all_messages else detail.messages[-SHOWN_BY_DEFAULT:]
    lines.append(_count_heading("Messages", item.message_count, len(messages)))
    for record in messages:
        lines.extend(message_block(record) if all_messages else [message_line(record, width)])
    summaries = detail.summaries if all_summaries else detail.summaries[-SHOWN_BY_DEFAULT:]
    lines += ["", _count_heading("Summaries", len(detail.summaries), len(summaries))]
    for record in summaries:
        lines.extend(summary_block(record) if all_summaries else [summary_line(record, width)])
    if show_tools:
        lines += ["", _count_heading("Tool calls", len(detail.tools), len(detail.tools))]
        for record in detail.tools:
            lines.extend(tool_lines(record, width))
    return "\n".join(lines)


def environment_detail(environment: Any, setup: Mapping[str, Any] | None, width: int) -> list[str]:
    """``Environment: built in 3.2 s (declared by ...) at 2026-...``; a failed setup's last lines under it."""
    line = environment_line(environment)
    if not line:
        return ["Environment: -"]
    when = f" at {format_time(setup['timestamp'])}" if setup and setup.get("timestamp") else ""
    lines = wrapped(safe(f"Environment: {line}{when}"), width)
    tail = failure_tail(setup)
    if tail:
        lines.append("  Setup's last lines:")
        lines += [clip(safe(f"    | {text}"), width) for text in tail]
    return lines


def wrapped(text: str, width: int) -> list[str]:
    """``text`` on as many lines as it takes (continuations indented), where ``clip`` would cut what it says."""
    return textwrap.wrap(text, max(width, 40), subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False) or [""]


def egress_lines(refused: Any, width: int) -> list[str]:
    """The hosts the egress proxy refused this task (``state.json.egress_refused``), one line each, with why."""
    if not isinstance(refused, list) or not refused:
        return []
    lines = [f"  Egress refused: {len(refused)} host(s)"]
    for entry in refused:
        if isinstance(entry, dict):
            why = f" ({entry['reason']})" if entry.get("reason") else ""
            where = f"{entry.get('host')}:{entry.get('port')}"
            lines.append(clip(safe(f"    {where} x{entry.get('count')}, last at {entry.get('last_at')}{why}"), width))
    return lines


def memory_lines(used: Any, width: int) -> list[str]:
    """What memory the task's first prompt carried (``state.json.memory``), if it recorded any."""
    if not isinstance(used, dict):
        return []
    files = ", ".join(str(f) for f in used.get("instruction_files") or []) or "none"
    episodes = used.get("episodes") or []
    lines = wrapped(safe(
        f"  Memory: instruction files {files}; repository memory {'yes' if used.get('repository_memory') else 'no'}; "
        f"thread memory {'yes' if used.get('thread_memory') else 'no'}; {len(episodes)} recalled episode(s) "
        f"{' '.join(str(e)[:8] for e in episodes)}; {int(used.get('tokens') or 0):,} tokens; recall "
        f"{'with ' + str(used['embedder']) if used.get('embedder') else 'BM25 only'}"), width)
    if used.get("note"):
        lines.append(clip(safe(f"  Memory note: {first_line(str(used['note']))}"), width))
    return lines


def _count_heading(what: str, total: int, shown: int) -> str:
    return f"{what}: {total:,}" + (f" (showing last {shown})" if shown < total else "")


def detail_json(detail: ContextDetail) -> dict[str, Any]:
    """The viewer's data as one JSON object."""
    return {
        "context": detail.summary.to_json(),
        "metadata": detail.metadata,
        "state": detail.state,
        "messages": detail.messages,
        "summaries": detail.summaries,
        "tools": detail.tools,
    }


def follow(
    store: ContextStore,
    uuid: str,
    after_seq: int,
    write: Callable[[str], None],
    *,
    width: int,
    interval_s: float = 0.5,
) -> str:
    """Print messages newer than ``after_seq`` and every change of state (status, step, tokens, compressions,
    attempt) as they are written, until the context ends; returns its final status.

    Each look goes through :func:`~contexts.queries.readable`: this host's directory when the context is here, else
    (fleet mode) a private copy rebuilt from the durable copy as its last committed step left it, so another host's
    task is followed step by step too (a rebuild reads the whole context: tens of milliseconds at 10,000 messages,
    once per look)."""
    from cli.progress import progress_line

    last_state = ""
    while True:
        try:
            with readable(store, uuid) as (where, _here):
                directory = where.locate(uuid)  # running/ until it completes, then completed/
                state = read_state(directory)
                fresh: list[dict[str, Any]] = []
                for record in jsonl.iter_records_reversed(directory / MESSAGES_FILE):
                    if int(record.get("seq", 0)) <= after_seq:
                        break
                    fresh.append(record)
        except (OSError, ContextNotFoundError):  # moved to completed/ between locate and read: look again
            time.sleep(interval_s)
            continue
        status = str(state.get("status"))
        line = f"-- {safe(progress_line(state))}"
        if line != last_state:
            write(line)
            last_state = line
        for record in reversed(fresh):
            write(message_line(record, width))
            after_seq = int(record["seq"])
        if status in FINAL_STATUSES:  # read after the status: a final context gets no more messages
            write(f"Status: {safe(status)}")
            return status
        time.sleep(interval_s)  # polling a file for a human; nothing here synchronizes with a test


# -- the list --------------------------------------------------------------------------------------

LIST_HEADINGS = ("UUID", "STATUS", "TASK", "USER", "CREATED (UTC)", "DURATION", "TOKENS")
_TASK_COLUMN_MAX = 48


def task_ref(task_key: Mapping[str, str]) -> str:
    """``github/notfolder/coding_agent#27``."""
    return clip(f"{repository(task_key)}#{safe(str(task_key.get('task_id', '?')))}", _TASK_COLUMN_MAX)


def format_list(items: Iterable[ContextSummary]) -> str:
    """A table of contexts, in the order given (newest first from ``list_contexts``)."""
    rows = [
        (
            item.uuid,
            safe(item.status),
            task_ref(item.task_key),
            safe(item.user or "-"),
            item.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            format_duration(item.duration_s),
            f"{item.total_tokens_used:,}",
        )
        for item in items
    ]
    if not rows:
        return "No contexts."
    table = [LIST_HEADINGS, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(LIST_HEADINGS))]
    right = {len(LIST_HEADINGS) - 2, len(LIST_HEADINGS) - 1}  # durations and tokens line up on the right
    lines = []
    for row in table:
        cells = (
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- the statistics (001 §9.2) ---------------------------------------------------------------------


def format_stats(stats: Stats, filters: Mapping[str, str] | None = None, *, priced: bool = False) -> str:
    """001 §9.2's report over the contexts ``filters`` selected (all of them without filters), with their spend
    (``priced``: a price table is configured)."""
    title = "Context Storage Statistics"
    lines = [title, "=" * len(title)]
    if filters:
        lines.append("Filter: " + safe(", ".join(f"{key}={value}" for key, value in filters.items())))
    lines += [
        "",
        f"Total contexts: {stats.total:,}",
        f"  - Running: {stats.running:,}",
        f"  - Completed: {stats.completed:,}",
    ]
    if stats.by_status:
        lines += ["", "By status:", *(f"  - {safe(name)}: {n:,}" for name, n in stats.by_status.items())]
    lines += [
        "",
        "Disk usage" + (" (whole store):" if filters else ":"),
        f"  - Running: {format_bytes(stats.disk_running_bytes)}",
        f"  - Completed: {format_bytes(stats.disk_completed_bytes)}",
    ]
    lines += [
        "",
        "Spend:",
        f"  - Tokens: {stats.total_tokens:,}",
        f"  - Cost: {format_cost(stats.total_cost_usd, priced)}",
    ]
    if stats.total:
        lines += [
            "",
            "Average per task:",
            f"  - Messages: {stats.avg_messages:,.0f}",
            f"  - Tokens: {stats.avg_tokens:,.0f}",
            f"  - Duration: {format_duration(stats.avg_duration_s)}",
            f"  - Compressions: {stats.avg_compressions:.1f}",
            "",
            "By user:",
            *(
                f"  - {safe(user)}: {n:,} task{'s' if n != 1 else ''} ({100 * n / stats.total:.0f}%)"
                for user, n in stats.by_user.items()
            ),
        ]
    return "\n".join(lines)


def to_json(data: Any) -> str:
    """Pretty JSON as the ``--json`` options print it."""
    return json.dumps(data, ensure_ascii=False, indent=2, default=str)
