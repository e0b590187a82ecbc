"""Which steps' changes a rebuilt checkout lacks: those after the checkpoint it was rebuilt from whose
mutating tool calls ran (their worker died before the checkpoint's push reached the remote)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

NOT_RUN = "error: not run:"


def lost_steps(
    newest_first: Iterable[dict[str, Any]], restored: int, steps: int, mutating: Callable[[str], bool]
) -> list[int]:
    """The steps after ``restored`` (of ``steps``, one per ``assistant`` message) with a mutating call that ran,
    oldest first; reads the messages back only as far as step ``restored``."""
    ran: set[str] = set()
    lost: list[int] = []
    step = steps
    for record in newest_first:
        if step <= restored:
            break
        if record.get("role") == "tool" and not str(record.get("content") or "").startswith(NOT_RUN):
            ran.add(str(record.get("tool_call_id")))
        elif record.get("role") == "assistant":
            calls = [c for c in record.get("tool_calls") or [] if c.get("id") in ran]
            names = [str((c.get("function") or {}).get("name")) for c in calls]
            if any(mutating(name) for name in names):
                lost.append(step)
            step -= 1
    return lost[::-1]
