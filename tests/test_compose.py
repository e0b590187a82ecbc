"""docker-compose.yml and the Dockerfile (SPEC §12): scalable workers, one beat, healthchecks, no secrets.

The whole stack runs in containers in tests/test_compose_stack.py. Here, without Docker, every service command
is also run for real by a named test, which reads its command line from docker-compose.yml itself
(:data:`REAL_RUNS`); the file is validated with ``docker compose config`` (or Debian's ``docker-compose``)
when one is installed — always in CI.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from agent.settings import AgentSettings
from cli.services import TASK_QUEUES, Service, beat_argv, maintenance_argv, worker_processes
from contexts.masking import mask
from tests.helpers.ci import cannot_run
from tests.helpers.compose import (
    COMPOSE_FILE,
    DATA_ROOT,
    REPO_ROOT,
    Localization,
    dockerfile_instruction,
    healthcheck_argv,
    image_data_dirs,
    load_compose,
    service,
    service_argv,
    service_env,
    wait_healthy,
)
from tests.helpers.redis_server import free_port
from tests.helpers.stack import Stack
from worker.names import BEAT_LOCK_KEY
from worker.settings import SECRET_VARIABLES

# Each service built from this repository → the test that runs its command line, as Compose would, for real.
REAL_RUNS = {
    "worker": "tests/test_flower.py::test_flower_shows_the_run_task_under_its_context_uuid_with_name_and_state",
    "flower": "tests/test_flower.py::test_flower_shows_the_run_task_under_its_context_uuid_with_name_and_state",
    "beat": "tests/test_compose.py::test_beat_command_takes_the_schedule_lock_and_releases_it_on_stop",
    "webhook": "tests/test_compose.py::test_webhook_command_serves_healthz",
    "maintenance": "tests/test_compose.py::test_maintenance_command_serves_only_the_maintenance_queue",
}
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|AUTH")
SHUTDOWN_MARGIN_S = 15  # after the soft shutdown: cold shutdown, requeue, exit
COMPOSE = load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
TASUKI_SERVICES = sorted(name for name, definition in SERVICES.items() if "build" in definition)


def seconds(duration: str) -> float:
    """A Compose duration such as ``120s``, ``2m`` or ``1m30s`` in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, f"not a duration: {duration}"
    return sum(float(n) * units[u] for n, u in parts)


# -- the file ----------------------------------------------------------------------------------------


def test_the_stack_has_redis_workers_one_beat_webhook_flower_and_optional_ollama() -> None:
    assert set(SERVICES) == {"redis", "worker", "maintenance", "beat", "webhook", "flower", "ollama", "postgres"}
    assert TASUKI_SERVICES == ["beat", "flower", "maintenance", "webhook", "worker"]
    assert SERVICES["ollama"]["profiles"] == ["ollama"]
    assert SERVICES["postgres"]["profiles"] == ["fleet"]
    assert any(v.endswith(":/root/.ollama") for v in SERVICES["ollama"]["volumes"])
    assert "deploy" not in SERVICES["beat"]  # exactly one beat: no replicas
    assert "scale" not in SERVICES["beat"]


def test_worker_scales_with_no_fixed_name_hostname_or_published_port() -> None:
    worker = SERVICES["worker"]

    assert "container_name" not in worker
    assert "hostname" not in worker  # each replica's node name is tasuki@<its container id>
    assert "ports" not in worker
    argv = service_argv("worker")
    assert argv[argv.index("-n") + 1] == "tasuki@%h"


def test_every_service_has_a_healthcheck() -> None:
    for name, definition in SERVICES.items():
        test = definition.get("healthcheck", {}).get("test") or ["NONE"]
        assert test[0] in ("CMD", "CMD-SHELL"), name


def test_services_wait_for_a_healthy_redis_with_append_only_persistence() -> None:
    redis_service = SERVICES["redis"]

    assert redis_service["command"] == ["redis-server", "--appendonly", "yes"]
    volume = next(v for v in redis_service["volumes"] if v.endswith(":/data"))
    assert volume.split(":")[0] in COMPOSE["volumes"]  # a named volume, not the container's layer
    for name in TASUKI_SERVICES:
        assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert SERVICES[name]["environment"]["TASUKI__BROKER__URL"] == "redis://redis:6379/0", name


