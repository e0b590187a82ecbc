"""MCP tools (issue 38, item 7) with a real MCP server of our own (tests/helpers/mcp_server.py, the SDK's MCPServer):
over stdio inside the real bubblewrap sandbox, and over streamable HTTP through the real egress proxy. Each call
goes through ``run_tool`` as the loop makes it; what the server may reach, read and change is tried as an attacker
would, and a server that hangs, dies or never starts costs the task one line, never the task.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.mcp.declared import DeclarationError, DeclaredServer, repository_servers, task_servers
from agent.mcp.servers import MCPServers, mcp_servers
from agent.mcp.settings import MCPServerSettings, MCPSettings
from agent.mcp.transports import EgressRoute, StdioJail
from agent.tools import ToolResult, Workspace, run_tool
from agent.tools.toolbox import BUILTINS
from contexts.masking import mask
from sandbox.egress import EgressPolicy, EgressProxy, Refusal, egress_policy
from sandbox.jail import Bubblewrap, NoSandbox, probe
from sandbox.settings import SandboxSettings
from tests.helpers.ci import cannot_run
from tests.helpers.loopback_service import serve_text
from tests.helpers.mcp_support import processes_with

SERVER = Path(__file__).parent / "helpers" / "mcp_server.py"
PYTHON = str(Path(sys.prefix) / "bin" / "python")  # Tasuki's virtualenv has the SDK; the sandbox is shown it read-only
HOST_SECRET = "host-only-secret-4f1c9a"
TOKEN_PREFIX = "ghp_A1b2C3d4"


@pytest.fixture(scope="module")
def _bubblewrap() -> None:
    problem = probe(Bubblewrap(SandboxSettings(network="none")))
    if problem is not None:
        cannot_run(problem)


def _stdio(name: str = "tracker", *args: str, command: str = PYTHON, **extra: Any) -> MCPServerSettings:
    return MCPServerSettings(command=command, args=args or ("mcp_server.py",), **extra)


@contextmanager
def _servers(tmp_path: Path, declared: list[DeclaredServer], *, network: str = "none", route: EgressRoute | None = None,
             sandboxed: bool = True, environ: dict[str, str] | None = None, **mcp: Any) -> Iterator[MCPServers]:
    """The task's servers as the worker starts them: a checkout holding the server's script, its home, its sandbox."""
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    checkout.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    shutil.copy(SERVER, checkout / "mcp_server.py")
    (checkout / "notes.txt").write_text("in the checkout\n")
    settings = SandboxSettings(network=network, read_only_paths=(Path(sys.prefix),))  # type: ignore[arg-type]
    sandbox = Bubblewrap(settings) if sandboxed else NoSandbox()
    jail = StdioJail(sandbox, checkout, home, settings.limits, 600)
    with mcp_servers(MCPSettings(**mcp), declared, jail, route or EgressRoute(None), environ) as servers:
        yield servers


def _call(servers: MCPServers, name: str, arguments: object) -> ToolResult:
    box = BUILTINS.with_tools(servers.tools())
    workspace = Workspace(servers.jail.checkout)
    return run_tool(workspace, name, arguments, bash_timeout_s=30, max_output_chars=100_000, tools=box.tools)


# -- stdio, in the sandbox ------------------------------------------------------------------------------


@pytest.mark.usefixtures("_bubblewrap")
def test_a_stdio_server_in_the_sandbox_offers_its_tools_under_mcp_names_and_answers_calls(tmp_path: Path) -> None:
    with _servers(tmp_path, [DeclaredServer("tracker", _stdio(), "repository")]) as servers:
        names = [tool.name for tool in servers.tools()]
        added = _call(servers, "mcp__tracker__add", {"a": 2, "b": 40})
        issue = _call(servers, "mcp__tracker__lookup_issue", {"id": 7})
        wrong = _call(servers, "mcp__tracker__add", {"a": "two", "b": 40})
        missing = _call(servers, "mcp__tracker__add", {"a": 2})
    assert "mcp__tracker__lookup_issue" in names
    assert "mcp__tracker__add" in names
    assert servers.reports[0].problem is None
    assert (added.status, added.output) == ("success", "42")
    assert issue.status == "success"
    assert "issue 7: the parser drops the last line" in issue.output
    assert (wrong.status, wrong.error) == ("error", "mcp__tracker__add: argument a must be an integer, got string")
    assert missing.status == "error"
    assert "missing required argument(s) b" in (missing.error or "")
    description = next(t.description for t in servers.tools() if t.name == "mcp__tracker__add")
    assert description.startswith("[MCP server 'tracker', declared by the repository's .tasuki/mcp.json] Add")


@pytest.mark.usefixtures("_bubblewrap")
def test_a_stdio_server_sees_the_checkout_read_only_and_no_host_file(tmp_path: Path) -> None:
    host_file = tmp_path / "host-secret.txt"  # beside the checkout, on the host: not bound into the sandbox
    host_file.write_text(HOST_SECRET)
    with _servers(tmp_path, [DeclaredServer("tracker", _stdio(), "repository")]) as servers:
        checkout = _call(servers, "mcp__tracker__read_path", {"path": "/workspace/notes.txt"})
        host = _call(servers, "mcp__tracker__read_path", {"path": str(host_file)})
        shadow = _call(servers, "mcp__tracker__read_path", {"path": "/etc/shadow"})
        worker = _call(servers, "mcp__tracker__read_path", {"path": str(Path(__file__).parents[1] / "pyproject.toml")})
        written = _call(servers, "mcp__tracker__write_path", {"path": "/workspace/notes.txt", "text": "changed"})
    assert checkout.output == "read: in the checkout\n"
    assert HOST_SECRET not in host.output
    assert host.output.startswith("unreadable")
    assert shadow.output.startswith("unreadable")
    assert worker.output.startswith("unreadable"), worker.output
    assert written.output == "unwritable: Read-only file system"
    assert (tmp_path / "checkout" / "notes.txt").read_text() == "in the checkout\n"


@pytest.mark.usefixtures("_bubblewrap")
def test_a_stdio_server_reaches_no_network_when_the_policy_gives_none(tmp_path: Path) -> None:
    with serve_text(HOST_SECRET) as port, _servers(tmp_path, [DeclaredServer("tracker", _stdio(), "operator")]) as s:
        loopback = _call(s, "mcp__tracker__fetch", {"url": f"http://127.0.0.1:{port}/"})
        public = _call(s, "mcp__tracker__fetch", {"url": "http://93.184.215.14/"})
    assert HOST_SECRET not in loopback.output
    assert loopback.output.startswith("unreachable"), loopback.output
    assert public.output.startswith("unreachable"), public.output


@pytest.mark.usefixtures("_bubblewrap")
def test_a_stdio_server_behind_an_allow_list_reaches_only_through_the_proxy_which_refuses_the_host(
    tmp_path: Path,
) -> None:
    refusals: list[Refusal] = []
    policy = egress_policy("allowlist", ("pypi.org",), ())
    assert isinstance(policy, EgressPolicy)
    with serve_text(HOST_SECRET) as port, EgressProxy(policy, refusals.append) as proxy:
        checkout, home = tmp_path / "checkout", tmp_path / "home"
        checkout.mkdir()
        home.mkdir()
        shutil.copy(SERVER, checkout / "mcp_server.py")
        settings = SandboxSettings(network="allowlist", allowed_hosts=("pypi.org",),
                                   read_only_paths=(Path(sys.prefix),))
        jail = StdioJail(Bubblewrap(settings).with_egress(proxy.socket), checkout, home, settings.limits, 600)
        declared = [DeclaredServer("tracker", _stdio(), "repository")]
        with mcp_servers(MCPSettings(), declared, jail, EgressRoute(policy, proxy.socket)) as servers:
            direct = _call(servers, "mcp__tracker__fetch", {"url": f"http://127.0.0.1:{port}/"})
            proxied = _call(servers, "mcp__tracker__fetch", {"url": f"http://evil.example.com:{port}/"})
    assert HOST_SECRET not in direct.output + proxied.output
    assert direct.output.startswith("unreachable"), direct.output
    assert "403" in proxied.output, proxied.output
    assert [(r.host, r.reason) for r in refusals] == [("evil.example.com", "not in sandbox.allowed_hosts")]


@pytest.mark.usefixtures("_bubblewrap")
def test_a_server_that_hangs_times_out_and_the_next_call_is_answered(tmp_path: Path) -> None:
    with _servers(tmp_path, [DeclaredServer("tracker", _stdio(), "repository")], call_timeout_s=1.0) as servers:
        hung = _call(servers, "mcp__tracker__sleep", {"seconds": 60})
        after = _call(servers, "mcp__tracker__add", {"a": 1, "b": 1})
    assert hung.status == "error"
    assert (hung.error or "").startswith("MCP server 'tracker': ")
    assert hung.error == "MCP server 'tracker': no answer within 1 s", hung.error
    assert (after.status, after.output) == ("success", "2")


@pytest.mark.usefixtures("_bubblewrap")
def test_a_server_that_dies_mid_call_is_an_error_for_the_model_and_no_process_is_left(tmp_path: Path) -> None:
    marker = f"tasuki-mcp-marker-{os.getpid()}-{time.monotonic_ns()}"
    declared = [DeclaredServer("tracker", _stdio("tracker", "mcp_server.py", marker), "repository")]
    with _servers(tmp_path, declared) as servers:
        assert processes_with(marker), "the server should be running"
        crashed = _call(servers, "mcp__tracker__crash", {})
        after = _call(servers, "mcp__tracker__add", {"a": 1, "b": 1})
    assert crashed.error == "MCP server 'tracker': the server closed the connection (it exited or crashed)"
    assert after.status == "error"
    assert (after.error or "").startswith("MCP server 'tracker': ")
    assert processes_with(marker) == []


@pytest.mark.usefixtures("_bubblewrap")
def test_every_server_process_is_gone_when_the_task_ends(tmp_path: Path) -> None:
    marker = f"tasuki-mcp-marker-{os.getpid()}-{time.monotonic_ns()}"
    declared = [DeclaredServer("a", _stdio("a", "mcp_server.py", marker), "repository"),
                DeclaredServer("b", _stdio("b", "mcp_server.py", marker), "operator")]
    with _servers(tmp_path, declared) as servers:
        assert processes_with(marker)
        hung = _call(servers, "mcp__a__sleep", {"seconds": 0.1})
    assert hung.output == "awake"
    assert processes_with(marker) == []


@pytest.mark.usefixtures("_bubblewrap")
def test_a_server_that_cannot_start_or_never_answers_is_left_out_with_one_line(tmp_path: Path) -> None:
    marker = f"tasuki-mcp-silent-{os.getpid()}-{time.monotonic_ns()}"
    declared = [
        DeclaredServer("broken", _stdio("broken", "-c", "import sys; sys.exit('no database configured')"), "operator"),
        DeclaredServer("silent", MCPServerSettings(command="bash", args=("-c", f"sleep 600; : {marker}")),
                       "repository"),
        DeclaredServer("tracker", _stdio(), "repository"),
    ]
    with _servers(tmp_path, declared, start_timeout_s=5.0) as servers:
        names = [tool.name for tool in servers.tools()]
        works = _call(servers, "mcp__tracker__add", {"a": 3, "b": 4})
    problems = {report.name: report.problem for report in servers.reports}
    assert problems["tracker"] is None
    assert (problems["broken"] or "").startswith("did not start: "), problems
    assert "no database configured" in (problems["broken"] or ""), problems
    assert problems["silent"] == "did not start and list its tools within 5 s"
    assert all(name.startswith("mcp__tracker__") for name in names)
    assert works.output == "7"
    assert all("\n" not in line for line in (r.line() for r in servers.reports))
    assert processes_with(marker) == []


@pytest.mark.usefixtures("_bubblewrap")
def test_an_operators_secret_reaches_its_server_alone_and_a_server_lacking_one_is_left_out(tmp_path: Path) -> None:
    lacking = _stdio("needy").model_copy(update={"secret_env": {"API_TOKEN": "TASUKI_TEST_ABSENT"}})
    given = _stdio("given").model_copy(update={"secret_env": {"API_TOKEN": "TASUKI_TEST_MCP_TOKEN"}})
    secret = "opaque-value-8d7e6f5a4b3c"
    declared = [DeclaredServer("needy", lacking, "operator"), DeclaredServer("given", given, "operator")]
    with _servers(tmp_path, declared, environ={"TASUKI_TEST_MCP_TOKEN": secret}) as servers:
        problems = {report.name: report.problem for report in servers.reports}
        environ = _call(servers, "mcp__given__read_path", {"path": "/proc/self/environ"})
        # The agent's shell, in the same task's sandbox, looks for it in every process it can see.
        agent = run_tool(Workspace(servers.jail.checkout), "bash",
                         {"command": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c API_TOKEN"},
                         bash_timeout_s=30, max_output_chars=10_000, sandbox=servers.jail.sandbox,
                         home=servers.jail.home)
        run_tool(Workspace(servers.jail.checkout), "bash", {"command": "echo planted > $HOME/planted.txt"},
                 bash_timeout_s=30, max_output_chars=10_000, sandbox=servers.jail.sandbox, home=servers.jail.home)
        planted = _call(servers, "mcp__given__read_path", {"path": "/tmp/home/planted.txt"})
    assert (servers.jail.home / "planted.txt").read_text() == "planted\n"
    assert planted.output == "unreadable: No such file or directory"  # an operator's server has a home of its own
    assert problems == {"needy": "the worker's environment lacks TASUKI_TEST_ABSENT", "given": None}
    assert f"API_TOKEN={secret}" in environ.output
    assert "HOME=/tmp/home" in environ.output  # its own home, bound where the agent's is
    assert secret not in agent.output
    assert agent.output.startswith("0\n"), agent.output
    assert mask(f"the server said {secret}") == "the server said [SECRET]"


# -- remote, through the egress rules -------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server() -> Iterator[int]:
    """Our MCP server over streamable HTTP on the host's 127.0.0.1; its port."""
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = int(probe_socket.getsockname()[1])
    process = subprocess.Popen([PYTHON, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "the HTTP server exited"
            time.sleep(0.1)
        else:
            pytest.fail("the MCP HTTP server did not listen in 60 s")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _remote(port: int, **extra: Any) -> MCPServerSettings:
    return MCPServerSettings(url=f"http://127.0.0.1:{port}/mcp", **extra)


def test_a_remote_server_is_reached_through_the_egress_proxy_when_its_host_is_allowed(
    tmp_path: Path, http_server: int
) -> None:
    refusals: list[Refusal] = []
    policy = egress_policy("allowlist", ("127.0.0.1",), (f"127.0.0.1/32:{http_server}",))
    assert isinstance(policy, EgressPolicy)
    declared = [DeclaredServer("docs", _remote(http_server, secret_headers={"Authorization": "TASUKI_TEST_BEARER"}),
                               "operator")]
    with EgressProxy(policy, refusals.append) as proxy, _servers(
        tmp_path, declared, route=EgressRoute(policy, proxy.socket), environ={"TASUKI_TEST_BEARER": "Bearer xyz-123456"}
    ) as servers:
        added = _call(servers, "mcp__docs__add", {"a": 20, "b": 22})
        issue = _call(servers, "mcp__docs__lookup_issue", {"id": 3})
    assert servers.reports[0].problem is None, servers.reports
    assert servers.reports[0].transport == "http"
    assert (added.status, added.output) == ("success", "42")
    assert "issue 3" in issue.output
    assert refusals == []


def test_a_remote_server_on_a_host_the_egress_rules_refuse_is_left_out_and_never_contacted(
    tmp_path: Path, http_server: int
) -> None:
    allowlist = egress_policy("allowlist", ("pypi.org",), ())
    full = egress_policy("full", (), ())  # any public host; the host's loopback only when allowed_internal names it
    declared = [DeclaredServer("docs", _remote(http_server), "repository")]
    outcomes = []
    for route in (EgressRoute(allowlist), EgressRoute(full), EgressRoute(None)):
        with _servers(tmp_path, declared, route=route, sandboxed=False) as servers:
            outcomes.append(servers.reports[0].problem)
            assert servers.tools() == []
    assert outcomes == [
        "egress refused: 127.0.0.1: not in sandbox.allowed_hosts",
        "egress refused: 127.0.0.1: 127.0.0.1 is loopback, not in sandbox.allowed_internal",
        "egress refused: sandbox.network is none: nothing leaves the task",
    ]


def test_the_proxy_refuses_a_remote_server_whose_allowed_name_resolves_to_the_hosts_loopback(
    tmp_path: Path, http_server: int
) -> None:
    refusals: list[Refusal] = []
    policy = egress_policy("allowlist", ("localhost",), ())
    assert isinstance(policy, EgressPolicy)
    declared = [DeclaredServer("docs", MCPServerSettings(url=f"http://localhost:{http_server}/mcp"), "repository")]
    with EgressProxy(policy, refusals.append) as proxy, _servers(
        tmp_path, declared, route=EgressRoute(policy, proxy.socket), start_timeout_s=10.0
    ) as servers:
        problem = servers.reports[0].problem
    assert problem is not None
    assert servers.tools() == []
    assert [(r.host, r.port) for r in refusals] == [("localhost", http_server)]


# -- declarations -----------------------------------------------------------------------------------------


def test_a_repository_declares_servers_in_the_usual_shape_and_never_names_a_secret() -> None:
    servers = repository_servers('{"mcpServers": {"tracker": {"command": "python", "args": ["s.py"]},'
                                 ' "docs": {"type": "http", "url": "https://docs.example.com/mcp"}}}')
    assert servers["tracker"].args == ("s.py",)
    assert servers["docs"].url == "https://docs.example.com/mcp"
    for text, problem in [
        ('{"mcpServers": {"x": {"command": "p", "secret_env": {"T": "GITHUB_TOKEN"}}}}',
         ".tasuki/mcp.json: mcpServers.x: unknown key(s) secret_env"),
        ('{"mcpServers": {"x": {"url": "https://h/mcp", "secret_headers": {"A": "B"}}}}',
         ".tasuki/mcp.json: mcpServers.x: unknown key(s) secret_headers"),
        ('{"mcpServers": {"x": {}}}', ".tasuki/mcp.json: mcpServers.x"),
        ('{"mcpServers": {"bad name!": {"command": "p"}}}', ".tasuki/mcp.json: mcpServers.bad name!"),
        ("{not json", ".tasuki/mcp.json: not valid JSON at line 1"),
    ]:
        with pytest.raises(DeclarationError) as raised:
            repository_servers(text)
        assert str(raised.value).startswith(problem), str(raised.value)
        assert "\n" not in str(raised.value)


def test_an_operators_server_wins_over_the_repositorys_of_the_same_name() -> None:
    settings = MCPSettings(servers={"tracker": MCPServerSettings(command="op-server")}, repository_servers=True)
    declared, problems = task_servers(settings, '{"mcpServers": {"tracker": {"command": "repo-server"},'
                                                ' "lint": {"command": "lint-server"}}}')
    assert [(d.name, d.origin, d.settings.command) for d in declared] == [
        ("tracker", "operator", "op-server"), ("lint", "repository", "lint-server")]
    assert problems == [".tasuki/mcp.json: server 'tracker' is also the operator's; the operator's is used"]
    off = settings.model_copy(update={"repository_servers": False})
    assert [d.name for d in task_servers(off, '{"mcpServers": {"lint": {"command": "x"}}}')[0]] == ["tracker"]

