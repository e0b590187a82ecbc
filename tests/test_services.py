"""A task's services (SPEC §17): real redis-server and PostgreSQL in real bubblewrap sandboxes, reached by the
agent's commands from sandboxes of their own through sockets under the task's home."""

from __future__ import annotations

import getpass
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from contexts import TasukiError
from sandbox import confine
from sandbox.host import HOST_ENV
from sandbox.jail import HOME, Bubblewrap
from sandbox.services import (
    ServicesError,
    _descendants,
    declared_services,
    parse_services,
    task_services,
)
from sandbox.settings import EnvironmentsSettings, RepositoryEnvironment, SandboxSettings, ServiceSettings
from tests.helpers.ci import bubblewrap_here, cannot_run
from tests.helpers.context_support import wait_for

REDIS = (
    "redis:\n"
    "  command: exec redis-server --port 0 --unixsocket $TASUKI_SERVICE_DIR/redis.sock --dir $TASUKI_SERVICE_DIR\n"
    "  ready: redis-cli -s $TASUKI_SERVICE_DIR/redis.sock ping | grep -q PONG\n"
    "  ready_timeout_s: 30\n"
)


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def postgres(agent_user: str) -> str:
    bin_dir = postgres_bin()
    return (
        "db:\n"
        f"  command: {bin_dir}/initdb -D $TASUKI_SERVICE_DIR/data -U {agent_user} --auth=trust >/dev/null"
        f" && exec {bin_dir}/postgres -D $TASUKI_SERVICE_DIR/data -k $TASUKI_SERVICE_DIR -c listen_addresses=''\n"
        f"  ready: {bin_dir}/pg_isready -h $TASUKI_SERVICE_DIR\n"
        "  ready_timeout_s: 120\n"
    )


@pytest.fixture(scope="module", autouse=True)
def bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def redis_binaries() -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        cannot_run("redis-server and redis-cli are not installed (apt install redis-server)")


class Task:
    """A stand-in for one task: its checkout and its home (0700, bound at HOME for each of its commands)."""

    def __init__(self, root: Path) -> None:
        self.checkout = root / "checkout"
        self.home = root / "home"
        self.checkout.mkdir(parents=True)
        self.home.mkdir(mode=0o700)

    def agent(self, command: str, network: str = "full") -> subprocess.CompletedProcess[str]:
        """``command`` as the agent's bash tool runs it: the jail, the checkout at /workspace, the home at HOME."""
        sandbox = Bubblewrap(SandboxSettings(network=network))  # type: ignore[arg-type]
        env = {"PATH": os.environ["PATH"], "HOME": HOME, "TMPDIR": HOME, "LANG": "C.UTF-8"}
        argv, cwd = sandbox.command(["bash", "-c", command], self.checkout, self.home, env)
        confine.hand_over_call(self.checkout, self.home, sandbox.user)  # as the bash tool does (a root worker's)
        with confine.confined(argv, None, 0, user=sandbox.user) as call:
            return subprocess.run(call.argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, timeout=60,
                                  check=False)

    def services(self, text: str, grace_s: float = 5.0) -> AbstractContextManager[str]:
        return task_services(parse_services(text, "test"), SandboxSettings(), self.checkout, self.home, grace_s=grace_s)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return Task(tmp_path / "task")


@pytest.mark.parametrize("network", ["full", "none"])
def test_a_redis_service_answers_ping_from_an_agent_command_in_another_sandbox(
    task: Task, redis_binaries: None, network: str
) -> None:
    with task.services(REDIS) as told:
        assert "- redis: ready, in /tmp/home/.services/redis" in told
        done = task.agent("redis-cli -s $HOME/.services/redis/redis.sock ping", network)
        assert done.stdout.strip() == "PONG", done.stderr
    log = (task.home / ".services" / "redis" / "service.log").read_text()
    assert "ready to accept connections" in log
    assert "Received SIGTERM" in log  # stopped gracefully first


def test_a_postgres_service_answers_psql_through_its_socket_under_the_home(task: Task) -> None:
    if postgres_bin() is None or shutil.which("psql") is None:
        cannot_run("PostgreSQL is not installed (apt install postgresql)")
    dropped = confine.sandbox_user(SandboxSettings().user)  # a root worker's agent runs as the sandbox's user
    with task.services(postgres(dropped.name if dropped is not None else getpass.getuser())) as told:
        assert "- db: ready" in told, told
        done = task.agent("psql -h $HOME/.services/db -d postgres -Atc 'select 1 + 1'")
        assert done.stdout.strip() == "2", done.stderr
    assert (task.home / ".services" / "db" / "data" / "PG_VERSION").is_file()  # its data is in the task's home


