"""The compose stack for real (issue 15): the project's images and docker-compose.yml, three worker replicas.

Images: stand-ins for python:3.11-slim and redis:7 made from Debian's packages, then the project's own
Dockerfile (tests/helpers/docker_host.py). Compose: the project's file plus a host-network override
(tests/helpers/compose_stack.py). The model, GitHub's API and the git remotes are the test's fakes on the
loopback, which host-networked containers reach. Timings: heartbeat 2 s, stale after 8 s, monitor every 2 s.

Deselect with ``-m "not compose"``; it runs in ``.ci/run``, and elsewhere skips when no Docker can be had.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from replay import ReplayServer
from tests.helpers.ci import cannot_run
from tests.helpers.compose_stack import ComposeStack, Ports
from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.docker_host import DockerUnavailable, build_images, docker_engine
from tests.helpers.fake_forge import FakeForge
from tests.helpers.model_server import model_server
from tests.helpers.redis_server import free_port
from tests.helpers.stack import fix_calc_trajectory, make_buggy_repo

pytestmark = [pytest.mark.integration, pytest.mark.compose]

OWNER, REPO = "Codertocat", "Hello-World"
FORGE_TOKEN = "compose-forge-token-8e1f0c"
GITHUB_SECRET = "compose-github-webhook-secret"
FLOWER_AUTH = ("operator", "compose-flower-password")
PAUSE_S = 6.0  # the model's pause before its second answer: the window in which a worker is killed mid-task
TURNS = 5
MARKER = re.compile(r"\[tasuki-replay turn=(\d+)\]")
TEST_TIMINGS = {
    "TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S": "2",
    "TASUKI__CONTEXTS__STALE_AFTER_S": "8",
    "TASUKI__MONITOR__INTERVAL_S": "2",
}
FINISH_TIMEOUT_S = 180.0


@dataclass
class Fleet:
    stack: ComposeStack
    forge: FakeForge
    model: ReplayServer
    issues: Iterator[int]

    @property
    def contexts(self) -> Path:
        return self.stack.volume_path("tasuki-data") / "contexts"

    def new_issue(self) -> int:
        number = next(self.issues)
        self.forge.add_item(OWNER, REPO, number, f"add() is wrong ({number})", "The calc test fails.")
        return number

    def submit(self, number: int) -> str:
        """``tasuki submit`` as an operator runs it: inside a container of the stack."""
        done = self.stack.compose("exec", "-T", "webhook", "tasuki", "submit", "--repo", f"{OWNER}/{REPO}",
                                  "--issue", str(number))
        return done.stdout.strip().split()[0]

    def running_file(self, uuid: str, name: str) -> Path:
        return self.contexts / "running" / uuid / name

    def messages(self, uuid: str) -> list[dict[str, Any]]:
        for where in ("running", "completed"):
            path = self.contexts / where / uuid / "messages.jsonl"
            if path.exists():
                return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
        return []

    def completed_state(self, uuid: str) -> dict[str, Any] | None:
        path = self.contexts / "completed" / uuid / "state.json"
        if not path.exists():
            return None
        state: dict[str, Any] = json.loads(path.read_text())
        return state if state["status"] in ("completed", "failed", "timeout", "cancelled") else None

    def wait_finished(self, uuid: str) -> dict[str, Any]:
        state: dict[str, Any] = self.stack.wait(lambda: self.completed_state(uuid), FINISH_TIMEOUT_S,
                                                f"task {uuid} to finish")
        return state

    def mid_task(self, uuid: str) -> bool:
        """The task's first tool result is on disk: the model now pauses before its second answer."""
        return any(m.get("role") == "tool" for m in self.messages(uuid))

    def holder_container(self, uuid: str) -> str:
        """The worker container whose process holds the context (by the PID namespace the lock records)."""
        lock = json.loads(self.running_file(uuid, ".lock").read_text())
        by_namespace = {self.stack.pid_namespace(c): c for c in self.stack.containers("worker")}
        container = by_namespace.get(lock["pid_namespace"])
        assert container, f"no worker container has the lock's PID namespace {lock['pid_namespace']}"
        return container


def assert_each_step_once(fleet: Fleet, uuid: str) -> None:
    """Every scripted model answer is in the context exactly once, in order: no step was repeated."""
    answered = [int(n) for m in fleet.messages(uuid) if m["role"] == "assistant"
                for n in MARKER.findall(m.get("content") or "")]
    assert answered == list(range(TURNS)), answered
    seqs = [m["seq"] for m in fleet.messages(uuid)]
    assert seqs == list(range(1, len(seqs) + 1))


