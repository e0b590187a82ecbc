"""docker-compose.yml and the Dockerfile as data, and a service's command made runnable on this machine.

A test runs a service exactly as Compose would, except for what only exists in a container: paths under
``/data`` move to a temporary directory, published ports to free ones, ``0.0.0.0`` to the loopback.

    local = Localization(tmp_path, {5555: free_port()})
    argv = local.argv(service_argv("flower"))          # celery -A worker flower --port=... --db=...
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DATA_ROOT = "/data"


def load_compose() -> dict[str, Any]:
    """docker-compose.yml as YAML data (anchors and merge keys resolved, ``${VAR}`` left as written)."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def service(name: str) -> dict[str, Any]:
    """One service's definition."""
    definition: dict[str, Any] = load_compose()["services"][name]
    return definition


def dockerfile_instruction(keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == keyword.upper():
            found.append(rest.strip())
    return found


def _exec_form(instruction: str) -> list[str]:
    argv: list[str] = json.loads(instruction)
    return argv


def _unescape(text: str) -> str:
    """Compose's ``$$`` is a literal ``$`` in the container."""
    return text.replace("$$", "$")


def service_argv(name: str) -> list[str]:
    """The program and arguments a service's container runs: its (or the image's) entrypoint plus command."""
    definition = service(name)
    entrypoint = definition.get("entrypoint")
    if entrypoint is None:
        entrypoint = _exec_form(dockerfile_instruction("ENTRYPOINT")[-1]) if "build" in definition else []
    command = definition.get("command")
    if command is None:
        command = _exec_form(dockerfile_instruction("CMD")[-1])
    assert isinstance(entrypoint, list), f"{name}: write the entrypoint in exec (list) form"
    assert isinstance(command, list), f"{name}: write the command in exec (list) form"
    return [_unescape(str(part)) for part in [*entrypoint, *command]]


def healthcheck_argv(name: str) -> list[str]:
    """A service's healthcheck as a command line (``CMD-SHELL`` through ``sh -c``, as Docker runs it)."""
    test = service(name)["healthcheck"]["test"]
    kind, *rest = test
    if kind == "CMD-SHELL":
        return ["sh", "-c", _unescape(" ".join(rest))]
    assert kind == "CMD", f"{name}: healthcheck test starts with {kind!r}"
    return [_unescape(part) for part in rest]


def image_data_dirs() -> list[str]:
    """The directories under /data the image creates (``RUN mkdir -p ...``)."""
    return sorted({word for run in dockerfile_instruction("RUN") for word in shlex.split(run)
                   if word.startswith(f"{DATA_ROOT}/")})


@dataclass(frozen=True)
class Localization:
    """Where a container's ``/data``, published ports and bind-all address are on this machine."""

    data_root: Path
    ports: Mapping[int, int] = field(default_factory=dict)

    def text(self, text: str) -> str:
        text = text.replace(f"{DATA_ROOT}/", f"{self.data_root}/").replace("0.0.0.0", "127.0.0.1")
        for container_port, local_port in self.ports.items():
            text = re.sub(rf"(?<![\w.]){container_port}(?![\w.])", str(local_port), text)
        return text

    def argv(self, argv: Sequence[str]) -> list[str]:
        return [self.text(part) for part in argv]

    def make_image_dirs(self) -> None:
        """Create the image's /data directories here, with the image's mode."""
        for directory in image_data_dirs():
            Path(self.text(directory + "/")).mkdir(mode=0o700, parents=True, exist_ok=True)


def service_env(base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """``base`` plus ``extra``, with this interpreter's bin directory first on PATH (``celery``, ``tasuki``)."""
    env = {**base, **extra}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def run_healthcheck(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 30.0) -> int:
    """Run a healthcheck once, as Docker would; its exit code."""
    done = subprocess.run(list(argv), env=dict(env), cwd=REPO_ROOT, capture_output=True, timeout=timeout_s,
                          check=False)
    return done.returncode


def wait_healthy(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 60.0) -> None:
    """Run a healthcheck until it passes (Docker's retries), or fail with its last output."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = subprocess.run(list(argv), env=dict(env), cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"healthcheck {argv} still fails ({done.returncode}): {done.stderr[-2000:]}")
        time.sleep(0.2)  # the healthcheck's retry interval, bounded by the deadline