def test_one_container_fills_the_shared_data_volume_before_the_others_are_created() -> None:
    """Docker fills a fresh named volume from the image when a container first mounts it; several containers doing
    that at once can fail with "failed to mkdir ... file exists" (moby/moby#43068, seen in this suite's CI)."""
    sharing = [name for name, definition in SERVICES.items()
               if any(str(v).startswith("tasuki-data:") for v in definition.get("volumes", []))]
    first = [name for name in sharing if "maintenance" not in SERVICES[name].get("depends_on", {})]

    assert first == ["maintenance"]
    assert len(sharing) > 2


def test_worker_stop_waits_longer_than_the_soft_shutdown_hands_tasks_back() -> None:
    worker = SERVICES["worker"]
    grace = int(worker["environment"].get("TASUKI__AGENT__SHUTDOWN_GRACE_S", AgentSettings().shutdown_grace_s))

    assert worker["stop_signal"] == "SIGTERM"  # Celery's warm shutdown
    assert seconds(worker["stop_grace_period"]) >= grace + SHUTDOWN_MARGIN_S
    assert grace >= AgentSettings().shutdown_grace_s  # at least the default time a step gets to finish


def test_contexts_and_workspaces_live_on_a_volume_shared_by_worker_beat_and_webhook() -> None:
    for name in ("worker", "beat", "webhook"):
        env = SERVICES[name]["environment"]
        assert env["TASUKI__CONTEXTS__BASE_DIR"] == f"{DATA_ROOT}/contexts", name
        assert env["TASUKI__CONTEXTS__WORKSPACES_DIR"] == f"{DATA_ROOT}/workspaces", name
        assert f"tasuki-data:{DATA_ROOT}" in SERVICES[name]["volumes"], name
    assert "tasuki-data" in COMPOSE["volumes"]


def test_every_data_path_in_the_file_is_a_directory_the_image_creates() -> None:
    used = set(re.findall(rf"{DATA_ROOT}/[\w-]+", COMPOSE_FILE.read_text()))

    assert used
    assert used <= set(image_data_dirs())


def test_flower_takes_basic_auth_from_the_environment_and_keeps_state_on_a_volume() -> None:
    flower = SERVICES["flower"]
    argv = service_argv("flower")

    assert argv[:4] == ["celery", "-A", "worker", "flower"]
    assert not any("basic" in part and "auth" in part for part in argv)  # no password on a command line
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")  # refuses to start without
    assert "--persistent=True" in argv
    db = next(part.split("=", 1)[1] for part in argv if part.startswith("--db="))
    assert any(db.startswith(v.split(":")[1] + "/") for v in flower["volumes"] if v.split(":")[0] in COMPOSE["volumes"])


# -- images and secrets -------------------------------------------------------------------------------


def test_the_image_runs_as_the_unprivileged_tasuki_user() -> None:
    assert dockerfile_instruction("FROM") == ["python:3.11-slim"]
    assert dockerfile_instruction("USER")[-1] == "tasuki"
    assert any("--uid 10001" in run for run in dockerfile_instruction("RUN"))
    assert any('pip install ".[flower]"' in run for run in dockerfile_instruction("RUN"))
    for name, definition in SERVICES.items():
        assert str(definition.get("user", "tasuki")) not in ("root", "0", "0:0"), name


def test_the_build_context_leaves_out_secrets_history_and_local_state() -> None:
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())

    assert {".env", ".git", ".venv", "logs", "var", "tests", ".pytest_cache", ".mypy_cache"} <= ignored


