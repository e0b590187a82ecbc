"""The ``mcp`` section: MCP servers whose tools the agent gets (issue 38, item 7), and the repository's own.

Each attribute's docstring documents its key; ``worker.settings`` loads the section with the rest.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, Field, model_validator

from contexts.sections import HashableDict, HttpUrl, PositiveFloat, Section, cross_field_error

ServerName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Strings = Annotated[dict[str, str], AfterValidator(HashableDict)]
FromEnvironment = Annotated[dict[str, EnvName], AfterValidator(HashableDict)]


class MCPServerSettings(Section):
    command: str | None = None
    """A stdio server: the program, run in the task's sandbox like the agent's commands (the checkout read-only at
    /workspace, the network as sandbox.network says)."""
    args: tuple[str, ...] = ()
    """The program's arguments."""
    env: Strings = Field(default_factory=HashableDict)
    """Variables the stdio server gets, as written (no secrets: they are not masked)."""
    secret_env: FromEnvironment = Field(default_factory=HashableDict)
    """Variables the stdio server gets from the worker's environment: {NAME_INSIDE: WORKER_VARIABLE}; masked."""
    url: HttpUrl | None = None
    """A remote server (streamable HTTP); reached only through the task's egress rules (sandbox.network,
    sandbox.allowed_hosts, sandbox.allowed_internal)."""
    headers: Strings = Field(default_factory=HashableDict)
    """HTTP headers sent to the remote server, as written (no secrets)."""
    secret_headers: FromEnvironment = Field(default_factory=HashableDict)
    """HTTP headers from the worker's environment: {HEADER: WORKER_VARIABLE} (e.g. Authorization: MCP_TOKEN, whose
    value is the whole header, "Bearer ..."); masked."""
    tools: tuple[str, ...] | None = None
    """The server's tools the agent gets (by the server's names); null: all of them."""

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise cross_field_error("command", self.command, "either command (stdio) or url (remote), not both")
        if self.url is not None and (self.args or self.env or self.secret_env):
            raise cross_field_error("url", self.url, "no args, env nor secret_env: those are a stdio server's")
        if self.command is not None and (self.headers or self.secret_headers):
            raise cross_field_error("command", self.command, "no headers: those are a remote server's")
        return self


Servers = Annotated[dict[ServerName, MCPServerSettings], AfterValidator(HashableDict)]


class MCPSettings(Section):
    servers: Servers = Field(default_factory=HashableDict)
    """The operator's MCP servers: {NAME: {command, args, env, secret_env} or {url, headers, secret_headers}, with
    tools: an allow-list}. Their tools reach the model as mcp__NAME__TOOL."""
    repository_servers: bool = True
    """Whether a repository's own .tasuki/mcp.json (as of the task's base commit) adds servers: stdio servers run in
    the sandbox like any agent command, remote ones only through the egress rules; neither gets a secret."""
    start_timeout_s: PositiveFloat = 30.0
    """Seconds a server has to start and list its tools; a server that does not is left out (the task goes on)."""
    call_timeout_s: PositiveFloat = 120.0
    """Seconds one MCP tool call may take before the model gets an error."""
    max_tools: Annotated[int, Field(ge=0)] = 64
    """Most MCP tools one task offers (every tool's schema is sent with every model request)."""
