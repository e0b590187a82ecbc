"""What the task page shows of a context (SPEC §15): the conversation as a timeline, compressions where they
happened, and the prompt tokens of each step against the window. Pure functions over records already read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LONG_OUTPUT_LINES = 12  # tool output longer than this starts collapsed
_EXIT_CODE = re.compile(r"exit code: (-?\d+)")
Record = Mapping[str, Any]


@dataclass(frozen=True)
class ToolRun:
    """One tool call as ``tools.jsonl`` recorded it (or as its ``tool`` message told, when unmatched)."""

    name: str
    arguments: str
    status: str
    exit_code: int | None
    duration_ms: int | None
    output: str
    error: str | None

    @property
    def long(self) -> bool:
        """Output long enough to start collapsed."""
        return self.output.count("\n") >= LONG_OUTPUT_LINES or len(self.output) > 2000


@dataclass(frozen=True)
class Entry:
    """One item of the timeline: a message (with the tool calls it asked for or the run it reports), or a
    compression with its summary and the span of messages it replaced."""

    kind: str  # message | compression
    seq: int
    role: str = ""
    content: str = ""
    timestamp: str = ""
    token_count: int = 0
    calls: tuple[tuple[str, str], ...] = ()  # (name, arguments) an assistant message asked for
    run: ToolRun | None = None
    summary: Record = field(default_factory=dict)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        try:
            return json.dumps(json.loads(value), ensure_ascii=False, indent=2)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def _asked(record: Record) -> tuple[tuple[str, str], ...]:
    calls = []
    for call in record.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        calls.append((str(function.get("name", "?")), _arguments(function.get("arguments", ""))))
    return tuple(calls)


def tool_run(tool: Record | None, message: Record) -> ToolRun:
    """A ``tool`` message's run: from its ``tools.jsonl`` record when there is one (full output)."""
    if tool is None:
        content = _text(message.get("content"))
        return ToolRun(str(message.get("tool_name") or "tool"), "", "", _exit_code(content), None, content, None)
    output = _text(tool.get("result"))
    return ToolRun(
        name=str(tool.get("tool_name", "?")),
        arguments=_arguments(tool.get("arguments", {})),
        status=str(tool.get("status", "")),
        exit_code=_exit_code(output),
        duration_ms=int(tool["duration_ms"]) if isinstance(tool.get("duration_ms"), int | float) else None,
        output=output,
        error=_text(tool.get("error")) or None,
    )


def _exit_code(output: str) -> int | None:
    found = _EXIT_CODE.findall(output)
    return int(found[-1]) if found else None


def entries(messages: Iterable[Record], tools: Iterable[Record], summaries: Iterable[Record]) -> list[Entry]:
    """The timeline: messages in order, each compression right after the last message it replaced."""
    by_call = {str(t["tool_call_id"]): t for t in tools if t.get("tool_call_id")}
    after: dict[int, list[Record]] = {}
    for summary in summaries:
        after.setdefault(int(summary.get("end_seq", 0)), []).append(summary)
    out: list[Entry] = []
    for message in messages:
        seq = int(message.get("seq", 0))
        out.append(message_entry(message, by_call))
        out.extend(compression_entry(s) for s in after.pop(seq, []))
    for end_seq in sorted(after):  # summaries of messages not shown
        out.extend(compression_entry(s) for s in after[end_seq])
    return out


def message_entry(message: Record, by_call: Mapping[str, Record]) -> Entry:
    """One message as a timeline entry."""
    role = str(message.get("role", "?"))
    run = None
    if role == "tool":
        run = tool_run(by_call.get(str(message.get("tool_call_id"))), message)
    return Entry(
        kind="message",
        seq=int(message.get("seq", 0)),
        role=role,
        content=_text(message.get("content")),
        timestamp=str(message.get("timestamp", "")),
        token_count=int(message.get("token_count") or 0),
        calls=_asked(message),
        run=run,
    )


def compression_entry(summary: Record) -> Entry:
    """A compression: where it happened, its summary, the span it replaced."""
    return Entry(kind="compression", seq=int(summary.get("end_seq", 0)), content=_text(summary.get("summary")),
                 timestamp=str(summary.get("created_at", "")), summary=summary)


@dataclass(frozen=True)
class TokenChart:
    """Prompt tokens of each model call against the window and the compression threshold."""

    steps: list[int]
    prompt_tokens: list[int]
    window: int
    threshold: int
    estimated: bool  # the records carry no reported prompt size: summed from the messages' token counts

    def to_json(self) -> str:
        """The data the page's chart script reads (a JSON block, never executed)."""
        return json.dumps({"steps": self.steps, "prompt_tokens": self.prompt_tokens, "window": self.window,
                           "threshold": self.threshold, "estimated": self.estimated})


class TokenTally:
    """Each model call's prompt size, fed the context's records in order: the chart a page is drawn with, and
    the points a live page adds as the task goes on (without reading the history again)."""

    def __init__(self, config: Record) -> None:
        self.window = int(config.get("context_length") or 0)
        self.threshold = int(self.window * float(config.get("compression_threshold") or 0))
        self.sizes: list[int] = []
        self.estimated = False  # some record carries no reported prompt size: summed from the messages' token counts
        self._ends: list[tuple[int, int]] = []  # (end_seq, summary_tokens) of each compression
        self._running: list[tuple[int, int]] = []  # (seq, tokens) of every message so far

    def add_summaries(self, summaries: Iterable[Record]) -> None:
        """Compressions: the estimate of a later prompt counts a summary in place of the messages it replaced."""
        self._ends = sorted([*self._ends, *((int(s.get("end_seq", 0)), int(s.get("summary_tokens", 0)))
                                            for s in summaries)])

    def add_messages(self, messages: Iterable[Record]) -> list[int]:
        """Messages, oldest first; returns the prompt sizes of the model calls among them."""
        added: list[int] = []
        for message in messages:
            seq = int(message.get("seq", 0))
            if message.get("role") == "assistant":
                reported = (message.get("usage") or {}).get("prompt_tokens")  # the call's own record (SPEC §16)
                if isinstance(reported, int) and reported > 0:
                    added.append(reported)
                else:
                    self.estimated = True
                    added.append(_estimate(self._running, self._ends, seq))
            self._running.append((seq, int(message.get("token_count") or 0)))
        self.sizes.extend(added)
        return added

    def chart(self) -> TokenChart:
        """The chart of every call so far."""
        return TokenChart(list(range(1, len(self.sizes) + 1)), list(self.sizes), self.window, self.threshold,
                          self.estimated)


def token_chart(messages: Iterable[Record], summaries: Iterable[Record], config: Record) -> TokenChart:
    """Each assistant message's prompt size: as the provider reported it, else estimated from the messages
    before it that no compression had replaced yet (plus the summaries standing in for them)."""
    tally = TokenTally(config)
    tally.add_summaries(summaries)
    tally.add_messages(messages)
    return tally.chart()


def _estimate(before: list[tuple[int, int]], ends: list[tuple[int, int]], seq: int) -> int:
    done = [(end, tokens) for end, tokens in ends if end < seq]
    replaced_to = done[-1][0] if done else 0
    return sum(tokens for s, tokens in before if s > replaced_to or s <= 2) + sum(t for _, t in done[-1:])
