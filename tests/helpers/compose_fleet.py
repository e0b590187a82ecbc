"""A compose fleet for tests and benchmarks: the stack of :mod:`tests.helpers.compose_stack` with its fakes.

The model (the replay server; a task on an issue made with ``new_issue(held=True)`` waits for its second answer
until the test releases it, so a worker is killed or stopped mid-task however slow the machine is), GitHub's
API and the git remote (the fake forge) run in this process on the loopback, which host-networked containers
reach; ``tasuki submit`` runs inside a container, as an operator would run it.

    with compose_fleet(root, TEST_TIMINGS) as fleet:
        uuid = fleet.submit(fleet.new_issue())
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts import jsonl
from replay import ReplayServer
from tests.helpers.compose_stack import ComposeStack, Ports
from tests.helpers.docker_host import build_images, docker_engine
from tests.helpers.fake_forge import FakeForge
from tests.helpers.model_server import model_server
from tests.helpers.redis_server import free_port
from tests.helpers.stack import final_state, fix_calc_trajectory, make_buggy_repo

OWNER, REPO = "Codertocat", "Hello-World"
FORGE_TOKEN = "compose-forge-token-8e1f0c"
GITHUB_SECRET = "compose-github-webhook-secret"
FLOWER_AUTH = ("operator", "compose-flower-password")
GATE = "second-answer"  # a held task's second answer waits here until its test has killed or stopped its worker
HOLD_MARK = r"\(held by the test: \d+\)"
TURNS = 5
MARKER = re.compile(r"\[tasuki-replay turn=(\d+)\]")
TEST_TIMINGS = {
    "TASUKI__CONTEXTS__HEARTBEAT_INTERVAL_S": "2",
    "TASUKI__CONTEXTS__STALE_AFTER_S": "8",
    "TASUKI__MONITOR__INTERVAL_S": "2",
}
POSTGRES_USER = POSTGRES_DB = "tasuki"  # docker-compose.yml's postgres service
FINISH_TIMEOUT_S = 600.0  # a deadline on a busy machine, not a timing
# Deadlines, not timings: a stack of eight containers on a busy 2-core machine took over 300 s to come up.
BUSY_DEADLINE_S = 600


@dataclass
class Fleet:
    stack: ComposeStack
    forge: FakeForge
    model: ReplayServer
    issues: Iterator[int]

    @property
    def contexts(self) -> Path:
        return self.stack.volume_path("tasuki-data") / "contexts"

    def new_issue(self, *, held: bool = False) -> int:
        """A new issue; a task on a ``held`` one waits for its second answer until ``release(number)``."""
        number = next(self.issues)
        title = f"add() is wrong ({number})" + (f" {hold_mark(number)}" if held else "")
        self.forge.add_item(OWNER, REPO, number, title, "The calc test fails.")
        return number

    def held(self, number: int) -> bool:
        """A task on issue ``number`` waits at the gate (its first tool result is on disk)."""
        return self.model.model.gate_reached(GATE, hold_mark(number))

    def release(self, number: int) -> None:
        """Let the held task on issue ``number`` (and its resumed self) have its answers."""
        self.model.model.open_gate(GATE, containing=hold_mark(number))

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
                return list(jsonl.iter_records(path))  # a line being written is not read
        return []

    def completed_state(self, uuid: str) -> dict[str, Any] | None:
        return final_state(self.contexts, uuid)

    def wait_finished(self, uuid: str) -> dict[str, Any]:
        state: dict[str, Any] = self.stack.wait(lambda: self.completed_state(uuid), FINISH_TIMEOUT_S,
                                                f"task {uuid} to finish")
        return state

    def holder_container(self, uuid: str) -> str:
        """The worker container whose process holds the context (by the PID namespace the lock records)."""
        lock = json.loads(self.running_file(uuid, ".lock").read_text())
        by_namespace = {self.stack.pid_namespace(c): c for c in self.stack.containers("worker")}
        container = by_namespace.get(lock["pid_namespace"])
        assert container, f"no worker container has the lock's PID namespace {lock['pid_namespace']}"
        return container

    def sql(self, query: str, *, password: str | None = None) -> list[list[str]]:
        """Rows of ``query`` in the fleet profile's database, by psql in the postgres container: on its socket
        (trusted there), or over TCP with ``password`` (every TCP connection needs one)."""
        tcp = ["-e", f"PGPASSWORD={password}", "postgres", "psql", "-h", "127.0.0.1"] if password is not None \
            else ["postgres", "psql"]
        done = self.stack.compose("exec", "-T", *tcp, "-U", POSTGRES_USER, "-d", POSTGRES_DB, "-v", "ON_ERROR_STOP=1",
                                  "-AtF", "\t", "-c", query)
        return [line.split("\t") for line in done.stdout.splitlines()]

    def answered_turns(self, uuid: str) -> list[int]:
        """The scripted model's answers in the context, in order (each once: no step repeated)."""
        return [int(n) for m in self.messages(uuid) if m["role"] == "assistant"
                for n in MARKER.findall(m.get("content") or "")]

    def first_step_after(self, uuid: str, moment: float) -> float:
        """Seconds from ``moment`` (a Unix time) to the first message written after it."""
        later = [datetime.fromisoformat(m["timestamp"]).timestamp() for m in self.messages(uuid)]
        return min(t for t in later if t > moment) - moment


