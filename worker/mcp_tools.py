"""A task's toolbox: the built-in tools and those of the MCP servers its operator and repository declare (issue 38,
item 7). The servers start with the agent's egress and stop with it, however the task ends; how each start went is
a ``tools.jsonl`` record (tool ``mcp``) and a log line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog

from agent.mcp.declared import MAX_FILE_BYTES, MCP_FILE, task_servers
from agent.mcp.servers import mcp_servers
from agent.mcp.settings import MCPSettings
from agent.mcp.transports import EgressRoute, StdioJail
from agent.tools.toolbox import BUILTINS, Toolbox
from contexts import Context
from sandbox.egress import egress_policy
from sandbox.jail import Sandbox
from worker.checkout import Checkout
from worker.gitdirs import GitError
from worker.settings_models import Settings

log = structlog.get_logger(__name__)


def declared_file(checkout: Checkout, base: str | None) -> str | None:
    """The repository's ``.tasuki/mcp.json`` as of the task's base commit (None: none there), read with the worker's
    own git directory: what the agent changed since does not count, and nothing of the checkout's ``.git`` is read."""
    if not base:
        return None
    blob = f"{base}:{MCP_FILE}"
    try:
        if checkout.git("cat-file", "-t", blob, check=False).strip() != "blob":
            return None
        if int(checkout.git("cat-file", "-s", blob).strip() or 0) > MAX_FILE_BYTES:
            return "x" * (MAX_FILE_BYTES + 1)  # refused as too large by the parser, in its words
        return checkout.git("cat-file", "blob", blob)
    except (GitError, UnicodeDecodeError, ValueError) as exc:
        log.warning("the repository's MCP servers were not read", error=str(exc)[:300])
        return None


@contextmanager
def task_toolbox(mcp: MCPSettings, settings: Settings, ctx: Context, checkout: Checkout, base: str | None,
                 sandbox: Sandbox, egress: Path | None) -> Iterator[Toolbox]:
    """The task's tools for the block: the built-ins, and the tools of the MCP servers ``mcp`` (the ``mcp`` section)
    and the repository declare, while they run."""
    repository = declared_file(checkout, base) if mcp.repository_servers else None
    declared, problems = task_servers(mcp, repository)
    for problem in problems:
        log.warning("repository MCP servers", problem=problem)
    if not declared and not problems:
        yield BUILTINS
        return
    s = settings.sandbox
    route = EgressRoute(egress_policy(s.network, s.allowed_hosts, s.allowed_internal), egress)
    jail = StdioJail(sandbox, checkout.path, checkout.home, s.limits, settings.agent.time_limit_s)
    started = time.monotonic()
    with mcp_servers(mcp, declared, jail, route) as servers:
        lines = problems + [report.line() for report in servers.reports]
        failed = any(report.problem for report in servers.reports) or bool(problems)
        ctx.append_tool(
            "mcp", {"servers": [server.name for server in declared]}, "error" if failed else "success",
            int((time.monotonic() - started) * 1000), result="\n".join(lines),
            error=next((line for line in lines if "left out" in line or line in problems), None),
        )
        yield BUILTINS.with_tools(servers.tools())