def test_secrets_are_only_references_to_the_operators_environment() -> None:
    passed: set[str] = set()
    for name, definition in SERVICES.items():
        for key, value in definition.get("environment", {}).items():
            if key in SECRET_VARIABLES or SECRET_NAME.search(key):
                # ${NAME}, ${NAME:-} or ${NAME:?message}: never a value, never a default value
                assert re.fullmatch(rf"\$\{{{key}(:-|:\?[^}}]+)?\}}", str(value)), f"{name}: {key}={value}"
                passed.add(key)
    assert set(SECRET_VARIABLES) <= passed  # an operator can hand every secret to the service that needs it
    for name in ("beat", "flower"):  # neither runs tasks nor receives webhooks
        assert not set(SERVICES[name]["environment"]) & set(SECRET_VARIABLES), name


def test_no_token_shaped_string_is_written_in_the_file() -> None:
    text = COMPOSE_FILE.read_text()

    assert mask(text) == text


# -- the commands are Tasuki's and are run for real ---------------------------------------------------------


def test_worker_command_is_tasuki_worker_with_a_compression_worker_beside_the_task_worker() -> None:
    argv = service_argv("worker")
    assert argv[:2] == ["tasuki", "worker"]

    processes = dict(worker_processes(argv[2:], compression_concurrency=8))
    assert processes["worker"][processes["worker"].index("-Q") + 1] == "tasks"
    compression = processes["compression"]
    assert compression[compression.index("-Q") + 1] == "compression"
    assert compression[compression.index("-P") + 1] == "threads"
    assert compression[compression.index("-n") + 1] == "compression-tasuki@%h"
    # `tasuki up` starts the same pair
    assert [name for name, _ in worker_processes(["-Q", ",".join(TASK_QUEUES)], 8)] == ["worker", "compression"]


def test_maintenance_command_is_what_tasuki_up_runs() -> None:
    launcher = maintenance_argv(["--loglevel", "INFO"])

    assert service_argv("maintenance") == ["celery", *launcher[3:]]


def test_beat_command_is_what_tasuki_up_runs(tmp_path: Path) -> None:
    local = Localization(tmp_path)
    launcher = beat_argv(Path(local.text(f"{DATA_ROOT}/")), ["--loglevel", "INFO"])  # local.var_dir = /data

    assert launcher[:3] == [sys.executable, "-m", "celery"]
    assert local.argv(service_argv("beat")) == ["celery", *launcher[3:]]


def test_webhook_command_is_the_tasuki_webhook_subcommand() -> None:
    assert service_argv("webhook")[:2] == ["tasuki", "webhook"]
    assert dockerfile_instruction("ENTRYPOINT")[-1] == '["tasuki"]'


