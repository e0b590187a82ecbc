"""GitLab's REST API v4 (gitlab.com or self-managed at ``gitlab.api_url``) as a :class:`~worker.forges.base.Forge`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from contexts.masking import mask
from worker.forges.base import (
    Comment,
    FailedJob,
    ForgeError,
    ForgeHTTP,
    ForgeRefused,
    Item,
    ItemRef,
    Repository,
    ReviewComment,
    asked_permission,
    basic_auth_env,
    log_tail,
    unreadable,
)
from worker.permissions import Level, Person, gitlab_level

DRAFT_PREFIX = "Draft: "  # a merge request whose title starts so is a draft (GitLab's "Draft merge requests")
DEVELOPER_ACCESS = 30  # GitLab's access level that may push branches; lower roles may not start a task by a note
_COLLECTIONS = {"issue": "issues", "merge_request": "merge_requests"}


class GitLabForge:
    """Issues, merge requests, labels and notes through ``/projects/{namespace%2Fproject}/...``."""

    source = "gitlab"

    def __init__(self, api_url: str, token: str | None, *, timeout_s: float = 30.0, backoff_s: float = 0.5) -> None:
        headers = {"User-Agent": "tasuki"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = ForgeHTTP(api_url, headers, timeout_s=timeout_s, backoff_s=backoff_s)
        self._token = token

    @staticmethod
    def _project(owner: str, repo: str) -> str:
        return f"projects/{quote(f'{owner}/{repo}', safe='')}"

    def _item(self, ref: ItemRef) -> str:
        collection = _COLLECTIONS.get(ref.kind, "issues")
        return f"{self._project(ref.owner, ref.repo)}/{collection}/{ref.number}"

    def repository(self, owner: str, repo: str) -> Repository:
        """``GET /projects/:id``."""
        data = self.http.json("GET", self._project(owner, repo))
        return Repository(str(data["http_url_to_repo"]), str(data.get("default_branch") or "main"))

    def read_item(self, ref: ItemRef) -> Item:
        """The issue or merge request and its notes, oldest first, without system notes."""
        data = self.http.json("GET", self._item(ref))
        notes = tuple(
            Comment(int(n["id"]), str((n.get("author") or {}).get("username", "")), str(n.get("body") or ""))
            for n in self.http.pages(f"{self._item(ref)}/notes", {"sort": "asc", "order_by": "created_at"})
            if not n.get("system")
        )
        labels = tuple(str(label) for label in data.get("labels", []) if isinstance(label, str))
        return Item(ref, str(data.get("title") or ""), str(data.get("description") or ""),
                    str(data.get("web_url") or ""), labels, notes)

    def move_labels(self, ref: ItemRef, add: Sequence[str], remove: Sequence[str]) -> None:
        """One ``PUT`` with ``add_labels`` and ``remove_labels``."""
        changes = {key: ",".join(names) for key, names in (("add_labels", add), ("remove_labels", remove)) if names}
        if changes:
            self.http.request("PUT", self._item(ref), json=changes)

    def comment(self, ref: ItemRef, body: str, comment_id: int | None = None) -> int:
        """``PUT .../notes/{id}``, or ``POST .../notes`` (also when the old note was deleted)."""
        if comment_id is not None:
            response = self.http.request("PUT", f"{self._item(ref)}/notes/{comment_id}", json={"body": body},
                                         missing_ok=True)
            if response.status_code != 404:
                return comment_id
        return int(self.http.json("POST", f"{self._item(ref)}/notes", json={"body": body})["id"])

    def open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str, *,
                    draft: bool = False) -> str:
        """The merge request of ``head`` (found, or opened now): one per branch, whoever asks and how often. A draft's
        title starts with ``Draft: ``, which is how GitLab marks one as it is created."""
        requests = f"{self._project(owner, repo)}/merge_requests"
        found = self._request_of(requests, head)
        if found is not None:
            return found
        if draft:
            title = f"{DRAFT_PREFIX}{title}"
        body_json = {"source_branch": head, "target_branch": base, "title": title, "description": body}
        created = self.http.request("POST", requests, json=body_json, answered=(409,))
        if created.status_code == 409:  # "Another open merge request already exists for this source branch"
            found = self._request_of(requests, head)
            if found is None:
                raise ForgeError(f"POST {requests}: HTTP 409: {mask(created.text)[:300]}")
            return found
        return str(created.json()["web_url"])

    def _request_of(self, requests: str, head: str) -> str | None:
        existing = self.http.json("GET", requests, params={"source_branch": head})
        return str(existing[0]["web_url"]) if isinstance(existing, list) and existing else None

    def allows(self, ref: ItemRef, trigger: Mapping[str, Any]) -> bool:
        """A note's author needs Developer access (anyone may comment on a public project); labels need Planner."""
        if trigger.get("kind") not in ("comment", "review"):  # labels need Planner; CI fixes follow the bot's push
            return True
        user_id = trigger.get("user_id")
        if not isinstance(user_id, int):
            return False
        path = f"{self._project(ref.owner, ref.repo)}/members/all/{user_id}"
        response = self.http.request("GET", path, missing_ok=True)
        return response.status_code == 200 and int(response.json().get("access_level", 0)) >= DEVELOPER_ACCESS

    def permission(self, owner: str, repo: str, person: Person) -> Level:
        """``GET /projects/:id/members/all/:user_id`` (inherited memberships too); a person named only by username is
        found first (``GET /users?username=``). Not a member (404), or no such user: none."""
        user_id = person.user_id
        if user_id is None:
            found = asked_permission(self.http, "users", {"username": person.login})
            first = found[0] if isinstance(found, list) and found and isinstance(found[0], dict) else {}
            user_id = first.get("id") if isinstance(first.get("id"), int) else None
            if user_id is None:
                return Level.NONE
        answer = asked_permission(self.http, f"{self._project(owner, repo)}/members/all/{int(user_id)}")
        return gitlab_level(answer.get("access_level")) if isinstance(answer, dict) else Level.NONE

    def review_comments(self, ref: ItemRef, review_id: int) -> list[ReviewComment]:
        """None to fetch: a GitLab note's webhook carries its text and position."""
        return []

    def reply_in_thread(self, ref: ItemRef, comment: ReviewComment, body: str) -> None:
        """``POST .../merge_requests/{iid}/discussions/{discussion_id}/notes`` (a plain note without one)."""
        if comment.thread:
            path = f"{self._item(ref)}/discussions/{quote(comment.thread, safe='')}/notes"
            self.http.request("POST", path, json={"body": body})
        else:
            self.comment(ref, body)

    def failed_jobs(self, owner: str, repo: str, ci: Mapping[str, Any], max_lines: int) -> list[FailedJob]:
        """The failed jobs of pipeline ``pipeline_id`` with the tails of their traces."""
        project = self._project(owner, repo)
        jobs = self.http.pages(f"{project}/pipelines/{int(ci.get('pipeline_id') or 0)}/jobs", {"scope[]": "failed"})
        found = []
        for job in jobs:
            if isinstance(job, dict) and job.get("status") == "failed":
                found.append(FailedJob(str(job.get("name") or job["id"]), self._trace(project, int(job["id"]),
                                                                                      max_lines)))
        return found

    def _trace(self, project: str, job_id: int, max_lines: int) -> str:
        try:
            return log_tail(self.http.request("GET", f"{project}/jobs/{job_id}/trace").text, max_lines)
        except ForgeRefused as exc:
            return f"({unreadable('the log', exc)})"

    def git_env(self, clone_url: str) -> dict[str, str]:
        """``Authorization: Basic oauth2:TOKEN`` for the clone URL's origin."""
        return basic_auth_env(clone_url, "oauth2", self._token)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()
