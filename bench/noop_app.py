"""Throughput baselines: a bare Celery app with Tasuki's delivery settings and two tasks.

``bench.noop`` does nothing; ``bench.git_roundtrip`` does the work no task can skip — clone (or, after the
first task of a process, refresh the clone it keeps), one chat request to the model on a kept HTTP client, push
a branch — without any of Tasuki's bookkeeping.
``celery -A bench.noop_app -b URL --result-backend URL worker -Q noop``; late acks and one prefetched
message per process, like Tasuki's worker, so the baselines pay for the same broker round trips.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
from celery import Celery

from contexts import ContextStore

NOOP = "bench.noop"
GIT_ROUNDTRIP = "bench.git_roundtrip"
CONTEXT_ROUNDTRIP = "bench.context_roundtrip"
NOOP_QUEUE = "noop"

app = Celery("bench_noop")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    task_send_sent_event=True,
    worker_send_task_events=True,
    task_default_queue=NOOP_QUEUE,
)


@app.task(name=NOOP)  # type: ignore[untyped-decorator]  # celery ships no types
def noop(uuid: str, request: dict[str, object]) -> dict[str, str]:
    """Take the same arguments as ``tasuki.run_task`` and do nothing."""
    return {"uuid": uuid, "status": "completed"}


HTTP = httpx.Client(timeout=60)  # one per worker process, kept across tasks as Tasuki's provider keeps its own
CLONES: dict[str, Path] = {}  # repository -> this process's working copy, kept across tasks like Tasuki's


@app.task(name=GIT_ROUNDTRIP)  # type: ignore[untyped-decorator]  # celery ships no types
def git_roundtrip(uuid: str, request: dict[str, str], model_url: str) -> dict[str, str]:
    """Clone ``request["repo_path"]`` (or refresh this process's clone of it), ask the model once, push a branch."""
    branch = f"bench/{uuid[:8]}"
    repo = CLONES.get(request["repo_path"])
    if repo is None:
        work = Path(tempfile.mkdtemp(prefix="bench-"))
        atexit.register(shutil.rmtree, work, True)
        repo = CLONES[request["repo_path"]] = work / "repo"
        git("clone", "-q", "--no-hardlinks", request["repo_path"], str(repo), cwd=work)
    else:
        git("fetch", "-q", "origin", cwd=repo)
    git("checkout", "-q", "-f", "-B", branch, "origin/HEAD", cwd=repo)
    git("clean", "-q", "-ffdx", cwd=repo)
    messages = [{"role": "system", "content": "You are a benchmark."}, {"role": "user", "content": uuid}]
    reply = HTTP.post(f"{model_url}/v1/chat/completions", json={"model": "b", "messages": messages})
    reply.raise_for_status()
    git("push", "-q", "origin", f"HEAD:refs/heads/{branch}", cwd=repo)
    return {"uuid": uuid, "status": "completed"}


STORES: dict[str, ContextStore] = {}  # contexts root -> this process's store, kept like Tasuki's worker keeps its own


@app.task(name=CONTEXT_ROUNDTRIP)  # type: ignore[untyped-decorator]  # celery ships no types
def context_roundtrip(uuid: str, request: dict[str, Any], model_url: str, contexts_dir: str) -> dict[str, str]:
    """:func:`git_roundtrip` inside the life of a context as SPEC §3 defines it, and nothing else: created with
    its lock and heartbeat, the first prompt's step, the model's reply and its finish call recorded, completed.
    What every task must write to disk, whatever system ran it: the floor under Tasuki's own work."""
    store = STORES.get(contexts_dir)
    if store is None:
        store = STORES[contexts_dir] = ContextStore(Path(contexts_dir))
    ctx = store.create(request["task_key"], {"model": "b", "context_length": 32768}, uuid=uuid,
                       extra_metadata={"request": request})
    ctx.append_message("system", "You are a benchmark.")
    ctx.append_message("user", str(request["prompt"]))
    ctx.step_done(status="processing")
    result = git_roundtrip(uuid, request, model_url)
    call = {"id": "call_0", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "Done."}'}}
    ctx.append_message("assistant", "Nothing to do.", tool_calls=[call])
    ctx.append_tool("finish", {"summary": "Done."}, "success", 0, result="Done.", tool_call_id="call_0")
    ctx.append_message("tool", "Done.", tool_call_id="call_0", name="finish")
    ctx.stage_state(add={"llm_call_count": 1, "tool_call_count": 1}, last_activity="tool:finish")
    ctx.step_done(write_state=False)
    ctx.finish("completed", result={"summary": "Done.", "branch": f"bench/{uuid[:8]}"})
    return result


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)
