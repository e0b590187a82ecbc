"""Daily budgets at the intake (SPEC §16): a repository or user over its cap starts nothing, hears it once, and
the user cap holds when two intake processes race on it (real uvicorn processes, real Redis)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis

from contexts.usage import Usage
from tests.helpers.celery_worker import REPO_ROOT, worker_env
from tests.helpers.context_support import wait_for
from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.followup_payloads import check_suite_failed
from tests.helpers.intake_server import intake_server
from tests.helpers.redis_server import free_port
from worker.names import FORGE_REPLY, MAINTENANCE_QUEUE, TASKS_QUEUE
from worker.settings_models import Settings
from worker.spend import count_usage, user_key

pytestmark = pytest.mark.integration

SECRET = "spend-webhook-secret"
STARTUP_S = 30.0


def intake_env(redis_url: str, **limits: int) -> dict[str, str]:
    env = {
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__PERMISSIONS__CHECK": "false",  # admission here; permissions: test_forge_permissions
        "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
        "GITHUB_WEBHOOK_SECRET": SECRET,
    }
    env.update({f"TASUKI__LIMITS__{name.upper()}": str(value) for name, value in limits.items()})
    return env


def labeled(repo: str, issue: int, sender: str = "Codertocat") -> tuple[bytes, dict[str, str]]:
    payload: dict[str, Any] = load_payload("github/issues.labeled.json")
    payload["repository"]["name"] = repo
    payload["repository"]["full_name"] = f"Codertocat/{repo}"
    payload["issue"]["number"] = issue
    payload["sender"]["login"] = sender
    return github_delivery("issues", payload, SECRET)


def post(url: str, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, dict[str, Any]]:
    body, headers = delivery
    response = httpx.post(url + "/webhooks/github", content=body, headers=headers, timeout=20)
    return response.status_code, response.json()


def queued_replies(client: redis.Redis, repo: str) -> list[list[Any]]:
    """The arguments of the forge replies queued for ``repo`` (Celery's message: JSON, base64 body)."""
    replies = []
    for raw in client.lrange(MAINTENANCE_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] != FORGE_REPLY:
            continue
        args = json.loads(base64.b64decode(message["body"]))[0]
        if args[0]["repo"] == repo:
            replies.append(args)
    return replies


def test_a_repository_over_its_daily_cap_gets_no_new_task_and_exactly_one_reply(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    repo = f"capped-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    # What the workers counted today for this repository: exactly the cap.
    count_usage(redis_client, f"github/Codertocat/{repo}", Usage("agent", "m", 900, 100), None, now)
    with intake_server(make_settings(intake_env(redis_url, repo_tokens=1000))) as intake:
        first = post(intake.url, labeled(repo, 7))
        second = post(intake.url, labeled(repo, 7))  # the label applied again: a new delivery
        other_issue = post(intake.url, labeled(repo, 8))
        queued = intake.queued()
    for status, answer in (first, second, other_issue):
        assert status == 200
        assert answer["status"] == "over_budget"
        assert "1000 tokens today" in answer["reason"]
    assert queued == []
    replies = queued_replies(redis_client, repo)
    assert sorted(args[0]["task_id"] for args in replies) == ["7", "8"]  # once per issue, however often triggered
    assert all("It resets at" in args[1] and "UTC" in args[1] for args in replies)
    redis_client.delete(MAINTENANCE_QUEUE)


def test_a_failed_ci_run_on_a_repository_over_its_daily_cap_starts_no_fix_task(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    repo = f"ci-{uuid.uuid4().hex[:8]}"
    count_usage(redis_client, f"github/Codertocat/{repo}", Usage("agent", "m", 1000, 0), None, datetime.now(UTC))
    delivery = github_delivery("check_suite", check_suite_failed("Codertocat", repo, "tasuki/7-abc", 1), SECRET)
    with intake_server(make_settings(intake_env(redis_url, repo_tokens=1000))) as intake:
        status, answer = post(intake.url, delivery)
        assert intake.queued() == []
    assert (status, answer["status"]) == (200, "over_budget")


def test_a_retry_comment_of_a_user_at_the_daily_cap_starts_nothing(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    repo, user = f"retry-{uuid.uuid4().hex[:8]}", f"retrier-{uuid.uuid4().hex[:8]}"
    payload: dict[str, Any] = load_payload("github/issue_comment.created.json")
    payload["repository"]["name"] = repo
    payload["repository"]["full_name"] = f"Codertocat/{repo}"
    payload["comment"]["body"] = "/tasuki retry"
    payload["comment"]["author_association"] = "OWNER"
    payload["sender"]["login"] = payload["comment"]["user"]["login"] = user
    with intake_server(make_settings(intake_env(redis_url, user_tasks=1))) as intake:
        first = post(intake.url, github_delivery("issue_comment", payload, SECRET))
        payload["issue"]["number"] += 1  # the same user asks for a retry on another issue
        second = post(intake.url, github_delivery("issue_comment", payload, SECRET))
        queued = intake.queued()
    assert first[0] == 202, first
    assert (second[0], second[1]["status"]) == (200, "over_budget"), second
    assert len(queued) == 1
    redis_client.delete(MAINTENANCE_QUEUE)


def test_a_repository_under_its_daily_cap_gets_its_task(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    repo = f"under-{uuid.uuid4().hex[:8]}"
    count_usage(redis_client, f"github/Codertocat/{repo}", Usage("agent", "m", 900, 99), None, datetime.now(UTC))
    with intake_server(make_settings(intake_env(redis_url, repo_tokens=1000))) as intake:
        status, answer = post(intake.url, labeled(repo, 7))
        assert len(intake.queued()) == 1
    assert status == 202, answer
    assert queued_replies(redis_client, repo) == []


@pytest.fixture
def intakes(tmp_path: Any, redis_url: str, redis_client: redis.Redis) -> Iterator[list[str]]:
    """Two ``tasuki webhook`` processes on one Redis, with limits.user_tasks = 3."""
    config = tmp_path / "config.yaml"
    config.write_text("")
    processes, urls, logs = [], [], []
    for _ in range(2):
        port = free_port()
        env = worker_env({**intake_env(redis_url, user_tasks=3), "TASUKI_CONFIG": str(config),
                          "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts")})
        logs.append((tmp_path / f"intake-{port}.log").open("w"))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "cli.main", "webhook", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=logs[-1],
        ))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            wait_for(lambda url=url: _healthy(url), timeout=STARTUP_S, what=f"the intake at {url}")
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
        for log in logs:
            log.close()
        redis_client.delete(TASKS_QUEUE)  # nothing consumes these messages: never hand them to a later worker


def _healthy(url: str) -> bool | None:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200 or None
    except httpx.HTTPError:
        return None


def test_two_intake_processes_racing_on_one_users_daily_cap_never_start_more_tasks_than_the_cap(
    intakes: list[str], redis_client: redis.Redis
) -> None:
    user = f"racer-{uuid.uuid4().hex[:8]}"
    repo = f"raced-{uuid.uuid4().hex[:8]}"
    deliveries = [(intakes[n % 2], labeled(repo, 100 + n, sender=user)) for n in range(16)]  # 16 issues, 1 user
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda item: post(*item), deliveries))
    started = [answer for status, answer in answers if status == 202]
    refused = [answer for status, answer in answers if status == 200 and answer["status"] == "over_budget"]
    assert len(started) == 3, answers
    assert len(refused) == 13, answers
    assert int(redis_client.get(user_key(datetime.now(UTC).date().isoformat(), user)) or 0) == 3
    assert len(redis_client.lrange(TASKS_QUEUE, 0, -1)) == 3
