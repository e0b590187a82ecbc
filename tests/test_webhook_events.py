"""Which published example deliveries start a task, cancel one, or are ignored (SPEC §8)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.helpers.deliveries import load_payload
from webhooks.events import Cancel, Ignore, Note, Trigger, github_action, gitlab_action, mentions
from worker.settings_models import GitHubSettings, GitLabSettings, LabelSettings

# The examples label issues "bug" (GitHub) and "Platform" (GitLab): make those the trigger labels.
GITHUB = GitHubSettings(labels=LabelSettings(trigger="bug", processing="bug"))
GITLAB = GitLabSettings(labels=LabelSettings(trigger="Platform", processing="API"))


def github(name: str, **changes: Any) -> dict[str, Any]:
    payload = load_payload(f"github/{name}.json")
    for path, value in changes.items():
        node = payload
        *parents, last = path.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return payload


def gitlab_note(note: str, name: str = "note_hook.issue") -> dict[str, Any]:
    payload = load_payload(f"gitlab/{name}.json")
    payload["object_attributes"]["note"] = note
    return payload


# -- GitHub ----------------------------------------------------------------------------------------


def test_github_issue_labeled_with_the_trigger_label_starts_a_task() -> None:
    action = github_action("issues", github("issues.labeled"), GITHUB)

    assert isinstance(action, Trigger)
    assert action.task_key == {"task_source": "github", "owner": "Codertocat", "repo": "Hello-World",
                               "task_type": "issue", "task_id": "1"}
    assert action.user == "Codertocat"
    assert action.issue["title"] == "Spelling error in the README file"
    assert action.issue["labels"] == ["bug"]  # what attempts.labels reads (docs/attempts.md)
    assert action.trigger["kind"] == "label"


def test_github_issue_labeled_with_another_label_is_ignored() -> None:
    settings = GitHubSettings()  # trigger "coding agent"
    assert isinstance(github_action("issues", github("issues.labeled"), settings), Ignore)


def test_github_processing_label_removed_cancels() -> None:
    action = github_action("issues", github("issues.unlabeled"), GITHUB)
    assert isinstance(action, Cancel)
    assert action.task_key["task_id"] == "1"


def test_github_comment_with_the_mention_from_an_owner_starts_a_task_with_the_comment_as_prompt() -> None:
    payload = github("issue_comment.created", comment__body="> earlier @tasuki text\n@tasuki please fix the typo")
    action = github_action("issue_comment", payload, GITHUB)

    assert isinstance(action, Trigger)
    assert action.task_key["task_type"] == "issue"
    assert action.prompt == "@tasuki please fix the typo"
    assert action.trigger == {"kind": "comment", "user": "Codertocat"}


def test_github_comment_on_a_pull_request_starts_a_pull_request_task() -> None:
    payload = github("issue_comment.created", comment__body="@tasuki rebase this")
    payload["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
    action = github_action("issue_comment", payload, GITHUB)
    assert isinstance(action, Trigger)
    assert action.task_key["task_type"] == "pull_request"


@pytest.mark.parametrize(
    ("body", "association"),
    [
        ("You are totally right! I'll get this fixed right away.", "OWNER"),  # the example as published
        ("@tasuki please fix", "NONE"),  # not an allowed association
        ("@tasuki please fix", "CONTRIBUTOR"),
        ("> @tasuki please fix\nquoted only", "OWNER"),
        ("```\n@tasuki in a code block\n```", "OWNER"),
        ("ping @tasuki-bot or @tasukibot", "OWNER"),  # other accounts
        ("mail me at someone@tasuki", "OWNER"),
    ],
)
def test_github_comment_without_an_allowed_live_mention_starts_nothing(body: str, association: str) -> None:
    payload = github("issue_comment.created", comment__body=body, comment__author_association=association)
    action = github_action("issue_comment", payload, GITHUB)
    # An allowed author's plain comment is at most a Note: only a task already running on the issue hears it.
    assert isinstance(action, (Note, Ignore))
    if association != "OWNER":
        assert isinstance(action, Ignore)


def test_github_cancel_command_cancels_and_needs_an_allowed_association() -> None:
    payload = github("issue_comment.created", comment__body="Stop please.\n/tasuki cancel\n")
    assert isinstance(github_action("issue_comment", payload, GITHUB), Cancel)
    payload["comment"]["author_association"] = "NONE"
    assert isinstance(github_action("issue_comment", payload, GITHUB), Ignore)


def test_github_events_sent_by_the_bot_are_ignored() -> None:
    settings = GitHubSettings(bot_login="Codertocat", labels=LabelSettings(trigger="bug"))
    assert github_action("issues", github("issues.labeled"), settings) == Ignore("sent by the bot")


def test_github_edited_comments_and_other_events_are_ignored() -> None:
    edited = github("issue_comment.created", action="edited", comment__body="@tasuki go")
    assert isinstance(github_action("issue_comment", edited, GITHUB), Ignore)
    assert isinstance(github_action("star", github("issues.labeled"), GITHUB), Ignore)


@pytest.mark.parametrize("broken", ["issue", "repository", "sender", "label"])
def test_github_payload_with_a_part_of_the_wrong_shape_is_ignored(broken: str) -> None:
    payload = github("issues.labeled")
    payload[broken] = ["not", "an", "object"]
    assert isinstance(github_action("issues", payload, GITHUB), Ignore)


# -- GitLab ----------------------------------------------------------------------------------------


def test_gitlab_issue_hook_adding_the_trigger_label_starts_a_task() -> None:
    action = gitlab_action(load_payload("gitlab/issue_hook.json"), GITLAB)

    assert isinstance(action, Trigger)
    assert action.task_key == {"task_source": "gitlab", "owner": "gitlabhq", "repo": "gitlab-test",
                               "task_type": "issue", "task_id": "23"}
    assert action.issue["title"] == "New API: create/update/delete file"
    assert action.trigger == {"kind": "label", "user": "root", "user_id": 1}


def test_gitlab_issue_hook_keeping_the_trigger_label_is_ignored() -> None:
    settings = GitLabSettings(labels=LabelSettings(trigger="API"))  # present before and after
    payload = load_payload("gitlab/issue_hook.json")
    payload["changes"]["labels"]["current"].append(copy.deepcopy(payload["changes"]["labels"]["previous"][0]))
    assert isinstance(gitlab_action(payload, settings), Ignore)


def test_gitlab_issue_hook_removing_the_processing_label_cancels() -> None:
    assert isinstance(gitlab_action(load_payload("gitlab/issue_hook.json"),
                                    GitLabSettings(labels=LabelSettings(processing="API"))), Cancel)


def test_gitlab_issue_hook_without_label_changes_is_ignored() -> None:
    payload = load_payload("gitlab/issue_hook.json")
    del payload["changes"]["labels"]
    assert isinstance(gitlab_action(payload, GITLAB), Ignore)


def test_gitlab_note_with_the_mention_starts_a_task_on_the_issue() -> None:
    action = gitlab_action(gitlab_note("@tasuki please look"), GITLAB)

    assert isinstance(action, Trigger)
    assert action.task_key == {"task_source": "gitlab", "owner": "gitlab-org", "repo": "gitlab-test",
                               "task_type": "issue", "task_id": "17"}
    assert action.trigger == {"kind": "comment", "user": "root", "user_id": 1}


def test_gitlab_note_on_a_merge_request_starts_a_merge_request_task() -> None:
    action = gitlab_action(gitlab_note("@tasuki fix the build", "note_hook.merge_request"), GITLAB)
    assert isinstance(action, Trigger)
    assert action.task_key["task_type"] == "merge_request"
    assert action.task_key["task_id"] == "1"


def test_gitlab_published_notes_without_the_mention_start_nothing() -> None:
    # Notes: only a task already running on the issue or merge request hears them.
    assert isinstance(gitlab_action(load_payload("gitlab/note_hook.issue.json"), GITLAB), Note)
    assert isinstance(gitlab_action(load_payload("gitlab/note_hook.merge_request.json"), GITLAB), Note)


def test_gitlab_cancel_command_system_notes_edits_and_the_bot() -> None:
    assert isinstance(gitlab_action(gitlab_note("/tasuki cancel"), GITLAB), Cancel)
    system = gitlab_note("@tasuki added label")
    system["object_attributes"]["system"] = True
    assert isinstance(gitlab_action(system, GITLAB), Ignore)
    edited = gitlab_note("@tasuki go")
    edited["object_attributes"]["action"] = "update"
    assert isinstance(gitlab_action(edited, GITLAB), Ignore)
    assert gitlab_action(gitlab_note("@tasuki go"), GitLabSettings(bot_login="root")) == Ignore("sent by the bot")


def test_mention_is_case_insensitive_and_word_bounded() -> None:
    assert mentions("Hey @Tasuki, can you?", "@tasuki")
    assert mentions("(@tasuki)", "@tasuki")
    assert not mentions("@tasuki_bot", "@tasuki")
    assert not mentions("x@tasuki", "@tasuki")


@pytest.mark.parametrize("value", [["Issue"], {"a": 1}, 3, None])
def test_gitlab_note_with_a_noteable_type_of_the_wrong_type_is_ignored(value: object) -> None:
    """Found by tests/test_webhook_fuzz.py: a list here once raised TypeError (a 500)."""
    payload = gitlab_note("@tasuki go")
    payload["object_attributes"]["noteable_type"] = value
    assert isinstance(gitlab_action(payload, GITLAB), Ignore)
