"""The task's network namespace (sandbox.bridge): one per task under ``full`` and ``allowlist``, joined by each of its
calls, held with socat's bridge to the egress proxy for as long as the proxy lives — tried as the agent would, through
the real bash tool, real bubblewrap, the real proxy and a loopback HTTP server behind it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.tools import Workspace, run_tool
from sandbox import bridge
from sandbox.egress import egress_policy, egress_proxy
from sandbox.jail import Bubblewrap, Sandbox
from sandbox.settings import SandboxSettings
from tests.helpers.ci import bubblewrap_here
from tests.helpers.context_support import wait_for
from tests.helpers.loopback_service import serve_text
from tests.helpers.sandbox_users import handed_over_task

VIA_PROXY = "env -u NO_PROXY -u no_proxy curl -sS --max-time 20 -x http://127.0.0.1:3128"


@pytest.fixture(scope="module")
def service() -> Iterator[int]:
    """A loopback service the tests admit through sandbox.allowed_internal."""
    with serve_text("hello") as port:
        yield port


@pytest.fixture
def task(tmp_path: Path) -> tuple[Path, Path]:
    bubblewrap_here()
    return handed_over_task(tmp_path)


def _bash(task: tuple[Path, Path], sandbox: Sandbox, command: str) -> str:
    checkout, home = task
    settings = SandboxSettings()
    result = run_tool(Workspace(checkout), "bash", {"command": command}, bash_timeout_s=60, max_output_chars=20000,
                      sandbox=sandbox, limits=settings.limits, home=home)
    return result.output


def test_every_call_of_a_task_joins_one_network_and_the_bridge_goes_with_the_proxy(
    task: tuple[Path, Path], service: int
) -> None:
    policy = egress_policy("full", (), (f"127.0.0.1/32:{service}",))
    with egress_proxy(policy, lambda _: None) as socket:
        assert socket is not None
        sandbox = Bubblewrap(SandboxSettings()).with_egress(socket)
        first = _bash(task, sandbox, f"readlink /proc/self/ns/net; {VIA_PROXY} http://127.0.0.1:{service}/")
        second = _bash(task, sandbox, f"readlink /proc/self/ns/net; {VIA_PROXY} http://127.0.0.1:{service}/")
        assert "hello" in first
        assert "hello" in second
        assert first.splitlines()[0] == second.splitlines()[0]  # the same namespace, made once
        holder = bridge._BRIDGES[socket].pid
        assert holder is not None
    assert socket not in bridge._BRIDGES
    wait_for(lambda: not os.path.exists(f"/proc/{holder}"), timeout=10, what="the bridge's holder to end")


def test_a_call_cannot_see_the_holder_nor_change_the_shared_network(task: tuple[Path, Path]) -> None:
    with egress_proxy(egress_policy("full", (), ()), lambda _: None) as socket:
        assert socket is not None
        sandbox = Bubblewrap(SandboxSettings()).with_egress(socket)
        out = _bash(
            task,
            sandbox,
            "ps -e -o comm= | grep -c socat; ip addr add 10.9.9.9/32 dev lo 2>&1 | tail -1;"
            " ip link set lo down 2>&1 | tail -1; grep -c ':0C38 00000000:0000 0A' /proc/net/tcp;"
            " python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 3128))' 2>&1 | tail -1",
        )
        lines = out.splitlines()
        assert lines[0] == "0", out  # socat runs in the holder's PID namespace, out of sight
        assert "Operation not permitted" in lines[1], out
        assert "Operation not permitted" in lines[2], out
        assert lines[3] == "1", out  # the bridge still listens
        assert "Address already in use" in lines[4], out
        again = _bash(task, sandbox, "grep -c ':0C38 00000000:0000 0A' /proc/net/tcp")
        assert again.startswith("1\n"), again


def test_a_holder_that_died_is_started_again_at_the_next_call(task: tuple[Path, Path], service: int) -> None:
    policy = egress_policy("full", (), (f"127.0.0.1/32:{service}",))
    with egress_proxy(policy, lambda _: None) as socket:
        assert socket is not None
        sandbox = Bubblewrap(SandboxSettings()).with_egress(socket)
        assert "hello" in _bash(task, sandbox, f"{VIA_PROXY} http://127.0.0.1:{service}/")
        first = bridge._BRIDGES[socket].pid
        assert first is not None
        os.kill(first, 9)
        wait_for(lambda: not os.path.exists(f"/proc/{first}"), timeout=10, what="the holder to die")
        assert "hello" in _bash(task, sandbox, f"{VIA_PROXY} http://127.0.0.1:{service}/")
        assert bridge._BRIDGES[socket].pid not in (None, first)
