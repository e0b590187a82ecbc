"""A task's repository environment as the CLI shows it (``submit --wait``, ``context show``): where it was declared,
whether it was built, restored, reused or failed and why, how long it took, and a failed setup's last lines.

It reads only the context: ``state.json.environment`` (how it went) and the ``setup`` record in ``tools.jsonl`` (the
setup's log), both written by worker/environment.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.errors import CorruptRecordError
from contexts.names import TOOLS_FILE

SETUP_TOOL = "setup"  # the record's tool_name (worker/environment.py TOOL_NAME; the CLI does not import the worker)
TAIL_LINES = 12  # a failed setup's last lines shown


def environment_line(environment: Any) -> str:
    """``built in 3.2 s (declared by .tasuki/setup.sh)``, ``setting up (declared by auto (uv.lock))``, ``setup
    failed: exit code 3 after 0.4 s (declared by ...)``; "" when the task has not reached its environment yet."""
    if not isinstance(environment, Mapping) or not environment.get("outcome"):
        return ""
    outcome = str(environment["outcome"])
    declared = f" (declared by {environment['source']})" if environment.get("source") else ""
    if outcome == "building":  # written before the snapshot is looked for: restoring or building
        return f"setting up{declared}"
    text = str(environment.get("line") or outcome)
    if outcome == "failed":
        text += f"{declared}; the task goes on without it"
    else:
        text += declared
    if environment.get("snapshot"):
        text += f"; snapshot {environment['snapshot']}"
    for line in environment.get("toolchains") or ():
        text += f"; {line}"
    return text


def setup_record(directory: Path) -> dict[str, Any] | None:
    """The newest ``setup`` record of a context directory (a resumed task has one per attempt), or None."""
    found = None
    try:
        for record in jsonl.iter_records(directory / TOOLS_FILE):
            if record.get("tool_name") == SETUP_TOOL:
                found = record
    except (OSError, CorruptRecordError):  # a damaged log: the line from state.json is still shown
        return None
    return found


def failure_tail(record: Mapping[str, Any] | None, count: int = TAIL_LINES) -> list[str]:
    """A failed setup's last ``count`` log lines, as the record keeps them (masked); [] for any other record."""
    if not record or record.get("status") != "error":
        return []
    result = record.get("result")
    tail = str(result.get("log_tail") or "") if isinstance(result, Mapping) else ""
    lines = [line for line in tail.splitlines() if line.strip()]
    return lines[-count:]