def test_two_tasks_services_do_not_see_each_others_data_even_on_the_same_port(
    tmp_path: Path, redis_binaries: None
) -> None:
    # Both listen on 6379 too (this host's own Redis may hold it): each service has a network of its own.
    same_port = REDIS.replace("--port 0", "--port 6379")
    first, second = Task(tmp_path / "first"), Task(tmp_path / "second")
    with first.services(same_port) as told_first, second.services(same_port) as told_second:
        assert "redis: ready" in told_first
        assert "redis: ready" in told_second
        cli = "redis-cli -s $HOME/.services/redis/redis.sock"
        assert first.agent(f"{cli} set owner first").stdout.strip() == "OK"
        assert second.agent(f"{cli} get owner").stdout.strip() == ""
        assert second.agent(f"{cli} set owner second").stdout.strip() == "OK"
        assert first.agent(f"{cli} get owner").stdout.strip() == "first"
        assert second.agent(f"{cli} get owner").stdout.strip() == "second"
        assert second.agent(f"ls {first.home}/.services").returncode != 0  # the other task's home is not there


def test_a_service_that_never_becomes_ready_is_stopped_and_the_agent_is_told_why(task: Task) -> None:
    never = (
        "slow:\n"
        "  command: echo warming up with ghp_0123456789abcdefABCDEF0123456789abcd; exec sleep infinity\n"
        "  ready: echo still cold; exit 3\n"
        "  ready_timeout_s: 1\n"
        "gone:\n"
        "  command: echo no such database >&2; exit 7\n"
        "  ready: 'true'\n"
    )
    with task.services(never) as told:
        assert "- slow: NOT available, the task goes on without it: not ready after 1 s" in told
        assert "exit code 3, still cold" in told
        assert "warming up with [GITHUB_TOKEN]" in told  # the log's tail, masked
        assert "- gone: NOT available, the task goes on without it: it exited with code 7" in told
        assert "no such database" in told
        assert "ghp_" not in (task.home / ".services" / "slow" / "service.log").read_text()
        wait_for(lambda: not [pid for pid in _descendants(os.getpid()) if _name(pid) == "sleep"], what="stopped")


def test_a_killed_owner_takes_its_services_along(task: Task, redis_binaries: None) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(task.checkout), str(task.home), REDIS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    try:
        assert owner.stdout is not None
        told = next(line for line in owner.stdout if line.startswith("told:"))  # structlog prints on stdout too
        assert "redis: ready" in told
        tree = {(pid, _started(pid)) for pid in _descendants(owner.pid)}
        assert any(_name(pid) == "redis-server" for pid, _ in tree)
        assert task.agent("redis-cli -s $HOME/.services/redis/redis.sock ping").stdout.strip() == "PONG"
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        wait_for(lambda: not any(_started(pid) == started for pid, started in tree), timeout=30, what="no orphan")
        assert task.agent("redis-cli -s $HOME/.services/redis/redis.sock ping").stdout.strip() != "PONG"
    finally:
        owner.kill()
        owner.wait()


OWNER = """
import sys
from pathlib import Path
from sandbox.services import parse_services, task_services
from sandbox.settings import SandboxSettings
declared = parse_services(sys.argv[3], "test")
with task_services(declared, SandboxSettings(), Path(sys.argv[1]), Path(sys.argv[2])) as told:
    print("told:", told.replace("\\n", " "), flush=True)
    sys.stdin.read()
"""


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def test_a_link_planted_where_a_service_keeps_its_log_is_not_followed(task: Task, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (task.home / ".services").symlink_to(elsewhere)
    with task.services("db:\n  command: exec sleep infinity\n") as told:
        assert "- db: NOT available, the task goes on without it: its directory cannot be made" in told
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("redis: [unclosed\n", ".tasuki/services.yml: not valid YAML at line 2"),
        ("- redis-server\n", ".tasuki/services.yml: top level: Input should be a valid dictionary"),
        ("redis:\n  ready: 'true'\n", ".tasuki/services.yml: redis.command: Field required"),
        ("redis:\n  command: x\n  port: 1\n", ".tasuki/services.yml: redis.port: Extra inputs are not permitted"),
        ("redis:\n  command: x\n  ready_timeout_s: 0\n", ".tasuki/services.yml: redis.ready_timeout_s: Input should"),
        ("../up:\n  command: x\n", ".tasuki/services.yml: service name '../up' must be"),
    ],
)
def test_a_bad_services_file_is_one_line_naming_the_file_and_the_problem(task: Task, text: str, problem: str) -> None:
    (task.checkout / ".tasuki").mkdir()
    (task.checkout / ".tasuki" / "services.yml").write_text(text)
    with pytest.raises(ServicesError) as caught:
        declared_services(task.checkout, "owner/repo", EnvironmentsSettings())
    assert isinstance(caught.value, TasukiError)
    assert str(caught.value).startswith(problem), str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_repository_file_wins_over_the_operators_services(task: Task) -> None:
    operator = EnvironmentsSettings(
        repositories={"owner/repo": RepositoryEnvironment(services={"cache": ServiceSettings(command="memcached")})}
    )
    assert declared_services(task.checkout, "owner/repo", operator) == {"cache": ServiceSettings(command="memcached")}
    assert declared_services(task.checkout, "other/repo", operator) == {}
    (task.checkout / ".tasuki").mkdir()
    (task.checkout / ".tasuki" / "services.yml").write_text(REDIS)
    assert list(declared_services(task.checkout, "owner/repo", operator)) == ["redis"]