def first_step_after(fleet: Fleet, uuid: str, moment: float) -> float:
    """Seconds from ``moment`` (a Unix time) to the first message written after it."""
    later = [datetime.fromisoformat(m["timestamp"]).timestamp() for m in fleet.messages(uuid)]
    return min(t for t in later if t > moment) - moment


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    try:
        engine = docker_engine()
        build_images(engine)
    except DockerUnavailable as exc:
        cannot_run(str(exc))
    root = tmp_path_factory.mktemp("compose")
    trajectory = fix_calc_trajectory()
    # The first answer proves the sandbox: in bubblewrap's PID namespace, process 1 is bwrap itself.
    trajectory[0]["tool_calls"][0]["arguments"]["command"] = "cat /proc/1/comm; python -m unittest -q"
    trajectory.insert(1, {"delay_s": PAUSE_S})
    with model_server(trajectory) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        settings = {
            **TEST_TIMINGS,
            "TASUKI__LLM__PROVIDER": "openai",
            "TASUKI__LLM__OPENAI__BASE_URL": f"{model.url}/v1",
            "TASUKI__LLM__OPENAI__MODEL": "scripted",
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",  # the label of the published example payload
        }
        variables = {
            "GITHUB_TOKEN": FORGE_TOKEN,
            "OPENAI_API_KEY": "sk-compose-test-not-a-real-key",
            "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
            "FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH),
        }
        stack = ComposeStack(engine, root, Ports(free_port(), free_port(), free_port()), settings, variables)
        try:
            stack.up()
            yield Fleet(stack, forge, model, iter(range(100, 200)))
        finally:
            print(stack.logs(tail=100)[-6000:])  # shown by pytest only when a test failed
            stack.down(volumes=True)


def test_every_service_of_the_stack_becomes_healthy_with_three_workers(fleet: Fleet) -> None:
    def all_healthy() -> dict[str, str] | None:
        health = fleet.stack.health()
        return health if health and set(health.values()) == {"healthy"} else None

    health = fleet.stack.wait(all_healthy, 180, "every container to be healthy")

    services = sorted(re.sub(r"^tasukitest\w+?[-_]|[-_]\d+$", "", name) for name in health)
    assert services == ["beat", "flower", "maintenance", "redis", "webhook", "worker", "worker", "worker"]


def test_a_task_through_the_webhook_and_one_through_tasuki_submit_complete_in_the_sandbox(fleet: Fleet) -> None:
    fleet.forge.add_item(OWNER, REPO, 1, "Spelling error in the README file", "commmit", labels=["bug"])
    body, headers = github_delivery("issues", load_payload("github/issues.labeled.json"), GITHUB_SECRET)
    answer = httpx.post(f"http://127.0.0.1:{fleet.stack.ports.webhook}/webhooks/github", content=body,
                        headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
    through_webhook = answer.json()["task_id"]
    through_submit = fleet.submit(fleet.new_issue())

    for uuid in (through_webhook, through_submit):
        state = fleet.wait_finished(uuid)
        assert state["status"] == "completed", state
        tool_results = [m["content"] for m in fleet.messages(uuid) if m["role"] == "tool"]
        assert tool_results[0].splitlines()[0].strip() == "bwrap", tool_results[0]  # the agent's bash was sandboxed
        assert_each_step_once(fleet, uuid)
    assert fleet.forge.item(OWNER, REPO, 1).labels == ["coding agent done"]


@pytest.mark.parametrize("how", ["kill", "restart"])
def test_a_worker_container_that_dies_mid_task_never_strands_its_task(fleet: Fleet, how: str) -> None:
    uuid = fleet.submit(fleet.new_issue())
    fleet.stack.wait(lambda: fleet.mid_task(uuid), 120, f"task {uuid} to be mid-task", logs_of="worker")
    container = fleet.holder_container(uuid)

    if how == "kill":
        fleet.stack.engine.docker("kill", container)
    else:  # the same container again: same hostname, a new PID namespace whose low pids are reused at once
        fleet.stack.engine.docker("restart", "-t", "0", container)
    died = time.time()

    state = fleet.wait_finished(uuid)
    assert state["status"] == "completed", state
    assert state["attempt"] == 2
    assert_each_step_once(fleet, uuid)
    print(f"{how}: {first_step_after(fleet, uuid, died):.1f} s from the container's death to the next step")


def test_flower_lists_the_tasks(fleet: Fleet) -> None:
    finished = sorted(p.name for p in (fleet.contexts / "completed").iterdir())
    assert len(finished) >= 4

    def listed() -> dict[str, Any] | None:
        answer = httpx.get(f"http://127.0.0.1:{fleet.stack.ports.flower}/api/tasks", auth=FLOWER_AUTH, timeout=10)
        tasks: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
        return tasks if set(finished) <= set(tasks) else None

    tasks = fleet.stack.wait(listed, 60, "Flower to list every finished task", logs_of="flower")
    assert {tasks[uuid]["name"] for uuid in finished} == {"tasuki.run_task"}
    unauthorised = httpx.get(f"http://127.0.0.1:{fleet.stack.ports.flower}/api/tasks", timeout=10)
    assert unauthorised.status_code == 401


def test_compose_down_and_up_again_loses_nothing_queued_or_running(fleet: Fleet) -> None:
    running = fleet.submit(fleet.new_issue())
    fleet.stack.wait(lambda: fleet.mid_task(running), 120, f"task {running} to be mid-task", logs_of="worker")
    fleet.stack.compose("stop", "worker", timeout_s=300)  # SIGTERM: the running task is handed back
    queued = fleet.submit(fleet.new_issue())  # no worker is up to take it

    fleet.stack.down()  # containers gone; the named volumes (Redis's append-only file, contexts) stay
    assert fleet.completed_state(running) is None
    assert fleet.completed_state(queued) is None
    fleet.stack.up()

    for uuid in (running, queued):
        state = fleet.wait_finished(uuid)
        assert state["status"] == "completed", state
        assert_each_step_once(fleet, uuid)
