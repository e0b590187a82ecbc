"""The project's docker-compose.yml, run for real with a test override for host networking.

No bridge network and no published port may exist on these machines, so every container shares the host's
network: the override moves Redis, the webhook intake and Flower to free loopback ports, points the
services at them, gives the healthchecks short intervals (their commands stay the project's, with the ports
changed), and sets test timings. Everything else — images, volumes, the worker's command, stop signals and
grace periods, the sandbox's security options — is the project's file as an operator runs it.

With host networking every worker replica has the host's hostname, so each gets a node name of its own
(``tasuki@HOST-xxxxxxxx``, written to /tmp/celery-node for its healthcheck): two Celery workers with one
name would share one control queue.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid as uuid_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.docker_host import PROJECT_IMAGE, REPO_ROOT, Engine

# Each check of a worker is a `celery inspect ping` process: every 2 s in eight containers loaded 2 cores by itself, and
# at load 40-80 a ping took up to 98 s (CI runs with other work beside them timed out at 20 s).
HEALTHCHECK_INTERVAL = {"interval": "3s", "timeout": "60s", "retries": 10, "start_period": "5s"}
UNIQUE_NODE = (
    'node="tasuki@$$(hostname)-$$(head -c 8 /proc/sys/kernel/random/uuid)"; echo "$$node" > /tmp/celery-node; '
    'exec tasuki "$$@" -n "$$node"'
)
PING_OWN_NODE = 'celery -A worker inspect ping -d "$$(cat /tmp/celery-node)" -t 10'


@dataclass(frozen=True)
class Ports:
    redis: int
    webhook: int
    flower: int
    postgres: int | None = None  # the fleet profile's PostgreSQL (with ``profiles=("fleet",)``)


def override(ports: Ports, settings: Mapping[str, str]) -> dict[str, Any]:
    """The test override: host networking, loopback ports, short healthcheck intervals, test settings."""
    broker = f"redis://127.0.0.1:{ports.redis}/0"
    env = {"TASUKI__BROKER__URL": broker, **settings}
    tasuki = {"network_mode": "host", "environment": env}
    # The fleet profile's PostgreSQL on a loopback port of its own (the host may run one on 5432): PGPORT moves
    # the server and its healthcheck's pg_isready alike, so the healthcheck's command stays the project's.
    postgres = ({"postgres": {"network_mode": "host", "environment": {"PGPORT": str(ports.postgres)},
                              "healthcheck": HEALTHCHECK_INTERVAL}}
                if ports.postgres is not None else {})
    return {
        "services": {
            **postgres,
            "redis": {
                "network_mode": "host",
                "command": ["redis-server", "--appendonly", "yes", "--port", str(ports.redis), "--bind", "127.0.0.1"],
                "healthcheck": {"test": ["CMD-SHELL", f"redis-cli -p {ports.redis} ping | grep -q PONG"],
                                **HEALTHCHECK_INTERVAL},
            },
            "worker": {
                **tasuki,
                "entrypoint": ["sh", "-c", UNIQUE_NODE, "tasuki"],
                "healthcheck": {"test": ["CMD-SHELL", PING_OWN_NODE], **HEALTHCHECK_INTERVAL},
            },
            "maintenance": {**tasuki, "healthcheck": HEALTHCHECK_INTERVAL},
            "beat": {**tasuki, "healthcheck": HEALTHCHECK_INTERVAL},
            "webhook": {
                **tasuki,
                "command": ["webhook", "--host", "127.0.0.1", "--port", str(ports.webhook)],
                "healthcheck": {
                    "test": ["CMD", "python", "-c", "import urllib.request; urllib.request.urlopen("
                             f"'http://127.0.0.1:{ports.webhook}/healthz', timeout=5)"],
                    **HEALTHCHECK_INTERVAL,
                },
            },
            "flower": {
                **tasuki,
                "command": ["flower", f"--port={ports.flower}", "--address=127.0.0.1", "--persistent=True",
                            "--db=/data/flower/flower.db"],
                "healthcheck": {
                    "test": ["CMD", "python", "-c", "import urllib.request; urllib.request.urlopen("
                             f"'http://127.0.0.1:{ports.flower}/healthcheck', timeout=5)"],
                    **HEALTHCHECK_INTERVAL,
                },
            },
        }
    }


@dataclass
class ComposeStack:
    """One compose project of this repository's docker-compose.yml plus the test override."""

    engine: Engine
    workdir: Path
    ports: Ports
    settings: Mapping[str, str]
    variables: Mapping[str, str]  # the operator's shell or .env: secrets and FLOWER_BASIC_AUTH
    workers: int = 3
    profiles: tuple[str, ...] = ()  # ``--profile`` on every compose command, as the operator gives it
    project: str = field(default_factory=lambda: f"tasukitest{uuid_module.uuid4().hex[:8]}")

    @property
    def override_file(self) -> Path:
        return self.workdir / "docker-compose.host-network.yml"

    @property
    def resolved_file(self) -> Path:
        return self.workdir / "docker-compose.resolved.yml"

    def _run(self, files: list[Path], args: tuple[str, ...], timeout_s: float, check: bool
             ) -> subprocess.CompletedProcess[str]:
        argv = [*self.engine.compose, "--project-directory", str(REPO_ROOT), "-p", self.project]
        for profile in self.profiles:
            argv += ["--profile", profile]
        for file in files:
            argv += ["-f", str(file)]
        env = {**os.environ, "TASUKI_IMAGE": PROJECT_IMAGE, **self.variables}  # this checkout's image, no other's
        done = subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
                              cwd=self.workdir)
        if check and done.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def resolve(self) -> None:
        """Compose merges the project's file with the override; published ports go, as host networking has none.

        (Docker discards them itself; Debian's docker-compose 1.x refuses the combination instead, and a
        Compose override can add list entries but not remove them.)
        """
        self.override_file.write_text(yaml.safe_dump(override(self.ports, self.settings), sort_keys=False))
        merged = self._run([REPO_ROOT / "docker-compose.yml", self.override_file], ("config",), 120, True)
        config = yaml.safe_load(merged.stdout)
        for definition in config["services"].values():
            if definition.get("network_mode") == "host":
                definition.pop("ports", None)
        self.resolved_file.write_text(yaml.safe_dump(config, sort_keys=False))

    def compose(self, *args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        if not self.resolved_file.exists():
            self.resolve()
        return self._run([self.resolved_file], args, timeout_s, check)

    def up(self) -> None:
        """Start the stack without building (the images were built beforehand, with host networking)."""
        self.compose("up", "-d", "--no-build", "--scale", f"worker={self.workers}", timeout_s=900)

    def down(self, *, volumes: bool = False) -> None:
        self.compose("down", *(["-v"] if volumes else []), timeout_s=900)

    def containers(self, service: str | None = None) -> list[str]:
        """Ids of this project's containers (of one service), running or not."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        listed = self.engine.docker("ps", "-aq", "--no-trunc", *filters)
        return listed.stdout.split()

    def inspect(self, container: str) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(self.engine.docker("inspect", container).stdout)
        return data[0]

    def health(self) -> dict[str, str]:
        """Each container's name → its health status (``healthy``, ``starting``, ``unhealthy``, or its state)."""
        found = {}
        for container in self.containers():
            info = self.inspect(container)
            state = info["State"]
            found[info["Name"].lstrip("/")] = state.get("Health", {}).get("Status") or state["Status"]
        return found

    def pid_namespace(self, container: str) -> str | None:
        """The PID namespace of a running container (``pid:[…]``, as a lock records it), from its init's pid."""
        pid = self.inspect(container)["State"]["Pid"]
        if not pid:
            return None
        try:
            return os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            return None

    def volume_path(self, volume: str) -> Path:
        """Where a named volume of this project lives on the host."""
        shown = self.engine.docker("volume", "inspect", "-f", "{{.Mountpoint}}", f"{self.project}_{volume}")
        return Path(shown.stdout.strip())

    def logs(self, service: str | None = None, tail: int = 200) -> str:
        done = self.compose("logs", "--no-color", "--tail", str(tail), *([service] if service else []), check=False)
        return str(done.stdout) + str(done.stderr)

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str, *, logs_of: str | None = None) -> Any:
        """Poll ``predicate`` until it returns something true; on time-out fail with the services' logs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.logs(logs_of)[-8000:]}")

