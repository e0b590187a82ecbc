"""Gitea and Forgejo deliveries (SPEC §8): their HMAC-SHA256 signature, what each published payload asks for, and
``POST /webhooks/gitea`` through the real intake (uvicorn, Redis, a Celery producer)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.helpers.deliveries import gitea_delivery, gitea_labeled, load_payload
from tests.helpers.intake_server import IntakeServer, intake_server
from webhooks.events import Cancel, Command, Ignore, Note, Trigger
from webhooks.gitea_events import gitea_action
from webhooks.signatures import gitea_signature, verify_gitea
from worker.names import ACTIVE_PREFIX
from worker.settings_models import GiteaSettings, LabelSettings, Settings

SECRET = "gitea-webhook-secret"
CFG = GiteaSettings(labels=LabelSettings(trigger="coding agent"))
ISSUE_KEY = {"task_source": "gitea", "owner": "gogits", "repo": "hello-world", "task_type": "issue", "task_id": "1"}


def comment(body: str, fixture: str = "gitea/issue_comment.created.json") -> dict[str, Any]:
    payload = load_payload(fixture)
    payload["comment"]["body"] = body
    return payload


# -- the signature ---------------------------------------------------------------------------------


def test_the_signature_is_the_bare_hex_hmac_sha256_of_the_body() -> None:
    # RFC 4231, test case 2: HMAC-SHA256 with key "Jefe"
    assert gitea_signature("Jefe", b"what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")


def test_a_gitea_or_forgejo_signature_verifies_and_anything_else_does_not() -> None:
    body = b'{"action": "created"}'
    good = gitea_signature(SECRET, body)
    assert verify_gitea(SECRET, body, good, None)
    assert verify_gitea(SECRET, body, None, good)  # X-Forgejo-Signature alone
    assert not verify_gitea(SECRET, body + b" ", good, None)
    assert not verify_gitea(SECRET, body, "sha256=" + good, None)  # GitHub's form is not Gitea's header
    assert not verify_gitea(SECRET, body, good.upper(), None)
    assert not verify_gitea(SECRET, body, None, None)
    assert not verify_gitea(None, body, good, None)  # no secret configured: nothing verifies
    assert not verify_gitea(SECRET, body, "é" * 64, None)


# -- what a payload asks for -----------------------------------------------------------------------


def test_the_trigger_label_present_after_a_label_change_starts_a_task() -> None:
    action = gitea_action("issues", gitea_labeled(["bug", "coding agent"]), CFG)
    assert isinstance(action, Trigger)
    assert (action.task_key, action.user) == (ISSUE_KEY, "unknwon")
    assert action.issue["title"] == "Problem"
    assert action.trigger == {"kind": "label", "user": "unknwon"}


def test_a_label_change_cancels_only_an_item_without_the_processing_or_a_final_label() -> None:
    assert isinstance(gitea_action("issues", gitea_labeled(["bug"]), CFG), Cancel)  # processing removed
    assert isinstance(gitea_action("issues", gitea_labeled([]), CFG), Cancel)
    for kept in ("coding agent processing", "coding agent done", "coding agent failed"):
        assert isinstance(gitea_action("issues", gitea_labeled(["bug", kept]), CFG), Ignore), kept


def test_a_label_change_on_a_pull_request_names_the_pull_request() -> None:
    labeled = gitea_labeled(["coding agent"])
    payload = {**labeled, "pull_request": {**labeled.pop("issue"), "number": 2}}
    action = gitea_action("pull_request", payload, CFG)
    assert isinstance(action, Trigger)
    assert action.task_key == {**ISSUE_KEY, "task_type": "pull_request", "task_id": "2"}


def test_a_comment_with_the_mention_starts_a_task_whose_author_a_worker_checks() -> None:
    action = gitea_action("issue_comment", comment("@tasuki please fix this\n> @tasuki quoted"), CFG)
    assert isinstance(action, Trigger)
    assert action.task_key == ISSUE_KEY
    assert action.prompt == "@tasuki please fix this"
    assert action.trigger == {"kind": "comment", "user": "unknwon", "user_id": 1}


def test_a_comment_on_a_pull_request_continues_it() -> None:
    action = gitea_action("issue_comment", comment("@tasuki rename it", "gitea/pull_request_comment.created.json"),
                          CFG)
    assert isinstance(action, Trigger)
    assert action.task_key == {**ISSUE_KEY, "task_type": "pull_request", "task_id": "2"}
    assert action.body == "run gofmt"  # the pull request's body: where a task's thread marker is


def test_published_comments_without_the_mention_are_notes_and_commands_are_commands() -> None:
    note = gitea_action("issue_comment", load_payload("gitea/issue_comment.created.json"), CFG)
    assert isinstance(note, Note)
    assert note.text == "Got it"
    assert isinstance(gitea_action("issue_comment", comment("/tasuki cancel"), CFG), Cancel)
    retry = gitea_action("issue_comment", comment("/tasuki retry"), CFG)
    assert isinstance(retry, Command)
    assert retry.trigger["user_id"] == 1


def test_a_review_with_text_is_a_review_trigger_on_the_pull_request_and_a_bare_approval_is_not() -> None:
    payload = load_payload("gitea/pull_request_approved.reviewed.json")
    approved = gitea_action("pull_request_approved", payload, CFG)
    assert isinstance(approved, Trigger)
    assert approved.task_key == {"task_source": "gitea", "owner": "jcitizen", "repo": "my-repo",
                                 "task_type": "pull_request", "task_id": "1"}
    assert (approved.prompt, approved.body, approved.head) == ("I approve", "Using a BSD License", "feature")
    assert approved.trigger == {"kind": "review", "user": "jcitizen", "user_id": 6641}
    payload["review"] = {"type": "pull_request_review_rejected", "content": "Use MIT.\n/tasuki cancel"}
    assert isinstance(gitea_action("pull_request_rejected", payload, CFG), Cancel)
    payload["review"] = {"type": "pull_request_review_approved", "content": " "}
    assert isinstance(gitea_action("pull_request_approved", payload, CFG), Ignore)


@pytest.mark.parametrize(("event", "change"), [
    ("issue_comment", {"action": "edited"}),
    ("issue_comment", {"action": "deleted"}),
    ("issue_comment", {"sender": {"id": 9, "login": "Tasuki-Bot"}}),  # the bot's own comment
    ("push", {}),
    ("issues", {"action": "opened"}),
    ("issues", {"action": ["label_updated"]}),
    ("issue_comment", {"issue": {"number": "1"}}),
    ("issue_comment", {"repository": None}),
])
def test_other_events_and_payloads_of_the_wrong_shape_are_ignored(event: str, change: dict[str, Any]) -> None:
    payload = {**load_payload("gitea/issue_comment.created.json"), **copy.deepcopy(change)}
    if event == "issues":
        payload = {**gitea_labeled(["coding agent"]), **change}
    assert isinstance(gitea_action(event, payload, CFG), Ignore)


def test_labels_of_the_wrong_shape_are_no_trigger() -> None:
    payload = gitea_labeled(["coding agent"])
    payload["issue"]["labels"] = "coding agent"
    assert not isinstance(gitea_action("issues", payload, CFG), Trigger)


# -- the route -------------------------------------------------------------------------------------


@pytest.fixture
def intake(make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis) -> Iterator[IntakeServer]:
    env = {"TASUKI__BROKER__URL": redis_url, "TASUKI__GITEA__LABELS__TRIGGER": "coding agent",
           "GITEA_WEBHOOK_SECRET": SECRET,
           "TASUKI__PERMISSIONS__CHECK": "false",  # admission here; permissions: test_forge_permissions
           }
    with intake_server(make_settings(env)) as server:
        yield server


def post(server: IntakeServer, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, dict[str, Any]]:
    body, headers = delivery
    with server.client() as client:
        response = client.post("/webhooks/gitea", content=body, headers=headers)
    return response.status_code, response.json()


@pytest.mark.integration
def test_a_signed_trigger_enqueues_once_and_a_redelivery_is_a_duplicate(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    delivery = gitea_delivery("issues", gitea_labeled(["coding agent"]), SECRET)
    status, answer = post(intake, delivery)
    assert status == 202
    assert post(intake, delivery) == (200, {"status": "duplicate"})
    again = gitea_delivery("issues", gitea_labeled(["coding agent"]), SECRET)
    assert post(intake, again) == (200, {"status": "active", "task_id": answer["task_id"]})
    assert redis_client.get(ACTIVE_PREFIX + "gitea/gogits/hello-world/issue/1") == answer["task_id"]
    assert [json.loads(m)["headers"]["id"] for m in intake.queued()] == [answer["task_id"]]


@pytest.mark.integration
def test_a_forgejo_delivery_is_understood_and_a_label_change_cancels_the_queued_task(
    intake: IntakeServer, redis_client: redis.Redis
) -> None:
    status, answer = post(intake, gitea_delivery("issues", gitea_labeled(["coding agent"]), SECRET, forgejo=True))
    assert status == 202
    status, cancelled = post(intake, gitea_delivery("issues", gitea_labeled(["bug"]), SECRET, forgejo=True))
    assert (status, cancelled["status"], cancelled["task_id"]) == (200, "cancelled", answer["task_id"])


@pytest.mark.integration
@pytest.mark.parametrize("signature", [None, "0" * 64, "sha256=deadbeef"])
def test_a_missing_or_wrong_signature_is_401_and_enqueues_nothing(
    intake: IntakeServer, signature: str | None
) -> None:
    body, headers = gitea_delivery("issues", gitea_labeled(["coding agent"]), None)
    if signature is not None:
        headers["X-Gitea-Signature"] = signature
    assert post(intake, (body, headers))[0] == 401
    assert intake.queued() == []


@pytest.mark.integration
def test_an_unsupported_event_is_2xx(intake: IntakeServer) -> None:
    status, answer = post(intake, gitea_delivery("push", {"ref": "refs/heads/main", **load_payload(
        "gitea/issues.opened.json")}, SECRET))
    assert (status, answer["status"]) == (200, "ignored")
