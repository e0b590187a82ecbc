"""The tools one task offers its model: the built-ins, and what the task adds (its MCP servers' tools).

The loop sends :attr:`Toolbox.schemas` and hands :attr:`Toolbox.tools` to ``run_tool``; a task without additions
uses :data:`BUILTINS`. Names are looked up here and in the built-ins' registry (``dispatch.TOOLS``), nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agent.tools.dispatch import TOOLS
from agent.tools.protocol import Tool
from contexts.tokens import estimate_tokens


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The function definition a provider sends for ``tool``."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)},
    }


class Toolbox:
    """An ordered set of tools by name; a name is offered once (the first tool that claims it keeps it)."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            self.tools.setdefault(tool.name, tool)
        self.schemas: list[dict[str, Any]] = [tool_schema(tool) for tool in self.tools.values()]
        self.tokens = estimate_tokens(json.dumps(self.schemas))  # sent with every request

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, if this toolbox offers it."""
        return self.tools.get(name)

    def with_tools(self, extra: Iterable[Tool]) -> Toolbox:
        """This toolbox and ``extra`` after it (a name already offered keeps its tool)."""
        return Toolbox([*self.tools.values(), *extra])

    def taken(self, name: str) -> bool:
        """Whether ``name`` is offered already."""
        return name in self.tools

    @property
    def names(self) -> Mapping[str, Tool]:
        """The tools by name (what the text-call parser looks for)."""
        return self.tools


BUILTINS = Toolbox(TOOLS.values())
"""The built-in tools alone: every task's toolbox starts from it."""