def test_no_services_tell_the_agent_nothing(task: Task) -> None:
    with task.services("") as told:
        assert told == ""


def test_a_service_started_again_for_a_resumed_task_finds_its_data_in_the_task_home(
    task: Task, redis_binaries: None
) -> None:
    cli = "redis-cli -s $HOME/.services/redis/redis.sock"
    with task.services(REDIS):
        assert task.agent(f"{cli} set step 7").stdout.strip() == "OK"
    with task.services(REDIS) as told:  # the worker's next attempt, on the same host
        assert "- redis: ready" in told
        assert task.agent(f"{cli} get step").stdout.strip() == "7"


def test_the_documented_example_is_a_valid_services_file() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "environments.md").read_text()
    section = doc.split("## Services", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    services = parse_services(example, "docs/environments.md")
    assert list(services) == ["cache", "db"]
    assert services["db"].command.startswith("{ test -d $TASUKI_SERVICE_DIR/data ||")


def test_a_services_file_that_is_a_link_is_refused_in_one_line(task: Task, tmp_path: Path) -> None:
    outside = tmp_path / "worker-secrets.yml"
    outside.write_text("GITHUB_TOKEN: ghp_0123456789abcdefABCDEF0123456789abcd\n")
    (task.checkout / ".tasuki").mkdir()
    (task.checkout / ".tasuki" / "services.yml").symlink_to(outside)
    with pytest.raises(ServicesError, match=r"^\.tasuki/services\.yml: a symbolic link; services are declared"):
        declared_services(task.checkout, "owner/repo", EnvironmentsSettings())


def test_a_chatty_service_log_stops_growing_at_its_cap(task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandbox.services.MAX_LOG_BYTES", 1000)
    log = task.home / ".services" / "chatty" / "service.log"
    with task.services("chatty:\n  command: seq 1 5000; exec sleep infinity\n") as told:
        assert "- chatty: ready" in told
        wait_for(lambda: log.is_file() and log.read_text().endswith("[the rest of the output is not kept]\n"))
    assert len(log.read_bytes()) <= 1000 + len("[the rest of the output is not kept]\n")
    assert log.read_text().startswith("1\n2\n3\n")


def test_a_service_program_the_setup_installed_in_the_home_is_found_through_tasuki_path(task: Task) -> None:
    (task.home / "bin").mkdir()
    server = task.home / "bin" / "homemade-server"
    server.write_text('#!/bin/sh\necho "$GREETING" > "$TASUKI_SERVICE_DIR/up"\nexec sleep infinity\n')
    server.chmod(0o755)
    (task.home / ".tasuki").mkdir()
    (task.home / ".tasuki" / "path").write_text(f"{HOME}/bin\n")
    (task.home / ".tasuki" / "env").write_text("GREETING=made-at-setup\n")
    with task.services("own:\n  command: exec homemade-server\n  ready: test -s $TASUKI_SERVICE_DIR/up\n") as told:
        assert "- own: ready" in told
        assert task.agent("cat $HOME/.services/own/up").stdout == "made-at-setup\n"


def test_without_a_sandbox_a_service_runs_on_the_host_in_the_same_directory_and_still_stops(
    redis_binaries: None,
) -> None:
    # On the host the socket's path is the host's: a unix socket path must be under 108 bytes, which pytest's
    # temporary directories under xdist are not.
    short = Path(tempfile.mkdtemp(prefix="svc-", dir="/tmp"))
    task = Task(short / "task")
    try:
        _service_on_the_host(task)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _service_on_the_host(task: Task) -> None:
    directory = task.home / ".services" / "redis"
    declared = parse_services(REDIS, "test")
    with task_services(declared, SandboxSettings(backend="none"), task.checkout, task.home, grace_s=5) as told:
        assert f"- redis: ready, in {directory}" in told
        ping = subprocess.run(
            ["redis-cli", "-s", str(directory / "redis.sock"), "ping"], check=False, capture_output=True, text=True
        )
        assert ping.stdout.strip() == "PONG"
        assert any(_name(pid) == "redis-server" for pid in _descendants(os.getpid()))
    assert not any(_name(pid) == "redis-server" for pid in _descendants(os.getpid()))
    assert "Received SIGTERM" in (directory / "service.log").read_text()
