"""A task's services through the worker: a real celery worker, the replay model, a repository that declares a
Redis in .tasuki/services.yml, and the agent's bash command that talks to it through its socket."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sandbox.jail import Bubblewrap, probe
from sandbox.services import _descendants
from sandbox.settings import SandboxSettings
from tests.helpers.ci import cannot_run
from tests.helpers.stack import git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import agent_requests, finish_turn, running_stack, tool

pytestmark = pytest.mark.integration

SERVICES = (
    "cache:\n"
    "  command: exec redis-server --port 0 --unixsocket $TASUKI_SERVICE_DIR/redis.sock --dir $TASUKI_SERVICE_DIR\n"
    "  ready: redis-cli -s $TASUKI_SERVICE_DIR/redis.sock ping | grep -q PONG\n"
    "broken:\n"
    "  command: echo cannot open the data directory; exit 1\n"
)
SOCKET = "$HOME/.services/cache/redis.sock"


@pytest.fixture(autouse=True)
def binaries() -> None:
    problem = probe(Bubblewrap(SandboxSettings()))
    if problem is not None:
        cannot_run(problem)
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        cannot_run("redis-server and redis-cli are not installed (apt install redis-server)")


def repo_with_services(path: Path, services: str) -> Path:
    repo = make_buggy_repo(path)
    (repo / ".tasuki").mkdir()
    (repo / ".tasuki" / "services.yml").write_text(services)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "services")
    return repo


def turns() -> list[dict[str, Any]]:
    command = f"redis-cli -s {SOCKET} set greeting hello && redis-cli -s {SOCKET} get greeting"
    return [{"content": "Use the cache.", "tool_calls": [tool("bash", command=command)]}, finish_turn("Used it.")]


def test_the_agents_command_talks_to_its_service_and_the_service_ends_with_the_task(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    repo = repo_with_services(tmp_path / "repo", SERVICES)
    with running_stack(tmp_path, redis_url, turns()) as (stack, server):
        worker = stack.start_worker("w1")
        uuid = stack.send(local_request(repo))
        state = stack.wait_finished(uuid)
        assert state["status"] == "completed", state
        assert worker.process is not None
        stack.wait_until(
            lambda: not any(_name(pid) == "redis-server" for pid in _descendants(worker.process.pid)),  # type: ignore[union-attr]
            what="the service stopped",
        )
        requests = agent_requests(server.requests)

    first = requests[0]["body"]["messages"][1]["content"]
    assert "- cache: ready, in /tmp/home/.services/cache" in first
    assert "- broken: NOT available, the task goes on without it: it exited with code 1" in first
    assert "cannot open the data directory" in first
    answered = requests[1]["body"]["messages"][-1]
    assert answered["role"] == "tool"
    assert "OK\nhello\n" in answered["content"]


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_bad_services_file_starts_none_and_the_task_goes_on_told_in_one_line(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    repo = repo_with_services(tmp_path / "repo", "cache: [redis-server\n")
    with running_stack(tmp_path, redis_url, [finish_turn("Nothing to do.")]) as (stack, server):
        stack.start_worker("w1")
        state = stack.wait_finished(stack.send(local_request(repo)))
        requests = agent_requests(server.requests)

    assert state["status"] == "completed", state
    first = requests[0]["body"]["messages"][1]["content"]
    told = next(line for line in first.splitlines() if "services" in line.lower())
    assert told.startswith("No services were started for this task: .tasuki/services.yml: not valid YAML at line 2")
