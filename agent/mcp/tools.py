"""An MCP server's tool as an agent tool (the Tool Protocol): ``run_tool`` checks, times and records it like any.

Its name is ``mcp__SERVER__TOOL``; its schema is the server's (checked with JSON Schema before the call); what
it answers becomes text (images and binary resources are named, not sent). A server's words reach the model as
data: its description says which server it is and who declared it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import mcp_types

from agent.mcp.declared import Origin
from agent.tools.output import cap_output
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import ToolError, Workspace

PREFIX = "mcp__"
MAX_NAME = 64  # what the providers take as a function name
MAX_DESCRIPTION = 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

# (server's tool name, arguments) -> the server's answer; raises MCPUnavailable
Caller = Callable[[str, dict[str, Any]], mcp_types.CallToolResult]


def agent_name(server: str, tool: str) -> str:
    """``mcp__SERVER__TOOL`` in the characters and length every provider accepts."""
    return f"{PREFIX}{server}__{_UNSAFE.sub('_', tool)}"[:MAX_NAME]


def agent_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The server's input schema as the providers take it (an object with properties), or None when it is not a
    JSON Schema at all."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        return None
    fixed = {**schema, "type": "object", "properties": dict(schema.get("properties") or {})}
    if not all(isinstance(value, Mapping) for value in fixed["properties"].values()):
        return None
    try:
        jsonschema.validators.validator_for(fixed).check_schema(fixed)
    except jsonschema.SchemaError:
        return None
    return fixed


@dataclass  # not frozen: the Tool Protocol's attributes are plain ones
class MCPTool:
    """``mcp__SERVER__TOOL(...)``: one tool of a running MCP server; never changes the checkout (a stdio server
    sees it read-only)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    server: str
    remote_name: str
    caller: Caller
    changes_checkout: bool = False

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Check the arguments against the server's schema, call the server, return its answer as text."""
        plain = dict(arguments)
        problem = jsonschema.validators.validator_for(self.parameters)(self.parameters).iter_errors(plain)
        first = next(iter(sorted(problem, key=lambda e: list(e.absolute_path))), None)
        if first is not None:
            where = "/".join(str(part) for part in first.absolute_path)
            raise ToolError(f"{self.name}: argument {where or '(all)'}: {first.message[:300]}")
        result = self.caller(self.remote_name, plain)
        text, _ = cap_output(result_text(result), options.max_output_chars)
        if result.is_error:
            first_line = (text.strip().splitlines() or ["the tool reported an error"])[0][:300]
            return ToolOutcome(f"error: {text}", error=f"{self.name}: {first_line}")
        return ToolOutcome(text)


def describe_tool(tool: mcp_types.Tool, server: str, origin: Origin) -> str:
    """The description the model reads: whose tool it is, then the server's own words (capped)."""
    declared = "the operator" if origin == "operator" else "the repository's .tasuki/mcp.json"
    own = (tool.description or tool.title or "").strip()
    head = f"[MCP server {server!r}, declared by {declared}] "
    return (head + own)[:MAX_DESCRIPTION]


def result_text(result: mcp_types.CallToolResult) -> str:
    """What a call answered, as text: text blocks as they are, the structured result when there is no text,
    the rest named."""
    parts = [_block_text(block) for block in result.content]
    texts = any(isinstance(block, mcp_types.TextContent) for block in result.content)
    if not texts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, indent=1))
    return "\n".join(parts) if parts else "(no content)"


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type} {block.mime_type}, {len(block.data)} characters of base64, not shown]"
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        return f"[resource {resource.uri}: binary, not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link {block.uri}: {block.name}]"
    return f"[{getattr(block, 'type', 'content')}, not shown]"
