"""Building the prompt from the context files (SPEC §6): pinned task, latest summary, newest messages.

The newest messages are read lazily, newest first, and reading stops as soon as the budget is full, so
the cost depends on the size of the prompt, never on the length of the history.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from contexts.tokens import estimate_message_tokens

PROMPT_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
OMITTED_MARKER = "[{count} earlier messages omitted]"


def to_prompt_message(record: dict[str, Any]) -> dict[str, Any]:
    """The provider-facing part of a ``messages.jsonl`` record."""
    message = {key: record[key] for key in PROMPT_FIELDS if key in record}
    if record.get("role") == "tool" and "name" not in message and "tool_name" in record:
        message["name"] = record["tool_name"]
    return message


def summary_message(summary: dict[str, Any]) -> dict[str, Any]:
    """The latest summary as it stands in the prompt, right after the pinned task."""
    return {
        "role": "user",
        "content": (
            f"Summary of the work so far (messages {summary['start_seq']}-{summary['end_seq']}, "
            f"condensed by Tasuki):\n\n{summary['summary']}"
        ),
    }


def cost(record: dict[str, Any], factor: float) -> int:
    """Calibrated token cost of a record."""
    return int(record.get("token_count", 0) * factor + 0.5)


def text_cost(text: str, factor: float) -> int:
    """Calibrated token cost of a message Tasuki adds to the prompt, estimated like a stored record."""
    return int(estimate_message_tokens(text) * factor + 0.5)


def build_prompt(
    pinned: list[dict[str, Any]],
    summary: dict[str, Any] | None,
    newest_first: Iterable[dict[str, Any]],
    *,
    boundary_seq: int,
    last_seq: int,
    budget_tokens: int,
    factor: float = 1.0,
) -> list[dict[str, Any]]:
    """Pinned messages + summary + as many of the newest messages after ``boundary_seq`` as fit.

    An assistant message with tool calls and its tool results are taken together or not at all, so
    the prompt never holds a tool result without the call that asked for it.  When messages after
    the boundary are left out, a marker says how many (000's emergency mode).
    """
    head = [to_prompt_message(r) for r in pinned]
    used = sum(cost(r, factor) for r in pinned)
    if summary is not None:
        head.append(summary_message(summary))
        used += text_cost(head[-1]["content"], factor)  # the summary with its heading, not the bare summary
    # Room for the marker at its longest (every message omitted), so that adding it never overflows.
    room = budget_tokens - used - text_cost(OMITTED_MARKER.format(count=max(last_seq - boundary_seq, 0)), factor)
    selected: list[dict[str, Any]] = []
    group: list[dict[str, Any]] = []
    oldest_taken = last_seq + 1
    for record in newest_first:
        if record["seq"] <= boundary_seq:
            break
        group.append(record)
        if record.get("role") == "tool":
            continue  # keep collecting until the assistant message that made the call
        group_cost = sum(cost(r, factor) for r in group)
        if group_cost > room:
            break
        room -= group_cost
        selected.extend(group)
        oldest_taken = record["seq"]
        group = []
    omitted = oldest_taken - boundary_seq - 1
    if omitted > 0:
        head.append({"role": "user", "content": OMITTED_MARKER.format(count=omitted)})
    return head + [to_prompt_message(r) for r in reversed(selected)]
