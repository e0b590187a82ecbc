"""Outcomes end to end (issue 28): published ``pull_request.closed`` (octokit) and Merge Request Hook (go-gitlab)
examples, signed as the forges sign them → the intake (uvicorn) → the outcome store; the tasks of the thread run on
a real celery worker against the scripted model and the fake GitHub/GitLab over real HTTP and git.

A merged pull request records its thread (first task, follow-up, reviews, tokens, time to merge) and counts in
``/metrics``; one closed while its follow-up runs cancels the follow-up and leaves its last review in the repository
memory; a GitLab merge request merged through the Merge Request Hook."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from contexts.clock import iso, parse_iso
from contexts.outcomes_sqlite import SQLiteOutcomeStore
from memory.sqlite import SQLiteMemoryStore
from replay import ReplayServer
from tests.helpers.deliveries import github_delivery, gitlab_delivery, load_payload
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.followup_payloads import (
    merge_request_hook,
    pull_request_closed,
    review_comment_created,
    review_submitted,
)
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server, wait_for_request
from tests.helpers.stack import Stack, make_buggy_repo
from worker.settings import load_settings

pytestmark = pytest.mark.integration

FORGE_TOKEN = "outcomes-forge-token-3f9a"
GITHUB_SECRET = "outcomes-github-secret"
GITLAB_SECRET = "outcomes-gitlab-token"
OWNER, REPO = "Codertocat", "Hello-World"
PAUSE_S = 2.0


def trajectory() -> list[dict[str, Any]]:
    """Every task appends a line to notes.txt; its second answer comes after a pause (a test can act meanwhile)."""
    return [
        {"content": "Note it.", "tool_calls": [{"name": "bash", "arguments": {"command": "echo change >> notes.txt"}}]},
        {"delay_s": PAUSE_S},
        {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "cat notes.txt"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Noted it."}}]},
    ]


@dataclass
class Fleet:
    stack: Stack
    forge: FakeForge
    intake: IntakeServer
    model: ReplayServer

    def github(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = github_delivery(event, payload, GITHUB_SECRET)
        response = httpx.post(self.intake.url + "/webhooks/github", content=body, headers=headers, timeout=10)
        return response.status_code, response.json()

    def gitlab(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = gitlab_delivery(event, payload, token=GITLAB_SECRET)
        response = httpx.post(self.intake.url + "/webhooks/gitlab", content=body, headers=headers, timeout=10)
        return response.status_code, response.json()

    def outcome(self, pull: str) -> Any:
        store = SQLiteOutcomeStore(self.stack.contexts_dir)
        try:
            return store.get(pull)
        finally:
            store.close()

    def state(self, uuid: str) -> dict[str, Any]:
        return dict(json.loads((self.stack.contexts_dir / "completed" / uuid / "state.json").read_text()))

    def metric(self, outcome: str) -> float:
        text = httpx.get(self.intake.url + "/metrics", timeout=10).text
        line = f'tasuki_pull_requests_total{{outcome="{outcome}"}} '
        return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("outcomes")
    with model_server(trajectory()) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "github-source"))
        forge.add_repo("gitlabhq", "gitlab-test", make_buggy_repo(root / "gitlab-source"))
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITLAB__API_URL": forge.gitlab_api_url,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
            "TASUKI__GITLAB__LABELS__TRIGGER": "Platform",
            "GITHUB_TOKEN": FORGE_TOKEN,
            "GITLAB_TOKEN": FORGE_TOKEN,
        })
        try:
            stack.start_worker("outcomes")
            env = {**stack.env(), "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "GITLAB_WEBHOOK_SECRET": GITLAB_SECRET}
            with intake_server(load_settings(env=env)) as intake:
                yield Fleet(stack, forge, intake, model)
        finally:
            stack.stop()


def label_to_pull_request(fleet: Fleet, number: int) -> tuple[str, FakeChange]:
    """Label issue ``number`` on GitHub; the finished task's UUID and its pull request."""
    fleet.forge.add_item(OWNER, REPO, number, f"Issue {number}", "Write it down.", labels=["bug"])
    payload = load_payload("github/issues.labeled.json")
    payload["issue"]["number"] = number
    status, answer = fleet.github("issues", payload)
    assert status == 202, answer
    task_id = answer["task_id"]
    assert fleet.stack.wait_finished(task_id)["status"] == "completed"
    return task_id, fleet.forge.change(OWNER, REPO, f"tasuki/{number}-{task_id[:8]}")


def pull_id(change: FakeChange, kind: str = "pull_request", source: str = "github") -> str:
    return f"{source}/{change.owner}/{change.repo}/{kind}/{change.number}"


