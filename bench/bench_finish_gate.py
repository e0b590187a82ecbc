"""The finish gate's time against the task's (issue 38 item 5): one bug-fix task on ``tasuki worker -c 1`` with the
gate on (the default) and the same task with it off, alternately, in the sandbox the worker is configured with.

The repository is the calc project with its check declared in ``.tasuki/checks`` (``python3 -m unittest -q``). The
scripted model runs the tests, reads the file, fixes it, runs the tests again and finishes; with the gate on, the
first finish gets the review (the diff, the check run in the sandbox) and the model finishes again. Each model
answer takes ``MODEL_S`` (a fast hosted model's step; an instant model would make the task nothing but overhead).
The gate's time is what ``tools.jsonl`` records for the finish calls (the gate's commands are part of them); the
task's is send -> completed context. Printed: the gate's share of the gated task, and the gated task against the
ungated one.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
import uuid as uuid_module
from pathlib import Path
from typing import Any

from bench.common import Result, standalone
from bench.worker_stack import (
    GIT_IDENTITY,
    CeleryWorker,
    client,
    local_request,
    private_redis,
    replay_model,
    send_run_task,
    tasuki_env,
)

MODEL_S = 2.0
TIMEOUT_S = 300.0
CHECK = "python3 -m unittest -q"
CALC = "def add(a, b):\n    return a - b\n"
TEST = ("import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")


def _turn(content: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"delay_s": MODEL_S, "content": content, "tool_calls": [{"name": name, "arguments": arguments}]}


TRAJECTORY = [
    _turn("Run the tests.", "bash", command=CHECK),
    _turn("Read the code.", "read_file", path="calc.py"),
    _turn("add subtracts.", "edit_file", path="calc.py", old_string="return a - b", new_string="return a + b"),
    _turn("Again.", "bash", command=CHECK),
    _turn("Done.", "finish", summary="Fix add(): it subtracted."),
    _turn("The review agrees.", "finish", summary="Fix add(): it subtracted."),  # only reached with the gate on
]


def checked_repo(path: Path) -> Path:
    """The calc project with a failing test and its check in ``.tasuki/checks``."""
    (path / ".tasuki").mkdir(parents=True)
    (path / "calc.py").write_text(CALC)
    (path / "test_calc.py").write_text(TEST)
    (path / ".tasuki" / "checks").write_text(f"{CHECK}\n")
    env = {**GIT_IDENTITY, "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(path)}
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "calc")):
        subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True)
    return path


def one_task(root: Path, gate: bool) -> tuple[float, float, int]:
    """Seconds from send to the completed context, the finish calls' recorded seconds, and the model calls."""
    root.mkdir(parents=True)
    with private_redis(root / "redis") as url, replay_model(TRAJECTORY) as model, client(url) as app:
        env = tasuki_env(root, url, model.url, TASUKI__AGENT__FINISH_GATE=str(gate).lower())
        worker = CeleryWorker("worker", "bench", url, root / "worker.log", env, queues="tasks,compression",
                              tasuki=True).start()
        try:
            uuid = str(uuid_module.uuid4())
            started = time.perf_counter()
            send_run_task(app, uuid, local_request(checked_repo(root / "calc"), "1"))
            done = root / "contexts" / "completed" / uuid
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                state = json.loads((done / "state.json").read_text()) if (done / "state.json").exists() else {}
                if state.get("status") == "completed":
                    seconds = time.perf_counter() - started
                    tools = [json.loads(line) for line in (done / "tools.jsonl").read_text().splitlines()]
                    finishing = sum(int(t.get("duration_ms") or 0) for t in tools if t.get("tool_name") == "finish")
                    return seconds, finishing / 1000, int(state.get("llm_call_count", 0))
                if state.get("status") in ("failed", "timeout", "cancelled"):
                    raise RuntimeError(f"the benchmark task ended {state['status']}: {state.get('error')}")
                time.sleep(0.05)
            raise RuntimeError(f"the benchmark task did not finish in {TIMEOUT_S:.0f} s")
        finally:
            worker.stop()


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Gate on vs off, alternately; medians of the rounds."""
    rounds = 1 if quick else 3
    gated, plain, gate_s, calls = [], [], [], []
    for n in range(rounds):
        seconds, finishing, steps = one_task(scratch / f"on-{n}", True)
        gated.append(seconds)
        gate_s.append(finishing)
        calls.append(steps)
        plain.append(one_task(scratch / f"off-{n}", False)[0])
    share = statistics.median(gate_s) / statistics.median(gated)
    ratio = statistics.median(gated) / statistics.median(plain)
    print(f"bug-fix task ({statistics.median(calls):.0f} model calls of {MODEL_S:.0f} s) on `tasuki worker -c 1`: "
          f"{statistics.median(gated):.1f} s with the gate (the gate: {statistics.median(gate_s):.2f} s, "
          f"{share:.3f} of the task) vs {statistics.median(plain):.1f} s without: {ratio:.2f}x", flush=True)
    return [
        Result("finish gate: its time / the task's", f"{share:.3f}", "<= 0.1", share <= 0.1),
        Result("finish gate: task with / without", f"{ratio:.2f}", "—", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
