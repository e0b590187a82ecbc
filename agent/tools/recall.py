"""``recall(query)``: what the prompt no longer holds — this task's summarized or left-out messages and the
repository's earlier tasks (SPEC §13). The search itself is the worker's, handed in through the options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import ToolError, Workspace


class RecallTool:
    """``recall(query)``: search memory; read-only, never changes the checkout."""

    name = "recall"
    changes_checkout = False
    description = (
        "Search what is no longer in your prompt: this task's earlier messages that were summarized or left "
        "out, and earlier tasks on this repository (with their UUIDs). Use it for a detail a summary dropped "
        "(an exact error, a path, a command) or for what earlier work on the repository found."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for, in words or exact text."}},
        "required": ["query"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Ask the task's recall for ``query``."""
        query: str = arguments["query"].strip()
        if not query:
            raise ToolError("query is empty; say what to look for")
        if options.recall is None:
            raise ToolError("memory is not available in this task")
        return ToolOutcome(options.recall(query)[: options.max_output_chars])
