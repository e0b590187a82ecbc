"""Importance of messages (seed 000 §4): which ones the prompt keeps when not all of them fit.

``0.3 * recency + 0.3 * role + 0.4 * content``. Content counts what a coding task must not lose: the task's
constraints (user messages), errors and failing test output, tool results, and successful edits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

W_RECENCY, W_ROLE, W_CONTENT = 0.3, 0.3, 0.4
ROLE_SCORES = {"user": 1.0, "assistant": 0.5, "tool": 0.5, "system": 0.3}
ERROR_WORDS = ("error", "failed", "failure", "exception", "traceback", "assert")
SUCCESS_WORDS = ("success", "passed", "completed", "done")
FAILING_OUTPUT = re.compile(r"\bFAILED\b|Traceback \(most recent call last\)|exit code: (?!0\b)-?\d+")
EDIT_TOOLS = ("edit_file", "write_file")
SHORT_CHARS = 20
SHORT_PENALTY = 0.7


def content_score(record: dict[str, Any]) -> float:
    """000's content score, adapted to a coding agent's messages (0..1)."""
    if record.get("instructions"):
        return 1.0  # the repository owner's instructions (agent/instructions.py): kept like the task's constraints
    content = str(record.get("content") or "")
    lower = content.lower()
    score = 0.0
    if any(word in lower for word in ERROR_WORDS):
        score += 0.3
    if any(word in lower for word in SUCCESS_WORDS):
        score += 0.2
    if record.get("role") == "tool":
        score += 0.25
        if FAILING_OUTPUT.search(content):
            score += 0.2  # failing tests and commands: the evidence the work is about
        if record.get("tool_name") in EDIT_TOOLS and not lower.startswith("error"):
            score += 0.3  # a successful edit: what the work consists of
    if record.get("role") == "user":
        score += 0.2  # the task's constraints and the operator's words
    if len(content) < SHORT_CHARS and not record.get("tool_calls"):
        score *= SHORT_PENALTY
    return min(score, 1.0)


def importance(record: dict[str, Any], position: int, count: int) -> float:
    """A message's importance; ``position`` counts from the oldest (0) to the newest (``count - 1``)."""
    recency = position / max(count - 1, 1)
    role = ROLE_SCORES.get(str(record.get("role")), 0.5)
    return min(W_RECENCY * recency + W_ROLE * role + W_CONTENT * content_score(record), 1.0)


def group_importance(group: Sequence[dict[str, Any]], position: int, count: int) -> float:
    """A tool call and its results stand or fall together: the group counts as its most important member."""
    return max(importance(record, position, count) for record in group)


def most_important(records: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The ``limit`` most important records, oldest first (what the summarizer keeps verbatim)."""
    ranked = sorted(range(len(records)), key=lambda i: -importance(records[i], i, len(records)))[:limit]
    return [records[i] for i in sorted(ranked)]
