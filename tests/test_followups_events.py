"""The follow-up events (SPEC §14) as published by octokit and GitLab's documentation: what each asks for,
and the thread marker a pull/merge request carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore, jsonl
from contexts.clock import utc_now
from contexts.compression import make_summary_record
from contexts.jsonl import JsonlWriter
from contexts.names import MESSAGES_FILE, SUMMARIES_FILE
from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.fake_forge import FakeChange
from tests.helpers.followup_payloads import gitlab_diff_note, gitlab_pipeline_failed
from webhooks.ci_events import CIFailure
from webhooks.events import Command, Ignore, Trigger, command, github_action, gitlab_action
from webhooks.signatures import verify_github
from worker.settings_models import GitHubSettings, GitLabSettings
from worker.threads import Thread, find_thread, marker, parse_marker, record_thread, thread_history

GITHUB = GitHubSettings()
GITLAB = GitLabSettings()
ISSUE_KEY = {"task_source": "github", "owner": "Codertocat", "repo": "Hello-World", "task_type": "issue",
             "task_id": "1"}


def github(name: str) -> dict[str, Any]:
    return load_payload(f"github/{name}.json")


@pytest.mark.parametrize("name", ["pull_request_review.submitted", "pull_request_review_comment.created",
                                  "check_suite.completed", "workflow_run.completed"])
def test_published_payloads_of_the_new_events_verify_with_their_signature(name: str) -> None:
    body, headers = github_delivery(name.split(".", maxsplit=1)[0], github(name), "s3cret")
    assert verify_github("s3cret", body, headers["X-Hub-Signature-256"])
    assert not verify_github("other", body, headers["X-Hub-Signature-256"])


def test_a_submitted_review_is_a_review_trigger_on_its_pull_request() -> None:
    action = github_action("pull_request_review", github("pull_request_review.submitted"), GITHUB)
    assert isinstance(action, Trigger)
    assert action.task_key["task_type"] == "pull_request"
    assert action.task_key["task_id"] == "2"
    assert action.trigger["kind"] == "review"
    assert action.details == {"review_id": 237895671}
    assert action.head == "changes"
    assert action.body == "This is a pretty simple change that we need to pull into master."


def test_a_review_comment_carries_its_path_line_and_diff_hunk() -> None:
    payload = github("pull_request_review_comment.created")
    action = github_action("pull_request_review_comment", payload, GITHUB)
    assert isinstance(action, Trigger)
    assert action.trigger["kind"] == "review"
    [comment] = action.details["comments"]
    assert comment["id"] == 284312630
    assert (comment["path"], comment["line"]) == ("README.md", 265)
    assert comment["diff_hunk"] == payload["comment"]["diff_hunk"]
    assert comment["body"] == "Maybe you should use more emoji on this line."


def test_reviews_from_authors_not_allowed_and_bare_approvals_start_nothing() -> None:
    payload = github("pull_request_review.submitted")
    payload["review"]["author_association"] = "NONE"
    assert isinstance(github_action("pull_request_review", payload, GITHUB), Ignore)
    payload = github("pull_request_review.submitted")
    payload["review"].update(state="approved", body=None)
    assert isinstance(github_action("pull_request_review", payload, GITHUB), Ignore)


@pytest.mark.parametrize(("event", "field", "key"), [("check_suite", "check_suite", "check_suite_id"),
                                                       ("workflow_run", "workflow_run", "run_id")])
def test_completed_ci_runs_are_fix_triggers_only_when_they_failed(event: str, field: str, key: str) -> None:
    payload = github(f"{event}.completed")
    assert isinstance(github_action(event, payload, GITHUB), Ignore)  # published as a success
    payload[field]["conclusion"] = "failure"
    payload["sender"]["login"] = GITHUB.bot_login  # the bot's own push is what CI usually runs on
    action = github_action(event, payload, GITHUB)
    assert isinstance(action, CIFailure)
    repository = payload["repository"]
    assert (action.owner, action.repo) == (repository["owner"]["login"], repository["name"])
    assert action.branch == payload[field]["head_branch"]
    assert action.ci[key] == payload[field]["id"]


def test_comment_commands_are_read_from_live_lines_only() -> None:
    assert command("/tasuki retry") == "retry"
    assert command("ok\n/Tasuki  autofix   OFF") == "autofix off"
    assert command("> /tasuki retry\nquoted") is None
    assert command("```\n/tasuki retry\n```") is None
    payload = github("issue_comment.created")
    payload["comment"]["body"] = "/tasuki dance"
    action = github_action("issue_comment", payload, GITHUB)
    assert isinstance(action, Command)
    assert not action.known
    payload["comment"]["author_association"] = "NONE"
    assert isinstance(github_action("issue_comment", payload, GITHUB), Ignore)
    payload["comment"]["author_association"] = "OWNER"
    payload["sender"]["login"] = GITHUB.bot_login
    assert github_action("issue_comment", payload, GITHUB) == Ignore("sent by the bot")


CHANGE = FakeChange("gitlabhq", "gitlab-test", 7, "tasuki/23-abcdef12", "main", "t", "body", "u")


def test_a_gitlab_diff_note_is_a_review_trigger_with_its_position_and_discussion() -> None:
    action = gitlab_action(gitlab_diff_note(CHANGE, 5, "Rename this.", "app/a.rb", 12, "disc1"), GITLAB)
    assert isinstance(action, Trigger)
    assert action.task_key["task_type"] == "merge_request"
    assert action.head == CHANGE.head
    [comment] = action.details["comments"]
    assert (comment["path"], comment["line"], comment["thread"]) == ("app/a.rb", 12, "disc1")


def test_a_failed_gitlab_pipeline_is_a_fix_trigger_on_its_source_branch() -> None:
    payload = gitlab_pipeline_failed("gitlabhq/gitlab-test", CHANGE.head, 31, 7)
    action = gitlab_action(payload, GITLAB)
    assert isinstance(action, CIFailure)
    assert (action.branch, action.ci["pipeline_id"]) == (CHANGE.head, 31)
    payload["object_attributes"]["status"] = "success"
    assert isinstance(gitlab_action(payload, GITLAB), Ignore)


def test_go_gitlabs_published_pipeline_hook_is_read_as_published_and_as_a_failure_on_a_tasuki_branch() -> None:
    published = load_payload("gitlab/pipeline_hook.json")  # go-gitlab's testdata: a pipeline that passed
    assert gitlab_action(published, GITLAB) == Ignore("pipeline not failed")

    failed = load_payload("gitlab/pipeline_hook.json")
    failed["object_attributes"]["status"] = "failed"
    failed["merge_request"]["source_branch"] = CHANGE.head
    action = gitlab_action(failed, GITLAB)
    assert isinstance(action, CIFailure)
    assert (action.owner, action.repo, action.branch) == ("gitlab-org", "gitlab-test", CHANGE.head)
    assert (action.ci["pipeline_id"], action.ci["sha"]) == (31, "bcbb5ec396a2c0f828686f14fac9b80b780504f2")


def test_the_thread_marker_is_trusted_only_for_its_own_branch(redis_client: redis.Redis) -> None:
    body = "Fixes it.\n" + marker(ISSUE_KEY, "tasuki/1-abcdef12", "u-1")
    pull = {**ISSUE_KEY, "task_type": "pull_request", "task_id": "9"}
    thread = parse_marker(body, "pull_request", 9)
    assert thread == Thread(ISSUE_KEY, "pull_request", 9, "tasuki/1-abcdef12", "u-1")
    assert find_thread(redis_client, pull, body, head="tasuki/1-abcdef12") == thread
    assert find_thread(redis_client, pull, body, head="someone-elses-branch") is None  # a copied marker
    assert find_thread(redis_client, pull, body) is None  # no head to check: Redis alone decides
    record_thread(redis_client, Thread(ISSUE_KEY, "pull_request", 9, "tasuki/1-abcdef12", "u-2"))
    assert find_thread(redis_client, pull) == Thread(ISSUE_KEY, "pull_request", 9, "tasuki/1-abcdef12", "u-2")


def test_thread_history_is_the_previous_tasks_latest_and_final_summary(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts")
    ctx = store.create(ISSUE_KEY, {"context_length": 1000})
    ctx.append_message("assistant", "I read calc.py and ran the tests; add() subtracts. " * 20)
    path = ctx.finish("completed", result={"summary": "Fix add()."})
    span = [r for r in jsonl.iter_records(path / MESSAGES_FILE) if r["role"] == "assistant"]
    summary = make_summary_record(span=span, previous=None, text="Found add() subtracting.", now=utc_now())
    JsonlWriter(path / SUMMARIES_FILE, id_field="summary_id", fsync="never").append(summary)

    history = thread_history(store, ctx.uuid)
    assert "Found add() subtracting." in history  # the latest summary
    assert "It ended completed." in history
    assert "Fix add()." in history  # the final summary
    assert thread_history(store, "00000000-0000-4000-8000-000000000000") == ""
