"""Follow-up latencies through the whole stack, as ratios against a bare enqueue on the same Redis.

- **review → first model request**: a signed ``pull_request_review`` (submitted) for a pull request whose
  thread Tasuki recorded goes through the intake (uvicorn, in this process) → Redis → a real ``celery worker``
  that clones the fake forge's repository over git's smart HTTP, checks out the pull request's branch, reads
  the review's comments from the fake forge's API and sends the follow-up's first request to the replay model.
  Timed from the POST to the request's arrival at the model.
- **comment → model**: a comment on the pull request posted while the model holds the follow-up's second
  request (a scripted delay). The intake puts it in the task's inbox; the worker reads it at the step
  boundary after that answer's tool call. Timed from the held answer's departure (the step boundary cannot
  come earlier) to the arrival of the request that carries the comment; the time from the POST is printed too.
- **baseline**: a bare enqueue — ``bench.noop`` sent with Celery and its result read, on the same Redis, by a
  worker with the same delivery settings.

No target: the ratios are printed for information (issue 12 asks for them to be measured).
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

import httpx
import redis
from celery import Celery

from bench.common import Result, standalone
from bench.noop_app import NOOP, NOOP_QUEUE
from bench.worker_stack import CeleryWorker, client, local_request, private_redis, tasuki_env, tiny_repo
from replay import ReplayModel, ReplayServer, serve
from replay.trajectory import turns_from_entries
from tests.helpers.deliveries import github_delivery
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.followup_payloads import pull_comment, review_submitted
from tests.helpers.intake_server import intake_server
from worker.settings import load_settings
from worker.threads import Thread, record_thread

TOKEN = "bench-forge-token"  # noqa: S105 - the benchmark's own fake forge
SECRET = "bench-followups-secret"  # noqa: S105
OWNER, REPO, BRANCH = "bench", "repo", "tasuki/1-bench000"
HOLD_S = 1.0
WAIT_S = 120.0


class TimedModel(ReplayModel):
    """The replay model, with the arrival time of every request and the departure time of every answer."""

    def record(self, method: str, path: str, body: Any) -> dict[str, Any]:
        """Log the request with its arrival time."""
        entry = super().record(method, path, body)
        self.note(entry, arrived=time.perf_counter(), text=json.dumps(body))
        return entry

    def answer(self, messages: list[dict[str, Any]], entry: dict[str, Any] | None = None) -> Any:
        """Answer, then note when the answer left."""
        found = super().answer(messages, entry)
        self.note(entry, answered=time.perf_counter())
        return found


def trajectory() -> list[dict[str, Any]]:
    return [
        {"content": "Look.", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
        {"delay_s": HOLD_S},
        {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Addressed."}}]},
    ]


def wait_for(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.001)  # polling another thread's log: sub-millisecond resolution is enough here
    raise RuntimeError(f"timed out waiting for {what}")


def request_with(model: ReplayServer, text: str, turn: int) -> dict[str, Any] | None:
    return next((r for r in model.requests if r["turn"] == turn and text in r.get("text", "")), None)


def noop_seconds(app: Celery, repo: Path) -> float:
    uuid = str(uuid_module.uuid4())
    start = time.perf_counter()
    app.send_task(NOOP, args=[uuid, local_request(repo, uuid[:8])], task_id=uuid, queue=NOOP_QUEUE).get(
        timeout=WAIT_S, interval=0.001)
    return time.perf_counter() - start


def one_round(i: int, forge: FakeForge, model: ReplayServer, post: Callable[[str, dict[str, Any]], Any],
              client_redis: redis.Redis) -> tuple[float, float, float]:
    """One follow-up: (review → first request, step boundary → comment seen, comment POST → seen)."""
    pull = 200 + i
    issue_key = {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue", "task_id": str(i)}
    forge.add_item(OWNER, REPO, pull, f"Round {i}", kind="pull_request")
    record_thread(client_redis, Thread(issue_key, "pull_request", pull, BRANCH, "none"))
    change = FakeChange(OWNER, REPO, pull, BRANCH, "main", f"Round {i}", "", "")
    marker = f"bench-review-{i}"
    review_id, _ = forge.add_review(OWNER, REPO, pull, "Codertocat", [("README.md", 1, "@@ -1 +1 @@", marker)])

    start = time.perf_counter()
    post("pull_request_review", review_submitted(change, review_id, None))
    first = wait_for(lambda: request_with(model, marker, 0), "the follow-up's first request")
    wait_for(lambda: request_with(model, marker, 1), "the held second request")
    said = f"bench-comment-{i}"
    posted = time.perf_counter()
    post("issue_comment", pull_comment(change, said))
    seen = wait_for(lambda: request_with(model, said, 2), "the request carrying the comment")
    answered = wait_for(lambda: request_with(model, marker, 1).get("answered"), "the held answer")  # type: ignore[union-attr]
    wait_for(lambda: not client_redis.exists(f"tasuki:active:github/{OWNER}/{REPO}/issue/{i}"), "the task's end")
    return first["arrived"] - start, seen["arrived"] - max(answered, posted), seen["arrived"] - posted


def measure(scratch: Path, rounds: int, noops: int) -> tuple[list[float], list[float], list[float], float]:
    repo = tiny_repo(scratch / "repo")
    with private_redis(scratch / "redis") as redis_url, FakeForge(scratch / "forge", TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, repo)
        forge.roles["Codertocat"] = "write"  # the reviewer of the published payloads may trigger (issue 40's check)
        subprocess.run(["git", "push", "-q", str(forge.git_root / OWNER / f"{REPO}.git"), f"main:{BRANCH}"],
                       cwd=repo, check=True, capture_output=True)
        model = serve(TimedModel(turns_from_entries(trajectory())))
        env = tasuki_env(scratch, redis_url, model.url, TASUKI__GITHUB__API_URL=forge.github_api_url,
                         GITHUB_TOKEN=TOKEN, GITHUB_WEBHOOK_SECRET=SECRET)
        workers = [CeleryWorker("worker", "tasuki", redis_url, scratch / "tasuki.log", env, 1),
                   CeleryWorker("bench.noop_app", "noop", redis_url, scratch / "noop.log", {}, 1, NOOP_QUEUE)]
        client_redis = redis.Redis.from_url(redis_url)
        try:
            for worker in workers:
                worker.start()
            with intake_server(load_settings(env=env), client_redis) as intake, client(redis_url) as app, \
                    httpx.Client(timeout=30) as http:
                def post(event: str, payload: dict[str, Any]) -> Any:
                    body, headers = github_delivery(event, payload, SECRET)
                    return http.post(intake.url + "/webhooks/github", content=body, headers=headers).json()

                results = [one_round(i, forge, model, post, client_redis) for i in range(rounds + 1)][1:]
                bare = statistics.median(noop_seconds(app, repo) for _ in range(noops))
        finally:
            for worker in workers:
                worker.stop()
            model.stop()
            client_redis.close()
    return [r[0] for r in results], [r[1] for r in results], [r[2] for r in results], bare


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Measure, print one line per figure, return the results (information, no target)."""
    rounds, noops = (1, 5) if quick else (7, 50)
    own = scratch / "followups"
    own.mkdir(parents=True)
    review, boundary, posted, bare = measure(own, rounds, noops)
    to_first, to_seen = statistics.median(review), statistics.median(boundary)
    where = f"(median of {rounds} follow-ups; bare enqueue: median of {noops} no-op round trips)"
    print(f"followups  review webhook -> first model request {to_first * 1000:,.1f} ms  bare enqueue "
          f"{bare * 1000:,.2f} ms  ratio {to_first / bare:,.1f}  {where}", flush=True)
    print(f"followups  comment mid-run -> model sees it {to_seen * 1000:,.1f} ms after the step boundary "
          f"({statistics.median(posted) * 1000:,.1f} ms after the POST, the model holding its answer {HOLD_S} s)  "
          f"ratio {to_seen / bare:,.1f}", flush=True)
    return [Result("review -> follow-up's first request", f"{to_first / bare:.1f}", "-", None),
            Result("comment mid-run -> model sees it", f"{to_seen / bare:.1f}", "-", None)]


if __name__ == "__main__":
    standalone(run, __doc__)
