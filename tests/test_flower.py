"""Flower against a real worker, both started with docker-compose.yml's own commands, and its HTTP API read.

One deployment for the module: Redis, the scripted model, ``celery -A worker flower`` and
``celery -A worker worker`` as Compose runs them, and one task submitted with ``tasuki submit``.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import redis

from cli.services import Service
from tests.helpers.celery_worker import wait_for_ping
from tests.helpers.compose import (
    Localization,
    healthcheck_argv,
    run_healthcheck,
    service_argv,
    service_env,
    wait_healthy,
)
from tests.helpers.flower import FlowerClient
from tests.helpers.model_server import model_server
from tests.helpers.redis_server import CLAIM_KEY, free_port
from tests.helpers.stack import Stack, fix_calc_trajectory, make_buggy_repo
from worker.names import KEY_PREFIX, RUN_TASK

pytestmark = pytest.mark.integration

SECRETS = {
    "OPENAI_API_KEY": "sk-test-" + secrets.token_hex(16),
    "GITHUB_TOKEN": "ghp_" + secrets.token_hex(18),
}
USER, PASSWORD = "operator", "pw-" + secrets.token_hex(8)
FLOWER_PORT = 5555  # the container port in docker-compose.yml


@dataclass
class Deployment:
    """The processes of the module's deployment and what it ran."""

    stack: Stack
    env: dict[str, str]
    local: Localization
    client: FlowerClient
    flower: Service | None = None
    worker: Service | None = None
    uuid: str = ""
    wrong_worker_check: subprocess.Popen[bytes] | None = None

    @property
    def worker_name(self) -> str:
        return f"tasuki@{socket.gethostname()}"  # Celery's %h

    def start_flower(self) -> Service:
        # Compose's command; only the listening address differs (the container listens on all interfaces).
        argv = [*self.local.argv(service_argv("flower")), "--address=127.0.0.1"]
        self.flower = _start("flower", argv, self.env, self.stack.root)
        wait_healthy(self.local.argv(healthcheck_argv("flower")), self.env)
        return self.flower

    def start_worker(self) -> Service:
        self.worker = _start("worker", self.local.argv(service_argv("worker")), self.env, self.stack.root)
        assert self.worker.process is not None
        wait_for_ping(self.stack.redis_url, self.worker_name, self.worker.process, self.stack.root / "worker.log")
        return self.worker

    def stop(self) -> None:
        for service in (self.flower, self.worker):
            if service is not None:
                service.stop()


def _start(name: str, argv: list[str], env: dict[str, str], root: Path) -> Service:
    log: IO[bytes] = open(root / f"{name}.log", "ab")  # noqa: SIM115 - the child writes to it until it stops
    try:
        return Service(name, argv, env, log).start()
    finally:
        log.close()  # the child holds its own descriptor


