"""The intake's one-round-trip admission (issue 13 §2): the message it pushes is Celery's, one delivery is one
script call with no result subscription and no event, and a failure leaves nothing half-written."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import uuid as uuid_module
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from celery import Celery

from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.redis_server import start_private_redis
from worker.admission import Admissions, Admitted, admit
from worker.celery import celery_config
from worker.names import ACTIVE_PREFIX, DELIVERY_PREFIX, INBOX_PREFIX, TASK_PREFIX, TASKS_QUEUE
from worker.settings_models import Settings
from worker.stores import open_store
from worker.submit import run_task_admission, send_run_task
from worker.task_message import run_task_message

pytestmark = pytest.mark.integration

SECRET = "admission-webhook-secret"
ACTIVE_KEY = ACTIVE_PREFIX + "github/Codertocat/Hello-World/issue/1"
REQUEST = {"task_key": {"task_source": "github", "owner": "o", "repo": "r", "task_type": "issue", "task_id": "7"},
           "issue": {"number": 7, "title": "t", "body": "ghp_0123456789abcdefABCDEF0123456789abcd"},
           "user": "u", "prompt": "", "trigger": {"kind": "label"}}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_url: str) -> Settings:
    return make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
                          "GITHUB_WEBHOOK_SECRET": SECRET,
                          "TASUKI__PERMISSIONS__CHECK": "false",  # admission here; permissions: test_forge_permissions
                          })


@pytest.fixture
def intake(settings: Settings, redis_client: redis.Redis) -> Iterator[IntakeServer]:
    with intake_server(settings) as server:
        yield server


def post(server: IntakeServer, event: str, payload: dict[str, Any], delivery: str | None = None
         ) -> tuple[int, dict[str, Any]]:
    body, headers = github_delivery(event, payload, SECRET, delivery=delivery)
    with server.client() as client:
        response = client.post("/webhooks/github", content=body, headers=headers)
    return response.status_code, response.json()


def decoded(raw: bytes | str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_the_intake_pushes_the_message_send_task_would_push(settings: Settings, redis_client: redis.Redis) -> None:
    app = Celery("tasuki-admission-test")
    app.conf.update(celery_config(settings))
    uuid = str(uuid_module.uuid4())
    try:
        send_run_task(app, uuid, REQUEST)  # Celery's send_task, with the request masked
        celerys = decoded(redis_client.rpop(TASKS_QUEUE) or "")
        built = run_task_message(app, uuid, REQUEST)
    finally:
        redis_client.delete(TASKS_QUEUE)
        app.close()
    ours = decoded(built.payload)

    assert built.queue_key == TASKS_QUEUE
    assert ours["properties"].pop("delivery_tag") != celerys["properties"].pop("delivery_tag")  # one per message
    assert ours == celerys
    assert ours["body"][0][0] == uuid
    assert "ghp_" not in built.payload


def test_a_delivery_is_one_script_call_with_no_subscription_and_no_event(
    intake: IntakeServer, redis_client: redis.Redis, redis_url: str
) -> None:
    labeled = load_payload("github/issues.labeled.json")
    assert post(intake, "issues", labeled)[0] == 202  # the script is loaded into Redis once
    labeled["issue"]["number"] = 2
    db = redis_client.connection_pool.connection_kwargs.get("db", 0)
    marker = f"end-{uuid_module.uuid4()}"
    redis_client.ping()  # connected, its database selected, before the monitor starts

    with redis.Redis.from_url(redis_url, decode_responses=True) as watcher, watcher.monitor() as monitor:
        status, _ = post(intake, "issues", labeled)
        redis_client.echo(marker)
        seen = []
        for event in monitor.listen():
            if marker in event["command"]:
                break
            if event["db"] == db:
                seen.append((event["client_type"], event["command"].split()[0].upper()))

    assert status == 202
    assert [command for client, command in seen if client != "lua"] == ["EVALSHA"]
    assert [command for client, command in seen if client == "lua"] == ["TYPE", "SET", "SET", "SET", "LPUSH"]
    assert len(intake.queued()) == 2


def test_a_trigger_that_cannot_be_queued_writes_nothing_and_its_redelivery_is_taken(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    def written() -> set[str]:  # other tests of this session's database may have left keys of their own
        return set(redis_client.keys(DELIVERY_PREFIX + "*")) | set(redis_client.keys(TASK_PREFIX + "*"))

    before = written()
    redis_client.set(TASKS_QUEUE, "not a list")  # the push must fail: after the dedupe and the claim
    delivery = str(uuid_module.uuid4())
    try:
        assert post(intake, "issues", load_payload("github/issues.labeled.json"), delivery)[0] == 503
    finally:
        redis_client.delete(TASKS_QUEUE)
    assert written() == before
    assert redis_client.get(ACTIVE_KEY) is None

    status, answer = post(intake, "issues", load_payload("github/issues.labeled.json"), delivery)
    assert status == 202
    assert redis_client.get(ACTIVE_KEY) == answer["task_id"]


def test_a_mention_on_an_issue_whose_task_is_queued_goes_to_its_inbox(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    task_id = post(intake, "issues", load_payload("github/issues.labeled.json"))[1]["task_id"]
    comment = load_payload("github/issue_comment.created.json")
    comment["comment"]["body"] = "@tasuki also fix the other typo"

    assert post(intake, "issue_comment", comment) == (200, {"status": "delivered", "task_id": task_id})
    [entry] = redis_client.lrange(INBOX_PREFIX + task_id, 0, -1)
    assert "also fix the other typo" in json.loads(entry)["body"]
    assert len(intake.queued()) == 1


def test_a_trigger_for_a_task_that_just_finished_starts_a_new_one(
    intake: IntakeServer, settings: Settings, redis_client: redis.Redis
) -> None:
    finished = str(uuid_module.uuid4())
    redis_client.set(ACTIVE_KEY, finished)  # its worker has not freed the key yet
    open_store(settings, must_exist=False).completed_path(finished).mkdir(parents=True)

    status, answer = post(intake, "issues", load_payload("github/issues.labeled.json"))

    assert status == 202
    assert answer["task_id"] != finished
    assert redis_client.get(ACTIVE_KEY) == answer["task_id"]
    assert json.loads(intake.queued()[0])["headers"]["id"] == answer["task_id"]


@pytest.mark.parametrize("delivery_key", [None, "tasuki:delivery:retried"], ids=["submission", "delivery"])
def test_admitting_the_same_task_again_pushes_it_once_and_reports_it_enqueued(
    settings: Settings, redis_client: redis.Redis, delivery_key: str | None
) -> None:
    """What a client retry looks like when the reply of a script that ran was lost."""
    app = Celery("tasuki-admission-test")
    app.conf.update(celery_config(settings))
    admission = run_task_admission(app, settings, REQUEST, str(uuid_module.uuid4()), delivery_key=delivery_key,
                                   delivery_ttl_s=60)
    try:
        outcomes = [admit(redis_client, admission).outcome for _ in range(2)]
        assert redis_client.llen(TASKS_QUEUE) == 1
    finally:
        redis_client.delete(TASKS_QUEUE)
        app.close()
    assert outcomes == ["enqueued", "enqueued"]


def test_concurrent_triggers_for_one_issue_enqueue_one_task(intake: IntakeServer) -> None:
    answers: list[int] = []

    def trigger() -> None:
        answers.append(post(intake, "issues", load_payload("github/issues.labeled.json"))[0])

    threads = [threading.Thread(target=trigger) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(answers) == [200] * 7 + [202]
    assert len(intake.queued()) == 1


def test_admissions_sent_together_each_get_their_own_outcome_on_a_redis_that_never_saw_the_script(
    settings: Settings, tmp_path: Path
) -> None:
    url, stop = start_private_redis(tmp_path)  # a Redis of its own: no earlier test loaded the script into it
    app = Celery("tasuki-admission-test")
    app.conf.update(celery_config(settings))
    first, again, other = (str(uuid_module.uuid4()) for _ in range(3))
    batch = [  # one batch: all three wait while the first one's pipeline has not been sent yet
        run_task_admission(app, settings, REQUEST, first, delivery_key="tasuki:delivery:1", delivery_ttl_s=60),
        run_task_admission(app, settings, REQUEST, again, delivery_key="tasuki:delivery:1", delivery_ttl_s=60),
        run_task_admission(app, settings, REQUEST, other, delivery_key="tasuki:delivery:2", delivery_ttl_s=60),
    ]

    async def admit_all() -> list[Admitted]:
        client = redis.asyncio.Redis.from_url(url)
        try:
            admissions = Admissions(client)
            return list(await asyncio.gather(*(admissions.admit(admission) for admission in batch)))
        finally:
            await client.aclose()

    try:
        outcomes = asyncio.run(admit_all())
        queued = redis.Redis.from_url(url).lrange(TASKS_QUEUE, 0, -1)
    finally:
        stop()
        app.close()
    assert outcomes == [Admitted("enqueued", first), Admitted("duplicate", ""), Admitted("active", first)]
    assert [json.loads(raw)["headers"]["id"] for raw in queued] == [first]
