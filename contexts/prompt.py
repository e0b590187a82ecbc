"""Building the prompt from the context files (SPEC §6, §13): pinned task, latest summary, the messages after it.

The messages are read lazily, newest first, and reading stops a few budgets' worth back, so the cost
depends on the size of the prompt, never on the length of the history.  When they do not all fit, the
newest step and then the most important messages (seed 000) are kept, with a marker for every gap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from contexts.importance import group_importance
from contexts.tokens import estimate_message_tokens

PROMPT_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name", "thinking", "reasoning")
OMITTED_MARKER = "[{count} earlier messages omitted; the recall tool finds them]"


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
    """Pinned messages + summary + the messages after ``boundary_seq``: all of them when they fit, else the
    newest step and then the most important ones (seed 000) that fit, in their order, with a marker for
    each gap saying how many messages it stands for and that ``recall`` finds them.

    An assistant message with tool calls and its tool results are taken together or not at all, so the
    prompt never holds a tool result without the call that asked for it.  Reading stops once it has
    :data:`READ_LIMIT` times the room, so the cost follows the prompt's size, not the history's length.
    """
    head = [to_prompt_message(r) for r in pinned]
    used = sum(cost(r, factor) for r in pinned)
    if summary is not None:
        head.append(summary_message(summary))
        used += text_cost(head[-1]["content"], factor)  # the summary with its heading, not the bare summary
    # Room for one marker at its longest (every message omitted), so that adding it never overflows.
    marker = text_cost(OMITTED_MARKER.format(count=max(last_seq - boundary_seq, 0)), factor)
    room = budget_tokens - used
    groups = read_groups(newest_first, boundary_seq, max(room, 0) * READ_LIMIT, factor)
    if sum(c for _, c in groups) <= room and _whole(groups, boundary_seq, last_seq):
        return head + [to_prompt_message(r) for group, _ in reversed(groups) for r in group]
    gap_cost = max(text_cost(GAP_MARKER.format(count=last_seq), factor), marker)
    chosen = choose(groups, room - marker, gap_cost, not _whole(groups, boundary_seq, last_seq))
    return head + with_gap_markers([groups[i][0] for i in sorted(chosen, reverse=True)], boundary_seq, last_seq)


READ_LIMIT = 4  # read at most this many times the room before choosing (older messages are left out)
GAP_MARKER = "[{count} messages omitted here; the recall tool finds them]"


def read_groups(
    newest_first: Iterable[dict[str, Any]], boundary_seq: int, read_tokens: float, factor: float
) -> list[tuple[list[dict[str, Any]], int]]:
    """Groups (an assistant message with its tool results, or one message), newest first, each with its cost."""
    groups: list[tuple[list[dict[str, Any]], int]] = []
    pending: list[dict[str, Any]] = []
    read = 0
    for record in newest_first:
        if record["seq"] <= boundary_seq or read > read_tokens:
            break
        pending.append(record)
        if record.get("role") == "tool":
            continue  # keep collecting until the assistant message that made the call
        group = list(reversed(pending))
        group_cost = sum(cost(r, factor) for r in group)
        groups.append((group, group_cost))
        read += group_cost
        pending = []
    return groups


def _whole(groups: list[tuple[list[dict[str, Any]], int]], boundary_seq: int, last_seq: int) -> bool:
    return sum(len(g) for g, _ in groups) == last_seq - boundary_seq


def choose(groups: list[tuple[list[dict[str, Any]], int]], room: int, gap_cost: int, older_hidden: bool) -> set[int]:
    """Indexes (into the newest-first ``groups``) that fit ``room``: the newest, then by importance.

    ``room`` already holds one gap marker; a group that splits a gap in two pays for another, one that
    closes a gap gets its marker's room back.  ``older_hidden``: messages older than the oldest group
    are left out whatever is chosen (not read, or a tool result whose call is before the boundary).
    """
    count = len(groups)
    chosen: set[int] = set()

    def gap_at(j: int) -> bool:
        return older_hidden if j >= count else j not in chosen

    def new_gaps(i: int) -> int:
        newer, older = i > 0 and gap_at(i - 1), gap_at(i + 1)
        return 1 if newer and older else (-1 if not newer and not older else 0)

    ranked = sorted(range(1, count), key=lambda i: (-group_importance(groups[i][0], count - 1 - i, count), i))
    for i in ([0] if count else []) + ranked:
        change = new_gaps(i)
        if groups[i][1] + max(change, 0) * gap_cost <= room:
            chosen.add(i)
            room -= groups[i][1] + change * gap_cost
    return chosen


def with_gap_markers(groups: list[list[dict[str, Any]]], boundary_seq: int, last_seq: int) -> list[dict[str, Any]]:
    """The chosen groups in order, a marker in each gap (the leading one says "earlier", like SPEC §6's)."""
    out: list[dict[str, Any]] = []
    previous = boundary_seq
    for group in groups:
        gap = group[0]["seq"] - previous - 1
        if gap > 0:
            text = OMITTED_MARKER if previous == boundary_seq else GAP_MARKER
            out.append({"role": "user", "content": text.format(count=gap)})
        out += [to_prompt_message(r) for r in group]
        previous = group[-1]["seq"]
    if last_seq > previous:
        text = OMITTED_MARKER if previous == boundary_seq else GAP_MARKER
        out.append({"role": "user", "content": text.format(count=last_seq - previous)})
    return out
