"""``run_tool``: check the model's arguments, run the named tool, time it. Model mistakes never raise."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.tools.files import EditFileTool, ReadFileTool, WriteFileTool
from agent.tools.protocol import Tool, ToolOptions, ToolOutcome
from agent.tools.recall import RecallTool
from agent.tools.shell import BashTool
from agent.tools.workspace import ToolError, Workspace
from contexts.errors import TasukiError
from sandbox.jail import NoSandbox, Sandbox
from sandbox.settings import SandboxLimits

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int}
_ARTICLE = {"string": "a", "integer": "an"}


@dataclass(frozen=True)
class ToolResult:
    """One tool run as the loop records it; ``output`` is exactly what the model sees."""

    status: Literal["success", "error"]
    output: str
    error: str | None
    duration_ms: int
    finished: bool = False
    summary: str | None = None


class FinishTool:
    """``finish(summary)``: end the task."""

    name = "finish"
    changes_checkout = False
    description = (
        "End the task when the work is done (or cannot be done). The summary goes into the pull/merge "
        "request and the final comment: say what changed and how it was checked."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"summary": {"type": "string", "description": "What was done, for the reviewers."}},
        "required": ["summary"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Mark the task finished with the summary."""
        summary: str = arguments["summary"].strip()
        if not summary:
            raise ToolError("summary is empty; say what was done")
        return ToolOutcome("task finished", finished=True, summary=summary)


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (BashTool(), ReadFileTool(), WriteFileTool(), EditFileTool(), RecallTool(), FinishTool())
}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }
    for tool in TOOLS.values()
]


def changes_checkout(name: str) -> bool:
    """Whether a call of tool ``name`` can change the checkout, as the tool declares (an unknown name runs
    nothing)."""
    tool = TOOLS.get(name)
    return tool is not None and tool.changes_checkout


def check_arguments(tool: Tool, arguments: object) -> Mapping[str, Any]:
    """Return ``arguments`` if they fit the tool's schema, else raise ToolError naming what is wrong."""
    if not isinstance(arguments, Mapping):
        raise ToolError(f"{tool.name}: arguments must be a JSON object, got {type(arguments).__name__}")
    properties: Mapping[str, Mapping[str, Any]] = tool.parameters["properties"]
    unknown = sorted(str(name) for name in arguments if name not in properties)
    if unknown:
        raise ToolError(f"{tool.name}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(properties)}")
    missing = [name for name in tool.parameters["required"] if name not in arguments]
    if missing:
        raise ToolError(f"{tool.name}: missing required argument(s) {', '.join(missing)}")
    for name, value in arguments.items():
        expected = properties[name]["type"]
        # bool is an int subclass in Python but not an integer in JSON.
        if not isinstance(value, _JSON_TYPES[expected]) or isinstance(value, bool):
            wanted = f"{_ARTICLE[expected]} {expected}"
            raise ToolError(f"{tool.name}: argument {name} must be {wanted}, got {_json_type(value)}")
        if isinstance(value, str) and not _encodes(value):
            # JSON can carry lone surrogates ("\\ud800"); no file, command or path can hold them.
            raise ToolError(f"{tool.name}: argument {name} is not valid Unicode (lone surrogate)")
    return arguments


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def run_tool(
    workspace: Workspace,
    name: str,
    arguments: object,
    *,
    bash_timeout_s: int,
    max_output_chars: int,
    env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
    limits: SandboxLimits | None = None,
    on_start: Callable[[int], None] | None = None,
    recall: Callable[[str], str] | None = None,
    home: Path | None = None,
) -> ToolResult:
    """Run tool ``name`` with the model's decoded JSON ``arguments``; every failure becomes an error result.

    ``bash_timeout_s`` is both the default and the ceiling for ``bash``'s ``timeout_s``; ``env`` adds
    variables to the agent shell's scrubbed environment (secret-looking names are still dropped); ``home`` is
    the task's home (None: an empty one per call).
    """
    started = time.monotonic()
    options = ToolOptions(bash_timeout_s=bash_timeout_s, max_output_chars=max_output_chars, env=env,
                          sandbox=sandbox or NoSandbox(), limits=limits, on_start=on_start, recall=recall, home=home)
    try:
        tool = TOOLS.get(name)
        if tool is None:
            raise ToolError(f"unknown tool {name!r}; the tools are {', '.join(TOOLS)}")
        outcome = tool.run(workspace, check_arguments(tool, arguments), options)
    except TasukiError as exc:
        outcome = ToolOutcome(f"error: {exc}", error=str(exc))
    except OSError as exc:
        # The file system's answer (permission denied, no space, a loop of symlinks) is for the model too.
        message = f"{name}: {exc.strerror or exc}"
        outcome = ToolOutcome(f"error: {message}", error=message)
    duration_ms = int((time.monotonic() - started) * 1000)
    return ToolResult(
        status="error" if outcome.error is not None else "success",
        output=outcome.output,
        error=outcome.error,
        duration_ms=duration_ms,
        finished=outcome.finished,
        summary=outcome.summary,
    )
