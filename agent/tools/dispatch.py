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
from agent.tools.search import GlobTool, SearchTool
from agent.tools.shell import BashTool
from agent.tools.workspace import ToolError, Workspace
from contexts.errors import TasukiError
from sandbox.jail import NoSandbox, Sandbox
from sandbox.settings import SandboxLimits

# JSON types as json.loads decodes them; bool is told apart in _fits (Python counts it an int).
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": Mapping,
    "null": type(None),
}


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
        "request and the final comment: say what changed and how it was checked. With the finish gate on (the "
        "default), the first finish is answered with a review (your diff, new files, changed tests, the "
        "repository's checks run in the sandbox) and the next finish is accepted; new files that look like scratch "
        "are then removed unless named in keep."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "description": "What was done, for the reviewers."},
            "keep": {
                "type": "array",
                "items": {"type": "string"},
                "description": "New files the finish gate flagged as scratch that belong in the change (paths).",
            },
        },
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
    for tool in (
        BashTool(), ReadFileTool(), SearchTool(), GlobTool(), WriteFileTool(), EditFileTool(), RecallTool(),
        FinishTool(),
    )
}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }
    for tool in TOOLS.values()
]


def changes_checkout(name: str, tools: Mapping[str, Tool] | None = None) -> bool:
    """Whether a call of tool ``name`` (of ``tools``, the task's toolbox; None: the built-ins) can change the
    checkout, as the tool declares (an unknown name runs nothing)."""
    tool = (TOOLS if tools is None else tools).get(name)
    return tool is not None and tool.changes_checkout


def check_arguments(tool: Tool, arguments: object) -> Mapping[str, Any]:
    """Return ``arguments`` if they fit the tool's schema, else raise ToolError naming what is wrong."""
    if not isinstance(arguments, Mapping):
        raise ToolError(f"{tool.name}: arguments must be a JSON object, got {type(arguments).__name__}")
    properties: Mapping[str, Mapping[str, Any]] = tool.parameters["properties"]
    unknown = sorted(str(name) for name in arguments if name not in properties)
    if unknown:
        raise ToolError(f"{tool.name}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(properties)}")
    missing = [name for name in tool.parameters.get("required", ()) if name not in arguments]
    if missing:
        raise ToolError(f"{tool.name}: missing required argument(s) {', '.join(missing)}")
    for name, value in arguments.items():
        declared = properties[name].get("type")
        expected = [declared] if isinstance(declared, str) else [str(t) for t in declared or ()]
        if expected and not any(_fits(value, kind) for kind in expected):
            wanted = " or ".join(f"{'an' if kind[:1] in tuple('aeiou') else 'a'} {kind}" for kind in expected)
            raise ToolError(f"{tool.name}: argument {name} must be {wanted}, got {_json_type(value)}")
        if isinstance(value, str) and not _encodes(value):
            # JSON can carry lone surrogates ("\\ud800"); no file, command or path can hold them.
            raise ToolError(f"{tool.name}: argument {name} is not valid Unicode (lone surrogate)")
    return arguments


def _fits(value: object, kind: str) -> bool:
    """Whether ``value`` is of JSON type ``kind``; a type this check does not know is not checked."""
    if isinstance(value, bool):  # an int subclass in Python, yet neither an integer nor a number in JSON
        return kind == "boolean"
    expected = _JSON_TYPES.get(kind)
    return expected is None or isinstance(value, expected)


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
    tools: Mapping[str, Tool] | None = None,
    view_chars: int | None = None,
) -> ToolResult:
    """Run tool ``name`` with the model's decoded JSON ``arguments``; every failure becomes an error result.

    ``bash_timeout_s`` is both the default and the ceiling for ``bash``'s ``timeout_s``; ``env`` adds
    variables to the agent shell's scrubbed environment (secret-looking names are still dropped); ``home`` is
    the task's home (None: an empty one per call); ``tools``: the task's toolbox (None: the built-ins);
    ``view_chars``: what of an output reaches the model (read_file sizes its window to it).
    """
    offered = TOOLS if tools is None else tools
    started = time.monotonic()
    options = ToolOptions(bash_timeout_s=bash_timeout_s, max_output_chars=max_output_chars, env=env,
                          sandbox=sandbox or NoSandbox(), limits=limits, on_start=on_start, recall=recall, home=home,
                          view_chars=view_chars)
    try:
        tool = offered.get(name)
        if tool is None:
            raise ToolError(f"unknown tool {name!r}; the tools are {', '.join(offered)}")
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
