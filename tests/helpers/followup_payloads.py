"""Deliveries of the follow-up events (SPEC §14) for a given pull/merge request, branch or CI run.

GitHub's are the published octokit examples in ``tests/fixtures/webhooks/github`` with the fields a test
needs changed in memory. GitLab's pipeline event and diff note are built here from the fields GitLab's
"Webhook events" page documents (``object_kind``, ``object_attributes.status/ref/id``, ``merge_request``,
``builds``; a diff note's ``type``, ``position`` and ``discussion_id``): only the fields Tasuki reads and
their neighbours, not a verbatim copy of the page's examples.
"""

from __future__ import annotations

from typing import Any

from tests.helpers.deliveries import load_payload
from tests.helpers.fake_forge import FakeChange, FakeReviewComment


def _repository(payload: dict[str, Any], owner: str, repo: str) -> dict[str, Any]:
    payload["repository"]["owner"]["login"] = owner
    payload["repository"]["name"] = repo
    payload["repository"]["full_name"] = f"{owner}/{repo}"
    return payload


def _pull(payload: dict[str, Any], change: FakeChange) -> None:
    payload["pull_request"]["number"] = change.number
    payload["pull_request"]["body"] = change.body
    payload["pull_request"]["head"]["ref"] = change.head


def review_submitted(change: FakeChange, review_id: int, body: str | None = None) -> dict[str, Any]:
    """``pull_request_review`` submitted (state commented) on ``change``."""
    payload = _repository(load_payload("github/pull_request_review.submitted.json"), change.owner, change.repo)
    _pull(payload, change)
    payload["review"]["id"] = review_id
    payload["review"]["body"] = body
    return payload


def review_comment_created(change: FakeChange, comment: FakeReviewComment) -> dict[str, Any]:
    """``pull_request_review_comment`` created: one line comment of a review on ``change``."""
    payload = _repository(load_payload("github/pull_request_review_comment.created.json"), change.owner,
                          change.repo)
    _pull(payload, change)
    payload["comment"].update(id=comment.id, pull_request_review_id=comment.review_id, body=comment.body,
                              path=comment.path, line=comment.line, original_line=comment.line,
                              diff_hunk=comment.diff_hunk)
    return payload


def pull_comment(change: FakeChange, body: str, association: str = "OWNER") -> dict[str, Any]:
    """``issue_comment`` created on the pull request ``change`` (its conversation)."""
    payload = _repository(load_payload("github/issue_comment.created.json"), change.owner, change.repo)
    payload["issue"].update(number=change.number, body=change.body,
                            pull_request={"url": f"https://api.github.com/repos/x/y/pulls/{change.number}"})
    payload["comment"].update(body=body, author_association=association)
    return payload


def commit_of(run_id: int) -> str:
    """A distinct commit id per CI run (each run of a test is on a new commit unless it says otherwise)."""
    return f"{run_id:040x}"


def workflow_run_failed(owner: str, repo: str, branch: str, run_id: int, sha: str | None = None) -> dict[str, Any]:
    """``workflow_run`` completed with conclusion failure on ``branch``."""
    payload = _repository(load_payload("github/workflow_run.completed.json"), owner, repo)
    payload["workflow_run"].update(id=run_id, head_branch=branch, conclusion="failure",
                                   head_sha=sha or commit_of(run_id))
    return payload


def check_suite_failed(owner: str, repo: str, branch: str, suite_id: int, sha: str | None = None) -> dict[str, Any]:
    """``check_suite`` completed with conclusion failure on ``branch``."""
    payload = _repository(load_payload("github/check_suite.completed.json"), owner, repo)
    payload["check_suite"].update(id=suite_id, head_branch=branch, conclusion="failure",
                                  head_sha=sha or commit_of(suite_id))
    return payload


def gitlab_pipeline_failed(path: str, branch: str, pipeline_id: int, mr_iid: int) -> dict[str, Any]:
    """A ``Pipeline Hook`` with status failed for a merge request's source branch (documented fields)."""
    return {
        "object_kind": "pipeline",
        "object_attributes": {"id": pipeline_id, "iid": 1, "ref": branch, "tag": False, "status": "failed",
                              "sha": f"{pipeline_id:040x}",
                              "detailed_status": "failed", "source": "merge_request_event"},
        "merge_request": {"id": 99, "iid": mr_iid, "title": "x", "source_branch": branch,
                          "target_branch": "main", "state": "opened"},
        "user": {"id": 1, "name": "Tasuki", "username": "tasuki-bot"},
        "project": {"id": 7, "name": path.rsplit("/", 1)[1], "path_with_namespace": path, "default_branch": "main"},
        "builds": [{"id": 1, "stage": "test", "name": "test", "status": "failed", "failure_reason": "script_failure"}],
    }


def gitlab_diff_note(change: FakeChange, note_id: int, body: str, path: str, line: int, discussion: str,
                     user_id: int = 1) -> dict[str, Any]:
    """A ``Note Hook`` for a diff note on the merge request ``change`` (the published MR note, made a
    DiffNote with the documented ``type``, ``position`` and ``discussion_id``)."""
    payload = load_payload("gitlab/note_hook.merge_request.json")
    payload["user"]["id"] = user_id
    payload["project"]["path_with_namespace"] = f"{change.owner}/{change.repo}"
    payload["object_attributes"].update(id=note_id, note=body, type="DiffNote", discussion_id=discussion,
                                        position={"position_type": "text", "old_path": path, "new_path": path,
                                                  "old_line": None, "new_line": line})
    payload["merge_request"].update(iid=change.number, source_branch=change.head, description=change.body)
    return payload


def pull_request_closed(change: FakeChange, *, merged: bool, at: str, review_comments: int = 0) -> dict[str, Any]:
    """``pull_request`` closed on ``change``: merged (at ``at``, ISO 8601) or not (the published example is not)."""
    payload = _repository(load_payload("github/pull_request.closed.json"), change.owner, change.repo)
    _pull(payload, change)
    payload["number"] = change.number
    payload["pull_request"].update(merged=merged, closed_at=at, merged_at=at if merged else None,
                                   review_comments=review_comments, state="closed")
    return payload


def merge_request_hook(change: FakeChange, action: str, at: str) -> dict[str, Any]:
    """GitLab's Merge Request Hook (go-gitlab's example) with ``action`` merge, close or reopen on ``change``."""
    payload = load_payload("gitlab/merge_request_hook.json")
    payload["project"]["path_with_namespace"] = f"{change.owner}/{change.repo}"
    payload["object_attributes"].update(
        action=action, iid=change.number, source_branch=change.head, description=change.body,
        state={"merge": "merged", "close": "closed", "reopen": "opened"}[action],
        merged_at=at if action == "merge" else None, closed_at=at if action == "close" else None,
    )
    return payload