def _calls_service_argv(path: Path) -> set[str]:
    """The services whose command a test module takes from docker-compose.yml (``service_argv("x")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "service_argv" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_service_command_is_run_for_real_by_a_named_test() -> None:
    assert sorted(REAL_RUNS) == TASUKI_SERVICES
    for name, where in REAL_RUNS.items():
        file, test = where.split("::")
        path = REPO_ROOT / file
        assert test in _test_functions(path), f"{name}: no {where}"
        assert name in _calls_service_argv(path), f"{name}: {file} does not run the command from docker-compose.yml"


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    found = shutil.which("docker-compose")
    return [found] if found else None


@pytest.fixture
def compose_cli() -> list[str]:
    cli = _compose_cli()
    if cli is None:
        cannot_run("neither `docker compose` nor Debian's `docker-compose` is installed")
    return cli


def _compose_config(cli: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "empty.env"  # hermetic: not the operator's .env
    env_file.write_text("")
    environ = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"} | env
    return subprocess.run(
        [*cli, "--env-file", str(env_file), "-f", str(COMPOSE_FILE), "--profile", "ollama", "--profile", "fleet",
         "config", "-q"],
        cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=60, check=False,
    )


def test_docker_compose_accepts_the_file(compose_cli: list[str], tmp_path: Path) -> None:
    done = _compose_config(compose_cli, tmp_path, FLOWER_BASIC_AUTH="ci:validation")

    assert done.returncode == 0, done.stderr


def test_the_fleet_profile_gives_every_tasuki_service_the_fleet_store_and_its_password() -> None:
    postgres = SERVICES["postgres"]
    assert postgres["image"].startswith("pgvector/pgvector:")  # PostgreSQL with pgvector (fleet/schema.py needs it)
    assert "ports" not in postgres  # only the stack's services reach it
    assert any(v.split(":")[0] in COMPOSE["volumes"] for v in postgres["volumes"])
    for name in TASUKI_SERVICES:
        env = SERVICES[name]["environment"]
        assert env["TASUKI__FLEET__STORE"] == "${TASUKI_FLEET_STORE:-}", name  # empty without the profile: one host
        assert env["PGPASSWORD"] == "${PGPASSWORD:-}", name


def test_an_empty_fleet_store_is_one_host() -> None:
    from worker.settings_models import Settings

    assert Settings(fleet={"store": ""}).fleet.store is None


def test_docker_compose_refuses_to_start_flower_without_basic_auth(compose_cli: list[str], tmp_path: Path) -> None:
    done = _compose_config(compose_cli, tmp_path)

    assert done.returncode != 0
    assert "FLOWER_BASIC_AUTH" in done.stderr


# -- real runs of the commands no other test starts ----------------------------------------------------


@dataclass
class ServiceRunner:
    """Starts services from docker-compose.yml with a test's settings; stops them all afterwards."""

    root: Path
    env: dict[str, str]
    started: list[Service] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> Service:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child writes to it until it stops
        try:
            self.started.append(Service(name, argv, self.env, log).start())
        finally:
            log.close()
        return self.started[-1]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def runner(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[ServiceRunner]:
    stack = Stack(tmp_path, redis_url, "http://127.0.0.1:9")  # no model: these services never call one
    Localization(tmp_path).make_image_dirs()
    services = ServiceRunner(tmp_path, service_env(stack.env()))
    yield services
    for started in services.started:
        started.stop()


@pytest.mark.integration
def test_beat_command_takes_the_schedule_lock_and_releases_it_on_stop(
    tmp_path: Path, runner: ServiceRunner, redis_client: redis.Redis
) -> None:
    local = Localization(tmp_path)

    beat = runner.start("beat", local.argv(service_argv("beat")))
    wait_healthy(local.argv(healthcheck_argv("beat")), runner.env)
    held = _wait_for(lambda: redis_client.exists(BEAT_LOCK_KEY), beat)
    beat.stop()

    assert held, f"the only beat did not take the schedule lock:\n{runner.log('beat')}"
    assert beat.process is not None
    assert beat.process.returncode == 0, runner.log("beat")
    assert not redis_client.exists(BEAT_LOCK_KEY)  # a clean stop hands the schedule over at once


def _wait_for(probe: Callable[[], object], process: Service, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.alive():
        if probe():
            return True
        time.sleep(0.05)  # polling interval, bounded by the deadline
    return False


@pytest.mark.integration
def test_webhook_command_serves_healthz(tmp_path: Path, runner: ServiceRunner) -> None:
    port = free_port()
    local = Localization(tmp_path, {int(service("webhook")["ports"][0].split(":")[-1]): port})

    runner.start("webhook", local.argv(service_argv("webhook")))
    wait_healthy(local.argv(healthcheck_argv("webhook")), runner.env)

    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200


@pytest.mark.integration
def test_maintenance_command_serves_only_the_maintenance_queue(tmp_path: Path, runner: ServiceRunner) -> None:
    from tests.helpers.celery_worker import wait_for_ping

    local = Localization(tmp_path)
    started = runner.start("maintenance", local.argv(service_argv("maintenance")))
    assert started.process is not None
    wait_for_ping(runner.env["TASUKI__BROKER__URL"], "maintenance@", started.process, tmp_path / "maintenance.log")

    banner = runner.log("maintenance")
    assert ".> maintenance " in banner
    assert ".> tasks " not in banner
    assert ".> compression " not in banner


def test_the_image_holds_every_package_the_project_installs() -> None:
    # A package left out of the image makes every service fail to start (`celery -A worker` cannot import it).
    include = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {pattern.rstrip("*") for pattern in include["include"]}
    copied = {line.split()[0] for line in dockerfile_instruction("COPY")}
    stubbed = next(run for run in dockerfile_instruction("RUN") if "for package in" in run)

    assert packages <= copied
    assert all(f" {package} " in stubbed for package in packages)
