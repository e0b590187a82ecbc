"""The webhook routes under a real uvicorn server, with real Redis and a real Celery producer (SPEC §8)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from contexts import ContextStore
from tests.helpers.deliveries import github_delivery, gitlab_delivery, load_payload
from tests.helpers.intake_server import IntakeServer, intake_server
from worker.names import ACTIVE_PREFIX, CANCEL_PREFIX
from worker.redis_clock import record_skew
from worker.runtime import context_store, unindex
from worker.settings import install_settings
from worker.settings_models import Settings

pytestmark = pytest.mark.integration

GITHUB_SECRET = "github-webhook-secret"
GITLAB_TOKEN = "gitlab-plain-token"
SIGNING_TOKEN = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MAX_BODY = 64 * 1024
ACTIVE_KEY = ACTIVE_PREFIX + "github/Codertocat/Hello-World/issue/1"


def intake_env(redis_url: str, gitlab_secret: str = GITLAB_TOKEN) -> dict[str, str]:
    return {
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__PERMISSIONS__CHECK": "false",  # admission here; permissions: test_forge_permissions
        "TASUKI__WEBHOOK__MAX_BODY_BYTES": str(MAX_BODY),
        "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
        "TASUKI__GITHUB__LABELS__PROCESSING": "bug",
        "TASUKI__GITLAB__LABELS__TRIGGER": "Platform",
        "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
        "GITLAB_WEBHOOK_SECRET": gitlab_secret,
    }


@pytest.fixture
def intake(make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis) -> Iterator[IntakeServer]:
    with intake_server(make_settings(intake_env(redis_url))) as server:
        yield server


def post(server: IntakeServer, route: str, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, dict[str, Any]]:
    body, headers = delivery
    with server.client() as client:
        response = client.post(route, content=body, headers=headers)
    return response.status_code, response.json()


def labeled() -> dict[str, Any]:
    return load_payload("github/issues.labeled.json")


# -- GitHub ----------------------------------------------------------------------------------------


def test_github_ping_is_answered(intake: IntakeServer) -> None:
    assert post(intake, "/webhooks/github", github_delivery("ping", load_payload("github/ping.json"),
                                                            GITHUB_SECRET)) == (200, {"status": "pong"})


def test_github_trigger_enqueues_once_and_duplicates_and_second_triggers_do_not(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    delivery = github_delivery("issues", labeled(), GITHUB_SECRET, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")

    status, answer = post(intake, "/webhooks/github", delivery)
    assert status == 202
    task_id = answer["task_id"]
    assert post(intake, "/webhooks/github", delivery) == (200, {"status": "duplicate"})
    again = github_delivery("issues", labeled(), GITHUB_SECRET)  # a new delivery for the same issue
    assert post(intake, "/webhooks/github", again) == (200, {"status": "active", "task_id": task_id})

    queued = intake.queued()
    assert len(queued) == 1
    message = json.loads(queued[0])
    assert message["headers"]["id"] == task_id
    assert redis_client.get(ACTIVE_KEY) == task_id


def test_the_same_delivery_id_from_another_hook_is_not_a_duplicate(intake: IntakeServer) -> None:
    first = github_delivery("issues", labeled(), GITHUB_SECRET, delivery="d-1", hook_id="1")
    other_hook = github_delivery("issues", labeled(), GITHUB_SECRET, delivery="d-1", hook_id="2")
    assert post(intake, "/webhooks/github", first)[0] == 202
    assert post(intake, "/webhooks/github", other_hook)[1]["status"] == "active"


@pytest.mark.parametrize(
    "headers",
    [
        {},  # unsigned
        {"X-Hub-Signature-256": "sha256=" + "0" * 64},
        {"X-Hub-Signature": "sha1=7d38cdd689735b008b3c702edd92eea23791c5f6"},  # SHA-1 only: never accepted
    ],
)
def test_github_bad_or_missing_signature_is_401_and_enqueues_nothing(
    intake: IntakeServer, headers: dict[str, str]
) -> None:
    body, sent = github_delivery("issues", labeled(), None)
    assert post(intake, "/webhooks/github", (body, {**sent, **headers}))[0] == 401
    assert intake.queued() == []


def test_github_unparsable_signed_body_is_400(intake: IntakeServer) -> None:
    assert post(intake, "/webhooks/github", github_delivery("issues", b"{not json", GITHUB_SECRET))[0] == 400
    assert post(intake, "/webhooks/github", github_delivery("issues", b"[1, 2]", GITHUB_SECRET))[0] == 400


def test_github_form_encoded_delivery_is_understood(intake: IntakeServer) -> None:
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(labeled())}).encode()
    _, headers = github_delivery("issues", body, GITHUB_SECRET)
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    assert post(intake, "/webhooks/github", (body, headers))[0] == 202


def test_unsupported_event_is_2xx(intake: IntakeServer) -> None:
    status, answer = post(intake, "/webhooks/github", github_delivery("star", {"action": "created"}, GITHUB_SECRET))
    assert status == 200
    assert answer["status"] == "ignored"


def test_body_over_the_limit_is_413_with_or_without_content_length(intake: IntakeServer) -> None:
    body, headers = github_delivery("issues", b"x" * (MAX_BODY + 1), GITHUB_SECRET)
    assert post(intake, "/webhooks/github", (body, headers))[0] == 413

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to trust
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"y" * 1024

    with intake.client() as client:
        response = client.post("/webhooks/github", content=chunks(), headers={"X-GitHub-Event": "issues"})
    assert response.status_code == 413
    assert intake.queued() == []


def test_unlabeling_the_processing_label_cancels_the_queued_task_and_frees_the_issue(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    task_id = post(intake, "/webhooks/github", github_delivery("issues", labeled(), GITHUB_SECRET))[1]["task_id"]

    unlabel = github_delivery("issues", load_payload("github/issues.unlabeled.json"), GITHUB_SECRET)
    status, answer = post(intake, "/webhooks/github", unlabel)

    assert (status, answer["status"], answer["task_id"]) == (200, "cancelled", task_id)
    assert redis_client.exists(CANCEL_PREFIX + task_id)
    assert redis_client.get(ACTIVE_KEY) is None  # revoked before it started: the issue may be triggered again
    status, answer = post(intake, "/webhooks/github", github_delivery("issues", labeled(), GITHUB_SECRET))
    assert status == 202
    assert answer["task_id"] != task_id


def test_cancel_command_without_an_active_task_is_ignored(intake: IntakeServer) -> None:
    payload = load_payload("github/issue_comment.created.json")
    payload["comment"]["body"] = "/tasuki cancel"
    status, answer = post(intake, "/webhooks/github", github_delivery("issue_comment", payload, GITHUB_SECRET))
    assert (status, answer["status"]) == (200, "ignored")


# -- GitLab ----------------------------------------------------------------------------------------


def test_gitlab_secret_token_trigger_and_idempotency_key_dedupe(intake: IntakeServer) -> None:
    delivery = gitlab_delivery("Issue Hook", load_payload("gitlab/issue_hook.json"), token=GITLAB_TOKEN,
                               idempotency_key="f2c8a4c5-1111-4cc0-9d5d-2d8f1b7e4a10")
    status, answer = post(intake, "/webhooks/gitlab", delivery)
    assert status == 202
    assert post(intake, "/webhooks/gitlab", delivery) == (200, {"status": "duplicate"})
    retry = gitlab_delivery("Issue Hook", load_payload("gitlab/issue_hook.json"), token=GITLAB_TOKEN)
    assert post(intake, "/webhooks/gitlab", retry) == (200, {"status": "active", "task_id": answer["task_id"]})


@pytest.mark.parametrize("token", [None, "", "gitlab-plain-tokeN", GITLAB_TOKEN + "x", GITLAB_TOKEN[:-1]])
def test_gitlab_wrong_or_missing_token_is_401(intake: IntakeServer, token: str | None) -> None:
    delivery = gitlab_delivery("Issue Hook", load_payload("gitlab/issue_hook.json"), token=token)
    assert post(intake, "/webhooks/gitlab", delivery)[0] == 401
    assert intake.queued() == []


@pytest.fixture
def signed_intake(make_settings: Callable[..., Settings], redis_url: str,
                  redis_client: redis.Redis) -> Iterator[IntakeServer]:
    with intake_server(make_settings(intake_env(redis_url, gitlab_secret=SIGNING_TOKEN))) as server:
        yield server


def test_gitlab_standard_webhooks_signature_is_accepted(signed_intake: IntakeServer) -> None:
    delivery = gitlab_delivery("Issue Hook", load_payload("gitlab/issue_hook.json"), signing_token=SIGNING_TOKEN)
    assert post(signed_intake, "/webhooks/gitlab", delivery)[0] == 202


def test_gitlab_standard_webhooks_signature_that_is_stale_or_forged_is_401(signed_intake: IntakeServer) -> None:
    payload = load_payload("gitlab/issue_hook.json")
    stale = gitlab_delivery("Issue Hook", payload, signing_token=SIGNING_TOKEN, timestamp=int(time.time()) - 600)
    assert post(signed_intake, "/webhooks/gitlab", stale)[0] == 401
    body, headers = gitlab_delivery("Issue Hook", payload, signing_token=SIGNING_TOKEN)
    assert post(signed_intake, "/webhooks/gitlab", (body.replace(b"23", b"24"), headers))[0] == 401
    assert signed_intake.queued() == []


# -- health and metrics ----------------------------------------------------------------------------


def test_healthz_is_200_while_redis_answers(intake: IntakeServer) -> None:
    with intake.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}


def test_healthz_names_a_worker_whose_clock_is_off_redis_by_more_than_the_bound(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    seconds, micros = redis_client.time()
    now = seconds + micros / 1e6
    record_skew(redis_client, "slow-host", 120.0, now)  # what a worker two minutes behind records at start
    record_skew(redis_client, "fine-host", 0.2, now)
    with intake.client() as client:
        body = client.get("/healthz").json()
    assert body["status"] == "ok"  # heartbeats are judged by Redis's clock: a skewed worker is told, not fatal
    assert body["clock_skew"]["workers"] == {"slow-host": 120.0}


def test_healthz_is_503_and_triggers_are_503_when_redis_is_down(make_settings: Callable[..., Settings]) -> None:
    from tests.helpers.redis_server import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings = make_settings(intake_env(dead))
    client = redis.Redis.from_url(dead, socket_connect_timeout=0.5, socket_timeout=0.5)
    with intake_server(settings, client) as server, server.client() as http:
        assert http.get("/healthz").status_code == 503
        body, headers = github_delivery("issues", labeled(), GITHUB_SECRET)
        assert http.post("/webhooks/github", content=body, headers=headers).status_code == 503
        body, headers = github_delivery("issues", labeled(), None)  # unsigned: refused without asking Redis
        assert http.post("/webhooks/github", content=body, headers=headers).status_code == 401


def test_metrics_count_deliveries_and_queue_depth(intake: IntakeServer) -> None:
    post(intake, "/webhooks/github", github_delivery("issues", labeled(), GITHUB_SECRET))
    post(intake, "/webhooks/github", github_delivery("issues", labeled(), None))
    with intake.client() as client:
        response = client.get("/metrics")
    text = response.text
    assert response.status_code == 200
    assert 'tasuki_webhook_deliveries_total{outcome="enqueued",source="github"} 1.0' in text
    assert 'tasuki_webhook_deliveries_total{outcome="unauthorized",source="github"} 1.0' in text
    assert 'tasuki_queue_depth{queue="tasks"} 1.0' in text
    assert "tasuki_stale_heartbeats 0.0" in text
    assert 'tasuki_tasks_running{status="processing"} 0.0' in text
    assert "tasuki_redis_up 1.0" in text


def test_metrics_count_running_tasks_by_status_from_the_index_the_holders_keep(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings(intake_env(redis_url))
    install_settings(settings)
    store = context_store(settings)  # the worker's store: holders mirror status changes into Redis
    key = {"task_source": "local", "owner": "o", "repo": "r", "task_type": "prompt", "task_id": "1"}
    config = {"model": "m", "context_length": 1000}
    processing, compressing, done = (store.create(key, config, heartbeat=False) for _ in range(3))
    processing.update_state(status="processing")
    compressing.update_state(status="processing")
    compressing.update_state(status="compressing")
    done.update_state(status="processing")
    done.finish("completed")
    unindex(done.uuid)  # what the ending's bookkeeping does
    ContextStore(settings.contexts.base_dir).create(key, config, heartbeat=False)  # never mirrored: not read

    def running(text: str) -> dict[str, float]:
        found = re.findall(r'tasuki_tasks_running\{status="(\w+)"\} ([\d.]+)', text)
        return {status: float(count) for status, count in found}

    with intake_server(settings) as server, server.client() as client:
        counts = running(client.get("/metrics").text)

    assert counts == {"initializing": 0.0, "processing": 1.0, "compressing": 1.0, "completing": 0.0}
    for ctx in (processing, compressing):
        ctx.release()
