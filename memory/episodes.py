"""An episode from a finished context directory (SPEC §13): what the task was, what came of it.

Everything read here was masked when the context was written; it is masked again on the way in, since
the request and the error come from other hands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.atomic import read_json
from contexts.masking import mask, mask_value
from contexts.names import MESSAGES_FILE, METADATA_FILE, SUMMARIES_FILE, TOOLS_FILE
from contexts.state import read_state
from memory.records import Episode, repository_key, thread_key

FILE_TOOLS = ("write_file", "edit_file")
ERROR_TAIL_CHARS = 600  # of a failed command's output: the end is where the error is
MAX_FAILED_COMMANDS = 10
_TASK = re.compile(r"<task>\n(.*?)\n</task>", re.DOTALL)  # the preamble names "<task> tags" without a newline
_EXIT = re.compile(r"exit code: (-?\d+)")


def task_text(first_user_message: str) -> str:
    """The task as quoted in the first user message (without the memory Tasuki added after it)."""
    found = _TASK.search(first_user_message)
    return found.group(1) if found else first_user_message


def failed_commands(tool_records: Iterable[dict[str, Any]]) -> tuple[dict[str, str], ...]:
    """The last bash commands that failed (an error, or a non-zero exit code) with their output's tail, masked."""
    failed = []
    for record in tool_records:
        if record.get("tool_name") != "bash":
            continue
        output = str(record.get("result") or "")
        codes = _EXIT.findall(output[-200:])
        if record.get("status") == "error" or (codes and codes[-1] != "0"):
            command = str((record.get("arguments") or {}).get("command", ""))
            tail = (record.get("error") or output)[-ERROR_TAIL_CHARS:]
            failed.append({"command": mask(command[:500]), "error": mask(tail)})
    return tuple(failed[-MAX_FAILED_COMMANDS:])


def files_changed(tool_records: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """Paths the agent wrote or edited successfully, in first-touched order."""
    paths = [
        str((r.get("arguments") or {}).get("path"))
        for r in tool_records
        if r.get("tool_name") in FILE_TOOLS and r.get("status") == "success" and (r.get("arguments") or {}).get("path")
    ]
    return tuple(dict.fromkeys(paths))


def episode_from_context(directory: Path, now: datetime) -> Episode:
    """The episode of the finished context at ``directory`` (``now`` when it has no end time)."""
    metadata = read_json(directory / METADATA_FILE)
    state = read_state(directory)
    request = metadata.get("request") or {}
    task_key = metadata["task_key"]
    repository = repository_key(task_key, request.get("repo_path"))
    first_user = next((r for r in jsonl.iter_records(directory / MESSAGES_FILE) if r.get("role") == "user"), None)
    task = task_text(str(first_user.get("content") or "")) if first_user else str(request.get("prompt") or "")
    tools = list(jsonl.iter_records(directory / TOOLS_FILE))
    latest = jsonl.last_record(directory / SUMMARIES_FILE)
    result = state.get("result") or {}
    ended = state.get("completed_at") or state.get("updated_at")
    return Episode(
        uuid=str(metadata["uuid"]) if "uuid" in metadata else directory.name,
        repository=repository,
        thread=thread_key(task_key, repository),
        ended_at=datetime.fromisoformat(str(ended).replace("Z", "+00:00")) if ended else now,
        status=str(state.get("status", "unknown")),
        task=mask(task),
        result={k: mask_value(v) for k, v in result.items() if k != "summary"},
        latest_summary=mask(str(latest.get("summary", ""))) if latest else "",
        final_summary=mask(str(result.get("summary") or "")),
        files_changed=files_changed(tools),
        failed_commands=failed_commands(tools),
        error=mask(str(state["error"])) if state.get("error") else None,
    )


def episode_without_context(uuid: str, request: dict[str, Any], status: str, error: str, now: datetime) -> Episode:
    """The episode of a task that could not even create its context (``cannot_start``)."""
    repository = repository_key(request["task_key"], request.get("repo_path"))
    return Episode(
        uuid=uuid,
        repository=repository,
        thread=thread_key(request["task_key"], repository),
        ended_at=now,
        status=status,
        task=mask(str(request.get("prompt") or (request.get("issue") or {}).get("title") or "")),
        error=mask(error),
    )
