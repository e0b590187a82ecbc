"""Compression in a busy fleet: a 40-step task whose small window forces about a dozen compressions, on
``tasuki worker --concurrency 1`` (its one task process busy with the task itself), against the same task
with a window large enough that it never compresses, on the same command. Issue 13 measured 33.6 times before
``tasuki worker`` brought a compression worker of its own (each compression waited 30 s for a free task
process, then ran inline); the target is at most 2 times.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid as uuid_module
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

STEPS = 40
SMALL_WINDOW = 3000
LARGE_WINDOW = 128000
LOG_LINE = "INFO something happened in module x while doing y with z"
TIMEOUT_S = 600.0


def long_task() -> list[dict[str, Any]]:
    """``STEPS`` bash steps of about 300 tokens of output each, then ``finish``."""
    turns: list[dict[str, Any]] = []
    for step in range(STEPS):
        command = f'for n in $(seq 1 16); do echo "step {step} line $n: {LOG_LINE}"; done'
        turns.append({"content": f"Step {step}.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
    return [*turns, {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Done."}}]}]


def one_task(root: Path, context_length: int, **extra_env: str) -> tuple[float, dict[str, Any]]:
    """Seconds from send to the completed context, and its final state (``extra_env``: more settings)."""
    root.mkdir(parents=True)
    with private_redis(root / "redis") as url, replay_model(long_task()) as model, client(url) as app:
        env = tasuki_env(root, url, model.url, TASUKI__LLM__OPENAI__CONTEXT_LENGTH=str(context_length),
                         TASUKI__COMPRESSION__MIN_MESSAGES="6", TASUKI__COMPRESSION__KEEP_RECENT="3",
                         TASUKI__SANDBOX__BACKEND="none", **extra_env)  # it times compression, not the sandbox
        worker = CeleryWorker("worker", "bench", url, root / "worker.log", env, queues="tasks,compression",
                              tasuki=True).start()
        try:
            uuid = str(uuid_module.uuid4())
            started = time.perf_counter()
            send_run_task(app, uuid, local_request(tiny_repo(root / "repo"), "1"))
            state_path = root / "contexts" / "completed" / uuid / "state.json"
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                state = json.loads(state_path.read_text()) if state_path.exists() else {}
                if state.get("status") == "completed":
                    return time.perf_counter() - started, state
                if state.get("status") in ("failed", "timeout", "cancelled"):
                    raise RuntimeError(f"the benchmark task ended {state['status']}: {state.get('error')}")
                time.sleep(0.05)
            raise RuntimeError(f"the benchmark task did not finish in {TIMEOUT_S:.0f} s")
        finally:
            worker.stop()


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Compressing vs not, alternately, median of the rounds."""
    rounds = 1 if quick else 3
    compressing, plain, counts = [], [], []
    for n in range(rounds):
        seconds, state = one_task(scratch / f"small-{n}", SMALL_WINDOW)
        compressing.append(seconds)
        counts.append(int(state.get("compression_count", 0)))
        seconds, _ = one_task(scratch / f"large-{n}", LARGE_WINDOW)
        plain.append(seconds)
    ratio = statistics.median(compressing) / statistics.median(plain)
    print(f"40-step task on `tasuki worker -c 1`: {statistics.median(compressing):.1f} s with "
          f"{statistics.median(counts):.0f} compressions vs {statistics.median(plain):.1f} s without: {ratio:.2f}×",
          flush=True)
    return [Result("compression on a busy worker vs none", f"{ratio:.2f}", "<= 2", ratio <= 2)]


if __name__ == "__main__":
    standalone(run, __doc__)
