"""The owner check on every effect (issue 26 §1) costs a task next to nothing: the same 40-step task — every step
a ``bash`` call that changes a file, so every step pushes a checkpoint — on a worker with fencing (an owner check
before each model call, tool run, push and forge call; pushes leased, the first checkpoint pushed at once, the final
push atomic) against a worker started with the switch off (``bench.unfenced_worker``: the code path from before,
plain ``--force`` pushes). Same Redis-per-round, same replay model, turns alternate. Target: at most 1.05.

The same pair again in fleet mode (``fleet.store`` on a PostgreSQL started for the run, a database per task): there
every push and forge write holds the task's lease row under its epoch and records the checkpoint it pushed (SPEC
§12), against the same fleet worker with the switch off. Target: at most 1.05 too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
import uuid as uuid_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Result, standalone
from bench.worker_stack import (
    CeleryWorker,
    client,
    local_request,
    private_redis,
    replay_model,
    send_run_task,
    tasuki_env,
    tiny_repo,
)
from tests.helpers.postgres import running_postgres

STEPS = 40
TARGET = 1.05
TIMEOUT_S = 600.0
LOG_LINE = "INFO something happened in module x while doing y with z"


def changing_task() -> list[dict[str, Any]]:
    """``STEPS`` bash steps that each add lines to a file (so each pushes a checkpoint), then ``finish``."""
    turns: list[dict[str, Any]] = []
    for step in range(STEPS):
        command = f'for n in $(seq 1 8); do echo "step {step} line $n: {LOG_LINE}" | tee -a log.txt; done'
        turns.append({"content": f"Step {step}.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
    return [*turns, {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Logged."}}]}]


def one_task(root: Path, module: str, **settings: str) -> tuple[float, dict[str, Any]]:
    """Seconds from send to the completed context on a worker run by ``python -m module`` (with ``settings`` in its
    environment), and the final state."""
    root.mkdir(parents=True)
    with private_redis(root / "redis") as url, replay_model(changing_task()) as model, client(url) as app:
        # It times fencing, not the sandbox.
        env = tasuki_env(root, url, model.url, TASUKI__SANDBOX__BACKEND="none", **settings)
        worker = CeleryWorker("worker", "bench", url, root / "worker.log", env, queues="tasks,compression",
                              module=module).start()
        try:
            uuid = str(uuid_module.uuid4())
            repo = tiny_repo(root / "repo")
            started = time.perf_counter()
            send_run_task(app, uuid, local_request(repo, "1"))
            state_path = root / "contexts" / "completed" / uuid / "state.json"
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                state = json.loads(state_path.read_text()) if state_path.exists() else {}
                if state.get("status") == "completed":
                    seconds = time.perf_counter() - started
                    pushed = subprocess.run(["git", "show", f"{state['result']['branch']}:log.txt"], cwd=repo,
                                            capture_output=True, text=True, check=True).stdout
                    if pushed.count("\n") != STEPS * 8:
                        raise RuntimeError("the benchmark task's branch lacks its work")
                    return seconds, state
                if state.get("status") in ("failed", "timeout", "cancelled"):
                    raise RuntimeError(f"the benchmark task ended {state['status']}: {state.get('error')}")
                time.sleep(0.02)
            raise RuntimeError(f"the benchmark task did not finish in {TIMEOUT_S:.0f} s")
        finally:
            worker.stop()


def compare(scratch: Path, rounds: int, label: str, settings: Callable[[], dict[str, str]]) -> Result:
    """Fenced vs unfenced, alternately (each side goes first in every other round), median of the rounds; each task
    gets ``settings()``."""
    fenced, unfenced = [], []
    for n in range(rounds):
        sides = [("fenced", "celery", fenced), ("unfenced", "bench.unfenced_worker", unfenced)]
        for name, module, times in sides if n % 2 == 0 else sides[::-1]:
            seconds, _state = one_task(scratch / f"{name}-{n}", module, **settings())
            times.append(seconds)
    ratio = statistics.median(fenced) / statistics.median(unfenced)
    print(f"{label}: {STEPS}-step task (a checkpoint push every step) with every effect fenced: "
          f"{statistics.median(fenced):.2f} s vs {statistics.median(unfenced):.2f} s without: {ratio:.3f}× "
          f"({rounds} rounds each)", flush=True)
    return Result(f"{STEPS}-step task fenced vs not ({label})", f"{ratio:.3f}", f"<= {TARGET}", ratio <= TARGET)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """One host, then fleet mode (a database of its own for every task)."""
    rounds = 1 if quick else 6
    results = [compare(scratch / "one-host", rounds, "one host", dict)]
    with running_postgres() as server:
        results.append(compare(scratch / "fleet", rounds, "fleet",
                               lambda: {"TASUKI__FLEET__STORE": server.dsn(server.create_database())}))
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
