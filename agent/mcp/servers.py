"""A task's MCP servers: started together when the task starts, their tools offered, stopped together when it ends.

A server that is refused (its host not allowed), lacks a secret, fails to start or does not list its tools in
time is left out with one line in the log and the task's record; the task goes on. A server that dies or hangs
mid-task makes its calls fail with one line for the model; nothing of it crashes the task.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mcp_types
import structlog

from agent.mcp.declared import DeclaredServer
from agent.mcp.session import EventLoop, MCPUnavailable, Opener, ServerSession
from agent.mcp.settings import MCPSettings
from agent.mcp.tools import Caller, MCPTool, agent_name, agent_schema, describe_tool
from agent.mcp.transports import EgressRoute, StderrTail, StdioJail, remote_opener
from agent.tools.protocol import Tool
from agent.tools.toolbox import BUILTINS
from contexts.errors import TasukiError
from contexts.masking import mask, register_secrets

log = structlog.get_logger(__name__)

CALL_GRACE_S = 5.0  # beyond a call's own timeout, for the loop's thread to hand the answer over


@dataclass
class ServerReport:
    """How one server's start went: its tools as the agent sees them, or why it is left out."""

    name: str
    origin: str
    transport: str
    tools: list[str] = field(default_factory=list)
    problem: str | None = None
    duration_ms: int = 0

    def line(self) -> str:
        """One line for the log and the task's record."""
        if self.problem is not None:
            return f"MCP server {self.name} ({self.origin}, {self.transport}) left out: {self.problem}"
        named = ", ".join(self.tools)
        return f"MCP server {self.name} ({self.origin}, {self.transport}): {len(self.tools)} tool(s) {named}"