def _submit(env: dict[str, str], repo: Path) -> str:
    """``tasuki submit`` as an operator types it; prints the new task's UUID."""
    done = subprocess.run(
        ["tasuki", "submit", "--repo-path", str(repo), "--prompt", "Make the tests pass.", "--user", "tester"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _delete_task_keys(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        doomed = [key for key in client.scan_iter(match=f"{KEY_PREFIX}*") if key != CLAIM_KEY]
        if doomed:
            client.delete(*doomed)
    finally:
        client.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("compose")
    with model_server(fix_calc_trajectory()) as model:
        stack = Stack(root, redis_url, model.url, env_overrides=dict(SECRETS))
        local = Localization(root, {FLOWER_PORT: free_port()})
        local.make_image_dirs()
        env = service_env(stack.env(), FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}")
        client = FlowerClient(f"http://127.0.0.1:{local.ports[FLOWER_PORT]}", USER, PASSWORD)
        d = Deployment(stack, env, local, client)
        try:
            flower = d.start_flower()
            d.start_worker()
            client.wait_until(lambda: client.worker_online(d.worker_name), "the worker's events", flower)
            # Runs while the task does: a node that does not exist never answers the worker's healthcheck.
            d.wrong_worker_check = subprocess.Popen(
                healthcheck_argv("worker"), env={**env, "HOSTNAME": "no-such-host"},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            d.uuid = _submit(env, make_buggy_repo(root / "repo"))
            state = stack.wait_finished(d.uuid, timeout_s=60)
            assert state["status"] == "completed", state
            client.wait_until(lambda: client.task_info(d.uuid, "SUCCESS"), "the task's success", flower)
            yield d
        finally:
            d.stop()
            if d.wrong_worker_check is not None and d.wrong_worker_check.poll() is None:
                d.wrong_worker_check.kill()
            _delete_task_keys(redis_url)


def test_flower_shows_the_run_task_under_its_context_uuid_with_name_and_state(deployment: Deployment) -> None:
    uuid, client = deployment.uuid, deployment.client

    info = client.json(f"/api/task/info/{uuid}")
    listed = client.json("/api/tasks", taskname=RUN_TASK)

    assert info["name"] == RUN_TASK
    assert info["state"] == "SUCCESS"
    assert info["worker"] == deployment.worker_name
    assert uuid in info["args"]  # the first argument is the context UUID, which is also the task id
    assert "'status': 'completed'" in info["result"]
    assert listed[uuid]["name"] == RUN_TASK
    assert listed[uuid]["state"] == "SUCCESS"
    assert (deployment.stack.contexts_dir / "completed" / uuid / "state.json").is_file()


def test_flower_refuses_the_api_without_the_basic_auth_from_the_environment(deployment: Deployment) -> None:
    client = deployment.client

    assert client.get("/api/tasks", auth=None).status_code == 401
    assert client.get("/api/tasks", auth=(USER, "wrong")).status_code == 401
    assert client.get("/api/tasks").status_code == 200
    assert deployment.flower is not None
    assert not any(PASSWORD in part for part in deployment.flower.argv)  # Flower read FLOWER_BASIC_AUTH


def test_no_secret_from_the_worker_environment_appears_in_any_flower_answer(deployment: Deployment) -> None:
    client, uuid = deployment.client, deployment.uuid
    for path in ("/api/tasks", f"/api/task/info/{uuid}", "/api/task/types", "/api/queues/length",
                 f"/task/{uuid}", "/tasks", "/metrics"):
        assert client.get(path).status_code == 200, path
    assert client.get("/api/workers", refresh="1").status_code == 200  # asks the worker: stats, conf, queues

    seen = "\n".join(client.bodies)
    assert uuid in seen  # the answers are about the task
    for name, value in SECRETS.items():
        assert deployment.env[name] == value  # the worker ran with it
        assert value not in seen, name
        assert value[-16:] not in seen, f"part of {name}"


def test_worker_and_flower_healthchecks_pass_and_fail_for_a_missing_worker(deployment: Deployment) -> None:
    env = {**deployment.env, "HOSTNAME": socket.gethostname()}  # Docker sets HOSTNAME in the container

    assert run_healthcheck(healthcheck_argv("worker"), env) == 0
    assert run_healthcheck(deployment.local.argv(healthcheck_argv("flower")), env) == 0
    assert deployment.wrong_worker_check is not None
    assert deployment.wrong_worker_check.wait(timeout=30) != 0


def test_flower_keeps_finished_tasks_across_a_restart(deployment: Deployment) -> None:
    db = Path(deployment.local.text("/data/flower/flower.db"))

    flower = deployment.flower
    assert flower is not None
    assert flower.process is not None
    flower.stop()
    assert flower.process.returncode == 0
    assert list(db.parent.glob(f"{db.name}*")), "flower wrote no state file"
    deployment.start_flower()

    info = deployment.client.task_info(deployment.uuid, "SUCCESS")
    assert info is not None
    assert info["name"] == RUN_TASK
