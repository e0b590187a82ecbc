"""An MCP server of our own, written with the official SDK's ``MCPServer`` (v1's FastMCP), for the MCP tests.

``python mcp_server.py stdio`` speaks over stdin/stdout; ``python mcp_server.py http PORT`` serves streamable HTTP
on 127.0.0.1:PORT at ``/mcp``. Its tools: ``lookup_issue(id)`` (an answer holding a secret-looking token, which
Tasuki must mask), ``add(a, b)``, ``fetch(url)`` (tries the network), ``read_path(path)`` (tries a file),
``write_path(path, text)``, ``sleep(seconds)`` (a hang) and ``crash()`` (the process dies mid-call).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request

from mcp.server.mcpserver import MCPServer

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # looks like a GitHub token: Tasuki masks it

server = MCPServer("tasuki-test")


@server.tool()
def lookup_issue(id: int) -> str:
    """Look an issue up in the tracker."""
    return f"issue {id}: the parser drops the last line; reported with token {TOKEN}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fetch(url: str) -> str:
    """Fetch a URL (to show whether the server can reach the network)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - the test's own URL
            return f"reached: {answer.status}"
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}: {exc}"


@server.tool()
def read_path(path: str) -> str:
    """Read a file (to show what the server can see)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return "read: " + handle.read()[:4000]
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


@server.tool()
def write_path(path: str, text: str) -> str:
    """Write a file (to show what the server can change)."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        return f"unwritable: {exc.strerror}"
    return "written"


@server.tool()
def sleep(seconds: float) -> str:
    """Hang for a while."""
    time.sleep(seconds)
    return "awake"


@server.tool()
def crash() -> str:
    """Die mid-call."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
