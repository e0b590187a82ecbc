"""Networks that never reach the fleet (issue 36, item 4 and row 9), tried as the agent would: the real bash tool,
real bubblewrap, the real egress proxy and socat's bridge, and a "fleet service" — an HTTP server holding a secret —
on the host's 127.0.0.1, where Redis, PostgreSQL and the intake listen on a worker.

- ``allowlist``: a name on the allow-list that resolves to loopback (``localhost``) reaches nothing;
- ``full`` (the default): the host's loopback is not the sandbox's (a connection to 127.0.0.1:PORT stays inside),
  and the proxy refuses 127.0.0.1:PORT, unless ``sandbox.allowed_internal`` names it; a public address is admitted
  (this machine reaches no network beyond loopback, so the proxy's connection is recorded, not made);
- a whole task with the default settings: the worker starts the proxy for ``full`` and records its refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.llm import Provider, make_provider
from agent.tools import Workspace, run_tool
from contexts import ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from sandbox.egress import EgressPolicy, EgressProxy, Refusal, Upstream, egress_policy
from sandbox.jail import Bubblewrap, Sandbox, probe
from sandbox.settings import SandboxSettings
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import wait_for
from tests.helpers.loopback_service import serve_text
from tests.helpers.stack import make_buggy_repo
from tests.helpers.worker_scenarios import provider_env
from worker.run import TaskRequest, TaskRun
from worker.runtime import llm_config
from worker.settings_models import Settings

SECRET = f"fleet-secret-{secrets.token_hex(8)}"
# The attacker's proxy client: the proxy variables' NO_PROXY (localhost, 127.0.0.1) would keep curl off the proxy.
VIA_PROXY = "env -u NO_PROXY -u no_proxy curl -sS -i --max-time 20 -x http://127.0.0.1:3128"


@pytest.fixture(scope="module")
def fleet_service() -> Iterator[int]:
    """The port of a service on the host's 127.0.0.1 (what the fleet's Redis is to a worker)."""
    with serve_text(SECRET) as port:
        yield port


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    problem = probe(Bubblewrap(SandboxSettings(network="none")))
    if problem is not None:
        cannot_run(problem)


@dataclass
class Agent:
    sandbox: Sandbox
    refusals: list[Refusal]
    opened: list[tuple[str, int]]
    checkout: Path

    def bash(self, command: str) -> str:
        result = run_tool(
            Workspace(self.checkout),
            "bash",
            {"command": command},
            bash_timeout_s=120,
            max_output_chars=50_000,
            sandbox=self.sandbox,
            limits=SandboxSettings().limits,
        )
        return result.output


@contextlib.contextmanager
def agent_with(
    tmp_path: Path, network: str, allowed_hosts: tuple[str, ...] = (), allowed_internal: tuple[str, ...] = ()
) -> Iterator[Agent]:
    """The agent's sandbox for ``network`` with its task's proxy, as the worker sets them up. Connections the proxy
    makes are recorded; to loopback they are made, anywhere else refused at the socket (no network beyond loopback
    here): the record proves the policy admitted the destination."""
    settings = SandboxSettings(network=network, allowed_hosts=allowed_hosts, allowed_internal=allowed_internal)  # type: ignore[arg-type]
    policy = egress_policy(settings.network, settings.allowed_hosts, settings.allowed_internal)
    assert isinstance(policy, EgressPolicy)
    opened: list[tuple[str, int]] = []

    async def open_upstream(host: str, port: int) -> Upstream:
        opened.append((host, port))
        if not host.startswith("127."):
            raise ConnectionRefusedError(f"the test reaches no network beyond loopback ({host})")
        return await asyncio.open_connection(host, port)

    refusals: list[Refusal] = []
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    with EgressProxy(policy, refusals.append, open_upstream=open_upstream) as proxy:
        yield Agent(Bubblewrap(settings).with_egress(proxy.socket), refusals, opened, checkout)


def test_allowlist_refuses_an_admitted_name_that_resolves_to_the_hosts_loopback(
    tmp_path: Path, fleet_service: int
) -> None:
    # Before the fix: "localhost" was on the list, so the proxy connected to 127.0.0.1:PORT and the secret came back.
    with agent_with(tmp_path, "allowlist", allowed_hosts=("localhost",)) as agent:
        tunnelled = agent.bash(f"{VIA_PROXY} --proxytunnel http://localhost:{fleet_service}/")
        plain = agent.bash(f"{VIA_PROXY} http://localhost:{fleet_service}/")
    for output in (tunnelled, plain):
        assert SECRET not in output
        assert "127.0.0.1 is loopback, not in sandbox.allowed_internal" in output or "403" in output, output
    assert "HTTP/1.1 403 Forbidden" in plain
    assert agent.opened == []
    assert [(r.host, r.port) for r in agent.refusals] == [("localhost", fleet_service)] * 2
    assert all("is loopback" in r.reason for r in agent.refusals)


def test_full_keeps_the_agent_off_the_hosts_loopback_directly_and_through_the_proxy(
    tmp_path: Path, fleet_service: int
) -> None:
    # Before the fix: network full shared the worker's network, and the direct connection returned the secret.
    with agent_with(tmp_path, "full") as agent:
        direct = agent.bash(
            f"curl -sS --max-time 10 --noproxy '*' http://127.0.0.1:{fleet_service}/; echo curl=$?; "
            f"(exec 3<>/dev/tcp/127.0.0.1/{fleet_service}) 2>&1; echo tcp=$?"
        )
        tunnelled = agent.bash(f"{VIA_PROXY} --proxytunnel http://127.0.0.1:{fleet_service}/")
        plain = agent.bash(f"{VIA_PROXY} http://localhost:{fleet_service}/")
        mapped = agent.bash(f"{VIA_PROXY} --proxytunnel http://[::ffff:127.0.0.1]:{fleet_service}/")
    assert SECRET not in direct + tunnelled + plain + mapped
    assert "curl=7" in direct  # could not connect: nothing listens on the sandbox's own loopback
    assert "Connection refused" in direct
    assert "tcp=1" in direct
    assert "HTTP/1.1 403 Forbidden" in plain
    assert agent.opened == []
    assert [(r.host, r.port) for r in agent.refusals] == [
        ("127.0.0.1", fleet_service),
        ("localhost", fleet_service),
        ("::ffff:127.0.0.1", fleet_service),
    ]
    assert all("loopback" in r.reason and "sandbox.allowed_internal" in r.reason for r in agent.refusals)


def test_full_reaches_the_hosts_service_only_through_the_proxy_when_allowed_internal_names_it(
    tmp_path: Path, fleet_service: int
) -> None:
    with agent_with(tmp_path, "full", allowed_internal=("127.0.0.1/32",)) as agent:
        tunnelled = agent.bash(f"{VIA_PROXY} --proxytunnel http://127.0.0.1:{fleet_service}/")
        plain = agent.bash(f"{VIA_PROXY} http://localhost:{fleet_service}/")
        direct = agent.bash(f"curl -sS --max-time 10 --noproxy '*' http://127.0.0.1:{fleet_service}/; echo curl=$?")
        other = agent.bash(f"{VIA_PROXY} --proxytunnel http://127.0.0.2:{fleet_service}/")  # not in the range
    assert SECRET in tunnelled
    assert SECRET in plain
    assert SECRET not in direct
    assert "curl=7" in direct
    assert SECRET not in other
    assert agent.opened == [("127.0.0.1", fleet_service)] * 2
    assert [(r.host, r.port) for r in agent.refusals] == [("127.0.0.2", fleet_service)]


def test_full_admits_a_public_destination_on_policy(tmp_path: Path) -> None:
    with agent_with(tmp_path, "full") as agent:
        output = agent.bash("curl -sS -o /dev/null --max-time 20 https://93.184.215.14/; echo curl=$?")
    assert agent.refusals == []
    assert agent.opened == [("93.184.215.14", 443)]  # the policy let the proxy try; only the connection failed
    assert "502" in output, output
    assert "curl=56" in output


# -- a whole task -------------------------------------------------------------------------------------


def test_a_task_with_the_default_network_reaches_no_host_service_and_records_the_refusal(
    tmp_path: Path, fleet_service: int, make_settings: Callable[..., Settings]
) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    command = (
        f"curl -sS --max-time 10 http://127.0.0.1:{fleet_service}/ > direct.txt 2>&1; "
        f"{VIA_PROXY} http://localhost:{fleet_service}/ > proxied.txt 2>&1; cat direct.txt proxied.txt"
    )
    turns = [
        {"content": "look", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "looked"}}]},
    ]
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = make_settings(provider_env("openai", server.url, 32768))  # sandbox.network: full, the default
        assert settings.sandbox.network == "full"
        assert settings.sandbox.allowed_internal == ()
        request = TaskRequest(
            {"task_source": "local", "owner": "me", "repo": "repo", "task_type": "prompt", "task_id": "1"},
            prompt="Look.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        uuid = str(uuid_module.uuid4())
        outcome = TaskRun(uuid, request, settings, store, provider_for=_provider).execute(llm_config(settings))
    finally:
        server.stop()
    assert outcome["status"] == "completed", outcome
    state = wait_for(lambda: _state(store, uuid), what="the completed state")
    refused = state["egress_refused"]
    assert [(e["host"], e["port"], e["count"]) for e in refused] == [("localhost", fleet_service, 1)]
    assert "loopback" in refused[0]["reason"]
    tools = (store.completed_path(uuid) / "tools.jsonl").read_text()
    assert SECRET not in tools
    assert "403 Forbidden" in tools


def _provider(config: dict[str, Any]) -> Provider:
    return make_provider(
        config["llm_provider"], config["model"], int(config["context_length"]), config.get("endpoint"), None
    )


def _state(store: ContextStore, uuid: str) -> dict[str, Any] | None:
    from contexts.state import read_state

    path = store.completed_path(uuid)
    return read_state(path) if path.is_dir() else None

