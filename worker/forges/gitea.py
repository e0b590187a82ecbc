"""Gitea's REST API v1 (and Forgejo's, which keeps it) at ``gitea.api_url`` as a :class:`~worker.forges.base.Forge`.

Gitea names labels on an issue by id, not by name: the repository's labels are looked up (and the state
machine's created when missing, as GitHub does on its own). Pull requests are issues here too, so labels and
conversation comments of both live under ``/issues/{index}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from contexts.masking import mask
from worker.forges.base import (
    FailedJob,
    ForgeError,
    ForgeHTTP,
    ItemRef,
    ReviewComment,
    asked_permission,
    basic_auth_env,
)
from worker.forges.repos_api import ReposAPI
from worker.permissions import Level, Person, gitea_level

DEFAULT_PERMISSIONS = ("owner", "admin", "write")
DRAFT_PREFIX = "WIP: "  # a work-in-progress pull request (Gitea's and Forgejo's way of a draft)
LABEL_COLOR = "#ededed"  # a new label needs a colour; the state machine's labels get a quiet grey


class GiteaForge(ReposAPI):
    """Issues, labels, comments and pull requests through ``/repos/{owner}/{repo}/...``."""

    source = "gitea"

    def __init__(self, api_url: str, token: str | None, *, allowed_permissions: Sequence[str] = DEFAULT_PERMISSIONS,
                 timeout_s: float = 30.0, backoff_s: float = 0.5) -> None:
        headers = {"Accept": "application/json", "User-Agent": "tasuki"}
        if token:
            headers["Authorization"] = f"token {token}"
        self.http = ForgeHTTP(api_url, headers, timeout_s=timeout_s, backoff_s=backoff_s)
        self.allowed_permissions = frozenset(allowed_permissions)
        self._token = token

    def move_labels(self, ref: ItemRef, add: Sequence[str], remove: Sequence[str]) -> None:
        """``DELETE .../labels/{id}`` for each present label to remove, then ``POST .../labels`` with the ids of
        the labels to add (created in the repository when missing)."""
        if remove:
            present = _label_ids(self.http.json("GET", self._issue(ref)).get("labels"))
            for name in remove:
                if name in present:
                    self.http.request("DELETE", f"{self._issue(ref)}/labels/{present[name]}", missing_ok=True)
        if add:
            ids = self._repository_labels(ref.owner, ref.repo, add)
            self.http.request("POST", f"{self._issue(ref)}/labels", json={"labels": [ids[name] for name in add]})

    def _repository_labels(self, owner: str, repo: str, names: Sequence[str]) -> dict[str, int]:
        """The ids of the repository's labels ``names``; the missing ones are created."""
        path = f"{self._repo(owner, repo)}/labels"
        known = _label_ids(list(self.http.pages(path, {"limit": 50})))
        for name in names:
            if name not in known:
                known[name] = int(self.http.json("POST", path, json={"name": name, "color": LABEL_COLOR})["id"])
        return known

    def comment(self, ref: ItemRef, body: str, comment_id: int | None = None) -> int:
        """``PATCH .../issues/comments/{id}``, or ``POST .../comments`` (also when the old one was deleted)."""
        if comment_id is not None:
            path = f"{self._repo(ref.owner, ref.repo)}/issues/comments/{comment_id}"
            response = self.http.request("PATCH", path, json={"body": body}, missing_ok=True)
            if response.status_code != 404:
                return comment_id
        return int(self.http.json("POST", f"{self._issue(ref)}/comments", json={"body": body})["id"])

    def open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str, *,
                    draft: bool = False) -> str:
        """The pull request of ``head`` into ``base`` (``GET .../pulls/{base}/{head}``), or one opened now: one per
        branch, whoever asks and how often. A draft's title starts with ``WIP: ``, the first of Gitea's default
        ``WORK_IN_PROGRESS_PREFIXES`` (Forgejo's too): such a pull request cannot be merged until it is taken off."""
        pulls = f"{self._repo(owner, repo)}/pulls"
        found = self._pull_of(pulls, base, head)
        if found is not None:
            return found
        if draft:
            title = f"{DRAFT_PREFIX}{title}"
        body_json = {"title": title, "head": head, "base": base, "body": body}
        created = self.http.request("POST", pulls, json=body_json, answered=(409,))
        if created.status_code == 409:  # "pull request already exists for these targets": opened since we looked
            found = self._pull_of(pulls, base, head)
            if found is None:
                raise ForgeError(f"POST {pulls}: HTTP 409: {mask(created.text)[:300]}")
            return found
        return str(created.json()["html_url"])

    def _pull_of(self, pulls: str, base: str, head: str) -> str | None:
        found = self.http.request("GET", f"{pulls}/{quote(base, safe='')}/{quote(head, safe='/')}", missing_ok=True)
        return str(found.json()["html_url"]) if found.status_code == 200 else None

    def allows(self, ref: ItemRef, trigger: Mapping[str, Any]) -> bool:
        """A comment's author needs one of the allowed repository permissions (a payload names none, and anyone
        may comment on a public repository); changing labels already needs write access to issues."""
        if trigger.get("kind") not in ("comment", "review"):
            return True
        user = trigger.get("user")
        if not isinstance(user, str) or not user:
            return False
        path = f"{self._repo(ref.owner, ref.repo)}/collaborators/{quote(user, safe='')}/permission"
        response = self.http.request("GET", path, missing_ok=True)
        return response.status_code == 200 and response.json().get("permission") in self.allowed_permissions

    def permission(self, owner: str, repo: str, person: Person) -> Level:
        """``GET /repos/{owner}/{repo}/collaborators/{user}/permission`` (the call :meth:`allows` makes); an unknown
        user (404) has none."""
        path = f"{self._repo(owner, repo)}/collaborators/{quote(person.login, safe='')}/permission"
        answer = asked_permission(self.http, path)
        return gitea_level(answer.get("permission")) if isinstance(answer, dict) else Level.NONE

    def review_comments(self, ref: ItemRef, review_id: int) -> list[ReviewComment]:
        """None: Gitea's review webhooks are not follow-up triggers (their payload names no review id)."""
        return []

    def reply_in_thread(self, ref: ItemRef, comment: ReviewComment, body: str) -> None:
        """A conversation comment on the pull request (review threads are not followed up here)."""
        self.comment(ref, body)

    def failed_jobs(self, owner: str, repo: str, ci: Mapping[str, Any], max_lines: int) -> list[FailedJob]:
        """None: Gitea Actions runs are not followed up."""
        return []

    def git_env(self, clone_url: str) -> dict[str, str]:
        """``Authorization: Basic`` with the token as the password for the clone URL's origin (Gitea takes a token
        there whatever the user name)."""
        return basic_auth_env(clone_url, "tasuki", self._token)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()


def _label_ids(labels: Any) -> dict[str, int]:
    """``{name: id}`` of a label list as Gitea answers it (order kept: an issue's labels read in that order)."""
    if not isinstance(labels, list):
        return {}
    return {str(label["name"]): int(label.get("id") or 0) for label in labels
            if isinstance(label, dict) and isinstance(label.get("name"), str)}
