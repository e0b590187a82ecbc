"""Throughput baselines: a bare Celery app with Tasuki's delivery settings and two tasks.

``bench.noop`` does nothing; ``bench.git_roundtrip`` does the work no task can skip — clone, one chat
request to the model, push a branch — without any of Tasuki's bookkeeping.
``celery -A bench.noop_app -b URL --result-backend URL worker -Q noop``; late acks and one prefetched
message per process, like Tasuki's worker, so the baselines pay for the same broker round trips.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
from celery import Celery

NOOP = "bench.noop"
GIT_ROUNDTRIP = "bench.git_roundtrip"
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


@app.task(name=GIT_ROUNDTRIP)  # type: ignore[untyped-decorator]  # celery ships no types
def git_roundtrip(uuid: str, request: dict[str, str], model_url: str) -> dict[str, str]:
    """Clone ``request["repo_path"]``, ask the model once, push a branch, remove the clone."""
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    branch = f"bench/{uuid[:8]}"
    try:
        git("clone", "-q", "--no-hardlinks", request["repo_path"], str(work / "repo"), cwd=work)
        git("checkout", "-q", "-b", branch, cwd=work / "repo")
        messages = [{"role": "system", "content": "You are a benchmark."}, {"role": "user", "content": uuid}]
        reply = httpx.post(f"{model_url}/v1/chat/completions", json={"model": "b", "messages": messages}, timeout=60)
        reply.raise_for_status()
        git("push", "-q", "origin", f"HEAD:refs/heads/{branch}", cwd=work / "repo")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"uuid": uuid, "status": "completed"}


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)
