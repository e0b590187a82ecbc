"""How a task reaches an MCP server: a stdio server's process in the task's sandbox, a remote one through its egress.

- **stdio**: the server's command line is the agent's sandbox's (``Sandbox.command``: its namespaces, its network
  — the task's egress bridge or none — and, for a root worker, the sandbox's user and a cgroup), with the checkout
  bound read-only over ``/workspace``. The SDK's ``stdio_client`` starts that line on the host and speaks to its
  stdin and stdout: JSON-RPC lines, data, never a command. A repository's server gets the task's home and its env
  files, as the agent's commands do; an operator's gets a home of its own (the agent cannot plant a file it reads)
  and its secrets out of sight of ``ps`` (``inherit``).
- **remote**: the URL's host must pass the task's egress policy (:class:`EgressRoute`). With a proxy (a confining
  backend) every request goes through it, which checks the resolved address again and records what it refuses;
  without one (``sandbox.backend: none``) the policy is checked here.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent.mcp.declared import DeclaredServer
from agent.mcp.session import Opener
from contexts.masking import mask
from sandbox import confine, envfiles
from sandbox.egress import EgressPolicy
from sandbox.jail import WORKSPACE, Sandbox, command_env, sandbox_env, scrubbed_env
from sandbox.settings import SandboxLimits

STDERR_LINES = 20  # of a stdio server's stderr, kept for the line that says why it failed
PROXY_URL = "http://tasuki-egress"  # any host: the transport connects to the proxy's unix socket
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 300.0  # a server may hold an event stream open this long without a byte


class StderrTail:
    """A stdio server's stderr: a pipe whose last lines are kept (masked) and the rest dropped, so a chatty server
    fills neither a disk nor the worker's memory."""

    def __init__(self) -> None:
        read, write = os.pipe()
        self.writer: TextIO = os.fdopen(write, "w")
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._reader = threading.Thread(target=self._pump, args=(read,), name="tasuki-mcp-stderr", daemon=True)
        self._reader.start()

    def _pump(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as source:
            for line in source:
                self.lines.append(mask(line.decode("utf-8", errors="replace").rstrip()[:500]))

    def close(self) -> None:
        """Close the worker's end (the server's went with it) and let the reader finish."""
        with contextlib.suppress(OSError):
            self.writer.close()
        self._reader.join(2.0)

    def last(self) -> str:
        """The last line the server wrote to stderr ("" when none)."""
        return next((line for line in reversed(self.lines) if line.strip()), "")


@dataclass
class StdioJail:
    """Where a task's stdio servers run: its sandbox, checkout and home, and the limits of its commands."""

    sandbox: Sandbox
    checkout: Path
    home: Path
    limits: SandboxLimits | None = None
    cpu_s: int = 14400
    stack: ExitStack = field(default_factory=ExitStack)  # the servers' cgroups and private homes, closed with them

    def opener(self, declared: DeclaredServer, secrets: Mapping[str, str], stderr: StderrTail) -> Opener:
        """The SDK's stdio transport for ``declared``'s command line in the sandbox."""
        settings = declared.settings
        assert settings.command is not None  # noqa: S101 - a stdio server has a command (MCPServerSettings)
        user = self.sandbox.user
        if declared.origin == "repository":  # as the agent's own commands: the task's home, its env files
            home = self.home
            envfiles.prepare(home)
            env = command_env(home, settings.env, self.sandbox, self.checkout).env
            confine.hand_over_call(self.checkout, home, user)
        else:
            home = self._private_home(declared.name)
            env = sandbox_env(scrubbed_env(home, settings.env), self.sandbox, home)
            confine.hand_over(home, user)
        argv, cwd = self.sandbox.command([settings.command, *settings.args], self.checkout, home, env,
                                         inherit=tuple(secrets))
        call = self.stack.enter_context(confine.confined(read_only_checkout(argv, self.checkout), self.limits,
                                                         self.cpu_s, user=user))
        launch = self.sandbox.launch_env(env, inherited=dict(secrets))
        parameters = StdioServerParameters(command=call.argv[0], args=call.argv[1:], env=launch, cwd=str(cwd))
        return lambda: stdio_client(parameters, errlog=stderr.writer)

    def _private_home(self, name: str) -> Path:
        """A home of the server's own, outside the task's (deleted with the servers)."""
        home = Path(tempfile.mkdtemp(prefix=f"tasuki-mcp-{name}-"))
        self.stack.callback(shutil.rmtree, home, ignore_errors=True)
        return home


def read_only_checkout(argv: list[str], checkout: Path) -> list[str]:
    """A sandbox line with the checkout bound again, read-only, over its writable bind (no bind: as it is)."""
    bind = ["--bind", str(checkout), WORKSPACE]
    for at in range(len(argv) - 2):
        if argv[at : at + 3] == bind:
            return [*argv[: at + 3], "--ro-bind", str(checkout), WORKSPACE, *argv[at + 3 :]]
    return argv


@dataclass(frozen=True)
class EgressRoute:
    """The task's way out for remote servers: its egress policy (None: ``sandbox.network: none``) and the proxy's
    socket (None without a confining backend)."""

    policy: EgressPolicy | None
    proxy: Path | None = None

    def refuses(self, url: str) -> str | None:
        """Why ``url``'s host may not be reached (one phrase), or None."""
        if self.policy is None:
            return "sandbox.network is none: nothing leaves the task"
        host = urlsplit(url).hostname or ""
        refused = self.policy.refuses_name(host)
        if refused is not None:
            return f"{host}: {refused}"
        if self.proxy is not None:
            return None  # the proxy resolves the name and checks each address itself, and records a refusal
        return self._refuses_addresses(host, urlsplit(url).port or (443 if url.startswith("https:") else 80))

    def _refuses_addresses(self, host: str, port: int) -> str | None:
        assert self.policy is not None  # noqa: S101 - checked by refuses()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return f"{host}: cannot be resolved ({exc.strerror or exc})"
        reasons = [self.policy.refuses_address(ipaddress.ip_address(str(info[4][0])), port) for info in infos]
        if any(reason is None for reason in reasons):
            return None
        return f"{host}: {next((r for r in reasons if r), 'no address')}"

    def client(self, headers: Mapping[str, str]) -> httpx2.AsyncClient:
        """An HTTP client whose every connection goes through the proxy (no proxy: straight, as the policy allowed);
        never the worker's own proxy variables."""
        transport = httpx2.AsyncHTTPTransport(proxy=PROXY_URL, uds=str(self.proxy)) if self.proxy else None
        timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
        return httpx2.AsyncClient(headers=dict(headers), timeout=timeout, transport=transport, trust_env=False)


def remote_opener(url: str, route: EgressRoute, headers: Mapping[str, str]) -> Opener:
    """The SDK's streamable-HTTP transport to ``url`` over ``route`` (checked by the caller)."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[TransportStreams]:
        async with route.client(headers) as client, streamable_http_client(url, http_client=client) as streams:
            yield streams

    return opened
