"""Which MCP servers a task gets: the operator's (``mcp.servers``) and the repository's ``.tasuki/mcp.json``.

The repository's file has the shape most tools read (``{"mcpServers": {NAME: {command, args, env} or {url}}}``,
``"servers"`` also accepted). What a repository declares is as trusted as the agent's own commands: it never names
a secret, and an operator's server of the same name wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from agent.mcp.settings import MCPServerSettings, MCPSettings
from contexts.errors import TasukiError

MCP_FILE = ".tasuki/mcp.json"
MAX_FILE_BYTES = 256 * 1024
_REPOSITORY_KEYS = frozenset({"command", "args", "env", "url", "headers", "tools", "type"})
_TYPES = {"stdio", "http", "streamable-http", "streamable_http", "streamableHttp"}

Origin = Literal["operator", "repository"]


class DeclarationError(TasukiError):
    """A server declaration that cannot be used (one line: where and what)."""


@dataclass(frozen=True)
class DeclaredServer:
    """One server a task may start, and who declared it."""

    name: str
    settings: MCPServerSettings
    origin: Origin

    @property
    def remote(self) -> bool:
        """Whether it is reached over HTTP (else it is a stdio program)."""
        return self.settings.url is not None


def repository_servers(text: str) -> dict[str, MCPServerSettings]:
    """The servers of a ``.tasuki/mcp.json``; DeclarationError names the first problem."""
    if len(text.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise DeclarationError(f"{MCP_FILE}: larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise DeclarationError(f"{MCP_FILE}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DeclarationError(f"{MCP_FILE}: expected a JSON object")
    servers = data.get("mcpServers", data.get("servers", {}))
    if not isinstance(servers, dict):
        raise DeclarationError(f"{MCP_FILE}: mcpServers must be an object of servers by name")
    return {str(name): _repository_server(str(name), entry) for name, entry in servers.items()}


def _repository_server(name: str, entry: Any) -> MCPServerSettings:
    where = f"{MCP_FILE}: mcpServers.{name}"
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where}: expected an object")
    unknown = sorted(set(entry) - _REPOSITORY_KEYS)
    if unknown:  # secret_env, secret_headers: a repository never names the worker's variables
        raise DeclarationError(f"{where}: unknown key(s) {', '.join(unknown)}")
    kind = entry.get("type")
    if kind is not None and kind not in _TYPES:
        raise DeclarationError(f"{where}: type must be stdio or http, got {kind!r}")
    fields = {key: value for key, value in entry.items() if key != "type"}
    try:
        settings = MCPServerSettings.model_validate(fields)
        MCPSettings.model_validate({"servers": {name: fields}})  # the name's own rule
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(part) for part in first["loc"] if part not in ("servers", name))
        raise DeclarationError(f"{where}{'.' + at if at else ''}: {first['msg']}") from None
    return settings


def task_servers(settings: MCPSettings, repository_file: str | None) -> tuple[list[DeclaredServer], list[str]]:
    """The servers a task starts (the operator's first), and one line per problem with the repository's file."""
    servers = [DeclaredServer(name, entry, "operator") for name, entry in settings.servers.items()]
    problems: list[str] = []
    if repository_file is None or not settings.repository_servers:
        return servers, problems
    try:
        declared = repository_servers(repository_file)
    except DeclarationError as exc:
        return servers, [str(exc)]
    for name, entry in declared.items():
        if name in settings.servers:
            problems.append(f"{MCP_FILE}: server {name!r} is also the operator's; the operator's is used")
            continue
        servers.append(DeclaredServer(name, entry, "repository"))
    return servers, problems
