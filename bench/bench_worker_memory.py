"""Peak memory of the worker process that runs a 1,000-step task, against one that runs a 10-step task.

Each task runs in a fresh ``celery worker`` (prefork, one pool process) with a small context window, so the
long task compresses many times; its pool process's ``VmHWM`` (peak resident set) is read when the task is
done.  Memory that grows with the history (a prompt built from every message, records kept in memory)
shows up as a ratio well above 1.
"""

from __future__ import annotations

import json
import uuid as uuid_module
from pathlib import Path
from typing import Any

from bench.common import Result, standalone
from bench.worker_stack import (
    CeleryWorker,
    client,
    local_request,
    private_redis,
    proc_status_kb,
    replay_model,
    send_run_task,
    tasuki_env,
    tiny_repo,
)

TARGET = 1.25
CONTEXT_LENGTH = 16384
RESULT_TIMEOUT_S = 1800.0
OUTPUT_LINES = 8  # about 400 bytes of tool output per step


def trajectory(steps: int) -> list[dict[str, Any]]:
    """``steps`` bash calls, each printing a few distinct lines, then ``finish``."""
    turns: list[dict[str, Any]] = []
    for step in range(steps):
        command = f'for n in $(seq 1 {OUTPUT_LINES}); do echo "step {step} line $n: building and testing"; done'
        turns.append({"content": f"Step {step}.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
    turns.append({"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "All steps run."}}]})
    return turns


def peak_kb(scratch: Path, steps: int) -> tuple[int, dict[str, Any]]:
    """VmHWM (KiB) of the pool process that ran a ``steps``-step task, and the task's final state."""
    root = scratch / f"steps-{steps}"
    root.mkdir(parents=True)
    repo = tiny_repo(root / "repo")
    with private_redis(root / "redis") as redis_url, replay_model(trajectory(steps)) as model:
        env = tasuki_env(
            root,
            redis_url,
            model.url,
            TASUKI__LLM__OPENAI__CONTEXT_LENGTH=str(CONTEXT_LENGTH),
            TASUKI__AGENT__MAX_STEPS=str(steps + 10),
            TASUKI__COMPRESSION__START_TIMEOUT_S="0.2",  # one pool process: it summarizes in place
        )
        worker = CeleryWorker("worker", "memory", redis_url, root / "worker.log", env, concurrency=1).start()
        try:
            (pool,) = worker.pool_processes()
            with client(redis_url) as app:
                uuid = str(uuid_module.uuid4())
                outcome = send_run_task(app, uuid, local_request(repo, "1")).get(timeout=RESULT_TIMEOUT_S)
            if outcome.get("status") != "completed":
                raise RuntimeError(f"the {steps}-step task ended {outcome.get('status')}: {outcome}")
            peak = proc_status_kb(pool, "VmHWM")
        finally:
            worker.stop()
    state = json.loads((root / "contexts" / "completed" / uuid / "state.json").read_text())
    return peak, state


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure both tasks, print one line, return the result."""
    short_steps, long_steps = 10, 200 if quick else 1000
    own = scratch / "worker-memory"
    short_kb, _ = peak_kb(own, short_steps)
    long_kb, state = peak_kb(own, long_steps)
    ratio = long_kb / short_kb
    name = f"worker peak memory {long_steps}/{short_steps} steps"
    result = Result(name, f"{ratio:.2f}", f"<= {TARGET}", ratio <= TARGET)
    print(
        f"worker memory  {long_steps} steps {long_kb / 1024:,.1f} MiB  {short_steps} steps {short_kb / 1024:,.1f} MiB  "
        f"ratio {ratio:.2f}  target <= {TARGET}  {result.verdict}  "
        f"(VmHWM of the pool process; the long task compressed {state['compression_count']} times, "
        f"context_length {CONTEXT_LENGTH})",
        flush=True,
    )
    return [result]


if __name__ == "__main__":
    standalone(run, __doc__)
