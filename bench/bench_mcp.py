"""An MCP tool call's cost against a ``bash`` call, in one run (issue 38, item 7): our test server
(tests/helpers/mcp_server.py, the SDK's MCPServer) over stdio in the bubblewrap sandbox, called through ``run_tool``
as the loop calls it, against the bash tool running ``true`` in the same sandbox; and what starting the server (the
sandbox, Python, the SDK's handshake and tool listing) costs, counted in bash calls.

The server lives for the task, so each call is a JSON-RPC round trip; each bash call builds a sandbox anew.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

from agent.mcp.declared import DeclaredServer
from agent.mcp.servers import MCPServers
from agent.mcp.settings import MCPServerSettings, MCPSettings
from agent.mcp.transports import EgressRoute, StdioJail
from agent.tools import Workspace, run_tool
from agent.tools.toolbox import BUILTINS
from bench.common import Result, standalone, timed
from sandbox.jail import Bubblewrap, probe
from sandbox.settings import SandboxSettings

SERVER = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "mcp_server.py"


def run(root: Path, *, quick: bool = False) -> list[Result]:
    """Median seconds per MCP call and per bash call, interleaved; median seconds per server start."""
    settings = SandboxSettings(network="none", read_only_paths=(Path(sys.prefix),))
    sandbox = Bubblewrap(settings)
    problem = probe(sandbox)
    if problem is not None:
        print(f"mcp: skipped, {problem}", flush=True)
        return []
    checkout, home = root / "checkout", root / "home"
    checkout.mkdir()
    home.mkdir()
    shutil.copy(SERVER, checkout / "mcp_server.py")
    workspace = Workspace(checkout)
    server = MCPServerSettings(command=str(Path(sys.prefix) / "bin" / "python"), args=("mcp_server.py",))
    declared = [DeclaredServer("bench", server, "repository")]
    rounds, starts = (5, 1) if quick else (40, 5)
    started: list[float] = []
    mcp: list[float] = []
    bash: list[float] = []
    for attempt in range(starts):
        servers = MCPServers(MCPSettings(), declared, StdioJail(sandbox, checkout, home, settings.limits, 600),
                             EgressRoute(None))
        try:
            started.append(timed(servers.start))
            tools = BUILTINS.with_tools(servers.tools()).tools
            for _ in range(rounds if attempt == 0 else 0):
                mcp.append(timed(partial(_call, workspace, "mcp__bench__add", {"a": 1, "b": 2}, tools=tools)))
                bash.append(timed(partial(_call, workspace, "bash", {"command": "true"}, sandbox=sandbox,
                                          limits=settings.limits, home=home)))
        finally:
            servers.close()
    call, shell, start = statistics.median(mcp), statistics.median(bash), statistics.median(started)
    print(f"mcp: call {call * 1000:.1f} ms, bash call {shell * 1000:.1f} ms, server start {start * 1000:.0f} ms",
          flush=True)
    return [
        Result("MCP call (stdio, in bubblewrap) / bash call in bubblewrap", f"{call / shell:.2f}", "", None),
        Result("MCP server start in bubblewrap / bash call in bubblewrap", f"{start / shell:.1f}", "", None),
    ]


def _call(workspace: Workspace, name: str, arguments: dict[str, Any], **options: Any) -> None:
    result = run_tool(workspace, name, arguments, bash_timeout_s=30, max_output_chars=1000, **options)
    assert result.status == "success", result.output


if __name__ == "__main__":
    standalone(run, __doc__)