class MCPServers:
    """The servers of one task on one event loop; :meth:`start`, then :meth:`tools`, then :meth:`close`."""

    def __init__(self, settings: MCPSettings, declared: list[DeclaredServer], jail: StdioJail, route: EgressRoute,
                 environ: Mapping[str, str] | None = None) -> None:
        self.settings, self.declared, self.jail, self.route = settings, declared, jail, route
        self.environ = os.environ if environ is None else environ  # where an operator's secrets are read
        self.loop: EventLoop | None = None
        self.sessions: dict[str, ServerSession] = {}
        self.stderr: dict[str, StderrTail] = {}
        self.reports: list[ServerReport] = []
        self._tools: list[MCPTool] = []

    def start(self) -> list[ServerReport]:
        """Start every server at once; each gets ``mcp.start_timeout_s``."""
        if not self.declared:
            return []
        self.loop = EventLoop()
        reports = {d.name: ServerReport(d.name, d.origin, "http" if d.remote else "stdio") for d in self.declared}
        for declared in self.declared:
            try:
                self.sessions[declared.name] = ServerSession(declared.name, self._opener(declared))
            except TasukiError as exc:  # refused, a secret missing, a sandbox that cannot run
                reports[declared.name].problem = str(exc)
            except OSError as exc:  # its private home, its cgroup
                reports[declared.name].problem = f"cannot be prepared ({exc.strerror or exc})"
        started = time.monotonic()
        timeout = self.settings.start_timeout_s
        outcomes = self.loop.run(self._start_all(timeout), timeout + CALL_GRACE_S * 3)
        for name, outcome in outcomes.items():
            report = reports[name]
            report.duration_ms = int((time.monotonic() - started) * 1000)
            if isinstance(outcome, BaseException):
                report.problem = self._why(name, outcome)
                self.sessions.pop(name, None)
            else:
                report.tools = self._adopt(self._declared(name), outcome, report)
        self.reports = list(reports.values())
        for report in self.reports:
            (log.info if report.problem is None else log.warning)(report.line())
        return self.reports

    async def _start_all(self, timeout_s: float) -> dict[str, list[mcp_types.Tool] | BaseException]:
        names = list(self.sessions)
        found = await asyncio.gather(*(self.sessions[n].start(timeout_s) for n in names), return_exceptions=True)
        return dict(zip(names, found, strict=True))

    def _declared(self, name: str) -> DeclaredServer:
        return next(d for d in self.declared if d.name == name)

    def _opener(self, declared: DeclaredServer) -> Opener:
        settings = declared.settings
        secrets = self._secrets(declared)
        if settings.url is not None:
            refused = self.route.refuses(settings.url)
            if refused is not None:
                raise MCPUnavailable(f"egress refused: {refused}")
            return remote_opener(settings.url, self.route, {**settings.headers, **secrets})
        self.stderr[declared.name] = stderr = StderrTail()
        return self.jail.opener(declared, secrets, stderr)

    def _secrets(self, declared: DeclaredServer) -> dict[str, str]:
        """An operator's server's secrets from the worker's environment (a repository's names none), masked from now
        on wherever they appear."""
        named = {**declared.settings.secret_env, **declared.settings.secret_headers}
        missing = sorted(variable for variable in named.values() if not self.environ.get(variable))
        if missing:
            raise MCPUnavailable(f"the worker's environment lacks {', '.join(missing)}")
        secrets = {name: self.environ[variable] for name, variable in named.items()}
        register_secrets(secrets.values())
        return secrets

    def _why(self, name: str, failure: BaseException) -> str:
        said = self.stderr.get(name)
        last = said.last() if said is not None else ""
        why = str(failure) if isinstance(failure, MCPUnavailable) else f"{type(failure).__name__}: {failure}"
        return mask(f"{why}" + (f" (its stderr: {last[:200]})" if last else ""))

    def _adopt(self, declared: DeclaredServer, listed: list[mcp_types.Tool], report: ServerReport) -> list[str]:
        """The server's tools the agent gets: on its allow-list, with a usable schema and a name still free."""
        allowed = declared.settings.tools
        adopted: list[str] = []
        taken = set(BUILTINS.tools) | {tool.name for tool in self._tools}
        for tool in listed:
            if allowed is not None and tool.name not in allowed:
                continue
            name, schema = agent_name(declared.name, tool.name), agent_schema(tool.input_schema)
            if schema is None or name in taken:
                log.warning("MCP tool left out", server=declared.name, tool=tool.name[:100],
                            why="no usable input schema" if schema is None else f"{name} is taken")
                continue
            if len(self._tools) >= self.settings.max_tools:
                log.warning("MCP tools beyond mcp.max_tools left out", server=declared.name,
                            max=self.settings.max_tools)
                break
            self._tools.append(MCPTool(name, describe_tool(tool, declared.name, declared.origin), schema,
                                       declared.name, tool.name, self._caller(declared.name)))
            taken.add(name)
            adopted.append(name)
        return adopted

    def _caller(self, server: str) -> Caller:
        def call(tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
            session, loop = self.sessions.get(server), self.loop
            if session is None or loop is None:
                raise MCPUnavailable(f"MCP server {server!r} is not running")
            timeout = self.settings.call_timeout_s
            try:
                return loop.run(session.call(tool, arguments, timeout), timeout + CALL_GRACE_S)
            except TimeoutError:
                raise MCPUnavailable(f"MCP server {server!r}: no answer within {timeout:g} s") from None
            except MCPUnavailable as exc:
                said = self.stderr.get(server)
                last = f" (its stderr: {said.last()[:200]})" if said is not None and said.last() else ""
                log.warning("MCP call failed", server=server, tool=tool[:100], error=str(exc)[:300])
                raise MCPUnavailable(f"MCP server {server!r}: {exc}{last}") from None

        return call

    def tools(self) -> list[Tool]:
        """The tools of the servers that started, in declaration order."""
        return list(self._tools)

    def drop_tools(self) -> None:
        """Offer none (the servers did not start as a whole)."""
        self._tools = []

    def close(self) -> None:
        """Stop every server (a stdio server's processes are killed), the loop and the servers' cgroups."""
        loop, self.loop = self.loop, None
        try:
            if loop is not None:
                sessions = list(self.sessions.values())
                try:
                    loop.run(_close_all(sessions), CALL_GRACE_S * 4)
                except (TimeoutError, RuntimeError) as exc:
                    log.warning("MCP servers did not stop in time; their processes are killed", error=str(exc)[:200])
                loop.stop()
        finally:
            self.jail.stack.close()  # the cgroups (whatever is left in them is killed) and the private homes
            for tail in self.stderr.values():
                tail.close()


async def _close_all(sessions: list[ServerSession]) -> None:
    await asyncio.gather(*(session.close() for session in sessions), return_exceptions=True)


@contextmanager
def mcp_servers(settings: MCPSettings, declared: list[DeclaredServer], jail: StdioJail, route: EgressRoute,
                environ: Mapping[str, str] | None = None) -> Iterator[MCPServers]:
    """The task's servers, started, for the block; stopped however it ends."""
    servers = MCPServers(settings, declared, jail, route, environ)
    try:
        try:
            servers.start()
        except Exception as exc:  # a bug, or a loop that never answered: the task goes on without MCP tools
            log.warning("MCP servers not started", error=f"{type(exc).__name__}: {exc}"[:300])
            servers.reports = [ServerReport(d.name, d.origin, "http" if d.remote else "stdio", problem="not started")
                               for d in declared]
            servers.drop_tools()
        yield servers
    finally:
        servers.close()