def test_a_merged_pull_request_records_its_thread(fleet: Fleet) -> None:
    first, change = label_to_pull_request(fleet, 1)
    # The outcome is recorded by a job after the task ends; a review (minutes later in life) counts once it exists.
    fleet.stack.wait_until(lambda: fleet.outcome(pull_id(change)) is not None, what="the pull request's outcome")
    review_id, comments = fleet.forge.add_review(OWNER, REPO, change.number, "Codertocat", [
        ("notes.txt", 1, "@@ -0,0 +1 @@\n+change", "Say what changed.")])
    status, answer = fleet.github("pull_request_review", review_submitted(change, review_id, "One thing."))
    assert status == 202, answer
    followup = answer["task_id"]
    assert fleet.github("pull_request_review_comment", review_comment_created(change, comments[0]))[1].get(
        "task_id") == followup
    assert fleet.stack.wait_finished(followup)["status"] == "completed"
    pull = pull_id(change)
    fleet.stack.wait_until(lambda: (fleet.outcome(pull) and len(fleet.outcome(pull).tasks) == 2),
                           what="both tasks on the outcome")
    merged_before = fleet.metric("merged")

    merged_at = datetime.now(UTC).replace(microsecond=0)
    closed = pull_request_closed(change, merged=True, at=iso(merged_at).replace(".000000", ""), review_comments=1)
    assert fleet.github("pull_request", closed) == (200, {"status": "merged"})
    assert fleet.github("pull_request", closed) == (200, {"status": "merged"})  # another delivery of the same

    found = fleet.outcome(pull)
    assert (found.state, found.first_uuid, found.tasks, found.followups) == ("merged", first, (first, followup), 1)
    assert found.review_comments == 2  # the review's text and its line comment
    assert found.last_review[-1]["body"] == "Say what changed."
    assert found.last_review[-1]["path"] == "notes.txt"
    # The thread's memory calls are metered in its tasks' contexts after they end: the outcome follows them.
    fleet.stack.wait_until(lambda: fleet.outcome(pull).tokens == fleet.state(first)["total_tokens_used"]
                           + fleet.state(followup)["total_tokens_used"] > 0, what="the thread's tokens")
    created = parse_iso(json.loads((fleet.stack.contexts_dir / "completed" / first / "metadata.json").read_text())
                        ["created_at"])
    assert found.time_to_merge_s == pytest.approx((merged_at - created).total_seconds(), abs=1e-3)
    assert found.url == change.url
    assert fleet.metric("merged") == merged_before + 1  # counted once for the two deliveries
    assert fleet.metric("opened") >= 1


def test_a_pull_request_closed_while_its_follow_up_runs_cancels_it_and_leaves_its_review_in_memory(
        fleet: Fleet) -> None:
    first, change = label_to_pull_request(fleet, 2)
    review_id, _ = fleet.forge.add_review(OWNER, REPO, change.number, "Codertocat", [])
    rejected = "We keep changes in CHANGELOG.md, never in notes.txt."
    status, answer = fleet.github("pull_request_review", review_submitted(change, review_id, rejected))
    assert status == 202, answer
    followup = answer["task_id"]
    wait_for_request(lambda: fleet.model.requests, lambda r: r["turn"] == 1 and r["status"] is None
                     and rejected in json.dumps(r["body"]))

    closed = pull_request_closed(change, merged=False, at=iso(datetime.now(UTC)))
    assert fleet.github("pull_request", closed) == (200, {"status": "closed", "cancelled": followup})
    assert fleet.stack.wait_finished(followup)["status"] == "cancelled"
    assert fleet.forge.branch_file(OWNER, REPO, change.head, "notes.txt") == "change\n"  # nothing more pushed
    pull = pull_id(change)
    fleet.stack.wait_until(lambda: len(fleet.outcome(pull).tasks) == 2, what="the cancelled follow-up's spend")
    found = fleet.outcome(pull)
    assert (found.state, found.followups, found.time_to_merge_s) == ("closed", 1, None)

    settings = load_settings(env=fleet.stack.env())

    def remembered() -> str | None:
        memory = SQLiteMemoryStore(settings.memory.database(settings.contexts))
        try:
            repository = memory.memory("repository", f"github:{OWNER}/{REPO}")
        finally:
            memory.close()
        text = repository.text if repository else ""
        return next((line for line in text.splitlines() if line.startswith("- Reviewers rejected")), None)

    line = fleet.stack.wait_until(remembered, what="the rejection in the repository memory")
    assert change.url in line
    assert rejected in line
    assert first in line
    assert followup in line


def test_a_gitlab_merge_request_merged_through_the_merge_request_hook(fleet: Fleet) -> None:
    fleet.forge.add_item("gitlabhq", "gitlab-test", 23, "New API", "Create it", labels=["Platform"])
    status, answer = fleet.gitlab("Issue Hook", load_payload("gitlab/issue_hook.json"))
    assert status == 202, answer
    first = answer["task_id"]
    assert fleet.stack.wait_finished(first)["status"] == "completed"
    change = fleet.forge.change("gitlabhq", "gitlab-test", f"tasuki/23-{first[:8]}")
    pull = pull_id(change, "merge_request", "gitlab")
    fleet.stack.wait_until(lambda: fleet.outcome(pull), what="the merge request's outcome")

    at = "2099-01-01T00:00:00Z"
    assert fleet.gitlab("Merge Request Hook", merge_request_hook(change, "merge", at)) == (200, {"status": "merged"})
    found = fleet.outcome(pull)
    assert (found.state, found.closed_at) == ("merged", parse_iso(at))
    assert fleet.gitlab("Merge Request Hook", merge_request_hook(change, "reopen", at)) == (200, {"status": "reopened"})
    assert fleet.outcome(pull).state == "open"
    other = merge_request_hook(FakeChange("gitlabhq", "gitlab-test", 999, "x", "main", "", "", ""), "close", at)
    status, answer = fleet.gitlab("Merge Request Hook", other)
    assert (status, answer["status"]) == (200, "ignored")  # no task opened it