def hold_mark(number: int) -> str:
    return f"(held by the test: {number})"


@contextmanager
def compose_fleet(root: Path, timings: Mapping[str, str], *, workers: int = 3, fleet_store: bool = False
                  ) -> Iterator[Fleet]:
    """Build the images (stand-ins once per machine), start the stack and its fakes; stop and remove it all.

    ``fleet_store``: with the ``fleet`` profile's PostgreSQL, set up as docker-compose.yml's top comment tells an
    operator (TASUKI_FLEET_STORE naming it, POSTGRES_PASSWORD and PGPASSWORD the same password).

    Raises :class:`tests.helpers.docker_host.DockerUnavailable` when no Docker engine can be had.
    """
    engine = docker_engine()
    build_images(engine)
    trajectory = fix_calc_trajectory()
    # The first answer proves the sandbox: in bubblewrap's PID namespace, process 1 is bwrap itself.
    trajectory[0]["tool_calls"][0]["arguments"]["command"] = "cat /proc/1/comm; python -m unittest -q"
    trajectory.insert(1, {"gate": GATE, "gate_when": HOLD_MARK})
    with model_server(trajectory) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        settings = {
            **timings,
            "TASUKI__LLM__PROVIDER": "openai",
            "TASUKI__LLM__OPENAI__BASE_URL": f"{model.url}/v1",
            "TASUKI__LLM__OPENAI__MODEL": "scripted",
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",  # the label of the published example payload
            "TASUKI__AGENT__FINISH_GATE": "false",  # the scripted task finishes once (the gate's own tests turn it on)
        }
        variables = {
            "GITHUB_TOKEN": FORGE_TOKEN,
            "OPENAI_API_KEY": "sk-compose-test-not-a-real-key",
            "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
            "FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH),
        }
        ports = Ports(free_port(), free_port(), free_port(), free_port() if fleet_store else None)
        if fleet_store:
            password = secrets.token_hex(16)
            variables.update({
                "TASUKI_FLEET_STORE": f"postgresql://{POSTGRES_USER}@127.0.0.1:{ports.postgres}/{POSTGRES_DB}",
                "POSTGRES_PASSWORD": password,
                "PGPASSWORD": password,
            })
        stack = ComposeStack(engine, root, ports, settings, variables, workers=workers,
                             profiles=("fleet",) if fleet_store else ())
        try:
            stack.up()
            yield Fleet(stack, forge, model, iter(range(100, 1000)))
        except BaseException:
            print(stack.logs(tail=100)[-6000:])  # what the services said, for whoever reads the failure
            raise
        finally:
            stack.down(volumes=True)


def assert_each_step_once(fleet: Fleet, uuid: str) -> None:
    """Every scripted model answer is in the context exactly once, in order: no step was repeated."""
    assert fleet.answered_turns(uuid) == list(range(TURNS))
    seqs = [m["seq"] for m in fleet.messages(uuid)]
    assert seqs == list(range(1, len(seqs) + 1))


def healthy_services(fleet: Fleet, timeout_s: float) -> list[str]:
    """Wait until every container of the stack is healthy; then the services' names, one per container, sorted."""
    seen: dict[str, str] = {}

    def all_healthy() -> dict[str, str] | None:
        health = fleet.stack.health()
        seen.clear()
        seen.update(health or {})
        return health if health and set(health.values()) == {"healthy"} else None

    try:
        health = fleet.stack.wait(all_healthy, timeout_s, "every container to be healthy")
    except AssertionError as exc:  # which one was not, first: the logs' tail may not say
        raise AssertionError(f"last health seen: {seen}\n{exc}") from None
    return sorted(re.sub(r"^tasukitest\w+?[-_]|[-_]\d+$", "", name) for name in health)


def submit_held(fleet: Fleet) -> tuple[int, str]:
    """A task submitted on a held issue, once it waits mid-task at the gate: its issue's number and its uuid."""
    number = fleet.new_issue(held=True)
    uuid = fleet.submit(number)
    fleet.stack.wait(lambda: fleet.held(number), FINISH_TIMEOUT_S, f"task {uuid} to be mid-task", logs_of="worker")
    return number, uuid


def resumed_after_its_container_dies(fleet: Fleet, number: int, uuid: str, how: str) -> None:
    """``docker kill`` (or ``restart -t 0``) the worker container holding a held task, release the task, and check
    that it completes on attempt 2 with no step repeated; prints how long until its next step."""
    container = fleet.holder_container(uuid)
    if how == "kill":
        fleet.stack.engine.docker("kill", container)
    else:  # the same container again: same hostname, a new PID namespace whose low pids are reused at once
        fleet.stack.engine.docker("restart", "-t", "0", container)
    died = time.time()
    fleet.release(number)

    state = fleet.wait_finished(uuid)
    assert state["status"] == "completed", state
    assert state["attempt"] == 2
    assert_each_step_once(fleet, uuid)
    print(f"{how}: {fleet.first_step_after(uuid, died):.1f} s from the container's death to the next step")
