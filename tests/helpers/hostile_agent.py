"""A hostile agent, driven as the worker drives the real one: each command through the real ``bash`` tool, in the
sandbox a worker makes (``make_sandbox``), with the task's home lasting across calls, in a process of its own that
runs as the worker's user (root, or an unprivileged user the tests make).

``python -m tests.helpers.hostile_agent SPEC`` reads a JSON file::

    {"checkout": "...", "home": "...", "commands": ["...", ...], "network": "full", "proxy": true,
     "allowed_internal": [], "remove_home": false, "timeout_s": 30}

and prints a JSON list: each command's tool output, then (with ``remove_home``) what ``layers.remove_home`` left.
The worker's environment carries a secret, as a real worker's does, so a test can look for it where it must not be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WORKER_SECRET = "sk-hostile-trial-worker-secret-0123456789"
REPOSITORY = Path(__file__).resolve().parents[2]


def main(spec_path: str) -> None:
    from sandbox import layers
    from sandbox.jail import make_sandbox
    from sandbox.settings import SandboxLimits, SandboxSettings

    spec = json.loads(Path(spec_path).read_text())
    internal = {"allowed_internal": spec["allowed_internal"]} if spec.get("allowed_internal") else {}
    limits = SandboxLimits(processes=spec.get("processes", SandboxLimits().processes))
    settings = SandboxSettings(network=spec.get("network", "full"), limits=limits, **internal)
    home = Path(spec["home"])
    if spec.get("proxy"):  # as the worker's run starts it (imported here: the rest runs on 8da9827's code too)
        from sandbox.egress import egress_policy, egress_proxy

        policy = egress_policy(settings.network, settings.allowed_hosts, settings.allowed_internal)
        with egress_proxy(policy, lambda _: None) as socket:
            outputs = _calls(spec, make_sandbox(settings).with_egress(socket), settings, home)
    else:
        outputs = _calls(spec, make_sandbox(settings), settings, home)
    if spec.get("remove_home"):
        outputs.append(list(layers.remove_home(home) or ()))  # before issue 36 it said nothing
    print(json.dumps(outputs))


def _calls(spec: dict[str, Any], sandbox: Any, settings: Any, home: Path) -> list[Any]:
    from agent.tools import Workspace, run_tool

    outputs: list[Any] = []
    for command in spec["commands"]:
        result = run_tool(
            Workspace(Path(spec["checkout"])),
            "bash",
            {"command": command},
            bash_timeout_s=int(spec.get("timeout_s", 30)),
            max_output_chars=50_000,
            sandbox=sandbox,
            limits=settings.limits,
            home=home,
        )
        outputs.append(result.output)
    return outputs


def run(
    checkout: Path,
    home: Path,
    commands: Sequence[str],
    *,
    user: str | None = None,
    remove_home: bool = False,
    network: str = "full",
    proxy: bool = False,
    allowed_internal: Sequence[str] = (),
    processes: int | None = None,
    timeout_s: float = 120,
) -> list[Any]:
    """Run ``commands`` as the hostile agent of a worker running as ``user`` (None: this process's user); the
    outputs. ``proxy``: behind the task's egress proxy, as a worker's run starts it for ``network``. A call that never
    returns fails the test at ``timeout_s`` (subprocess.TimeoutExpired)."""
    spec = {"checkout": str(checkout), "home": str(home), "commands": list(commands), "remove_home": remove_home,
            "network": network, "proxy": proxy, "allowed_internal": list(allowed_internal)}
    if processes is not None:
        spec["processes"] = processes
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp", delete=False) as handle:
        json.dump(spec, handle)
    os.chmod(handle.name, 0o644)
    try:
        argv, env = _interpreter(user)
        env["OPENAI_API_KEY"] = WORKER_SECRET  # what a worker's environment holds
        done = subprocess.run(
            [*argv, "-m", "tests.helpers.hostile_agent", handle.name],
            cwd=REPOSITORY,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    finally:
        os.unlink(handle.name)
    if done.returncode != 0:
        raise AssertionError(f"the hostile agent's worker failed: {done.stderr[-3000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _interpreter(user: str | None) -> tuple[list[str], dict[str, str]]:
    if user is None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONPATH": str(REPOSITORY)}
        return [sys.executable], env
    from tests.helpers.sandbox_users import as_user, python_as

    argv, env = python_as(user)
    return as_user(user, argv), dict(env)


if __name__ == "__main__":
    main(sys.argv[1])
