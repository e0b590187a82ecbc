"""GitHub's REST API (github.com or Enterprise at ``github.api_url``) as a :class:`~worker.forges.base.Forge`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from worker.forges.base import Comment, ForgeHTTP, Item, ItemRef, Repository, basic_auth_env

API_VERSION = "2022-11-28"


class GitHubForge:
    """Issues, labels, comments and pull requests through ``/repos/{owner}/{repo}/...``."""

    source = "github"

    def __init__(self, api_url: str, token: str | None, *, timeout_s: float = 30.0, backoff_s: float = 0.5) -> None:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION,
                   "User-Agent": "tasuki"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = ForgeHTTP(api_url, headers, timeout_s=timeout_s, backoff_s=backoff_s)
        self._token = token

    @staticmethod
    def _repo(owner: str, repo: str) -> str:
        return f"repos/{quote(owner, safe='')}/{quote(repo, safe='')}"

    def _issue(self, ref: ItemRef) -> str:
        # Pull requests are issues too: labels and conversation comments live under /issues/{number}.
        return f"{self._repo(ref.owner, ref.repo)}/issues/{ref.number}"

    def repository(self, owner: str, repo: str) -> Repository:
        """``GET /repos/{owner}/{repo}``."""
        data = self.http.json("GET", self._repo(owner, repo))
        return Repository(str(data["clone_url"]), str(data.get("default_branch") or "main"))

    def read_item(self, ref: ItemRef) -> Item:
        """The issue (or pull request) and its conversation comments."""
        data = self.http.json("GET", self._issue(ref))
        comments = tuple(
            Comment(int(c["id"]), str((c.get("user") or {}).get("login", "")), str(c.get("body") or ""))
            for c in self.http.pages(f"{self._issue(ref)}/comments", {})
        )
        labels = tuple(str(label["name"]) for label in data.get("labels", []) if isinstance(label, dict))
        return Item(ref, str(data.get("title") or ""), str(data.get("body") or ""), str(data.get("html_url") or ""),
                    labels, comments)

    def move_labels(self, ref: ItemRef, add: Sequence[str], remove: Sequence[str]) -> None:
        """``DELETE .../labels/{name}`` each (404: already gone), then ``POST .../labels``."""
        for name in remove:
            self.http.request("DELETE", f"{self._issue(ref)}/labels/{quote(name, safe='')}", missing_ok=True)
        if add:
            self.http.request("POST", f"{self._issue(ref)}/labels", json={"labels": list(add)})

    def comment(self, ref: ItemRef, body: str, comment_id: int | None = None) -> int:
        """``PATCH .../issues/comments/{id}``, or ``POST .../comments`` (also when the old one was deleted)."""
        if comment_id is not None:
            path = f"{self._repo(ref.owner, ref.repo)}/issues/comments/{comment_id}"
            response = self.http.request("PATCH", path, json={"body": body}, missing_ok=True)
            if response.status_code != 404:
                return comment_id
        return int(self.http.json("POST", f"{self._issue(ref)}/comments", json={"body": body})["id"])

    def open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str) -> str:
        """The pull request of ``head`` (found, or opened now)."""
        pulls = f"{self._repo(owner, repo)}/pulls"
        existing = self.http.json("GET", pulls, params={"head": f"{owner}:{head}", "state": "all"})
        if isinstance(existing, list) and existing:
            return str(existing[0]["html_url"])
        created = self.http.json("POST", pulls, json={"title": title, "head": head, "base": base, "body": body})
        return str(created["html_url"])

    def allows(self, ref: ItemRef, trigger: Mapping[str, Any]) -> bool:
        """Always: the intake already checked the comment's ``author_association`` (labels need triage rights)."""
        return True

    def git_env(self, clone_url: str) -> dict[str, str]:
        """``Authorization: Basic x-access-token:TOKEN`` for the clone URL's origin."""
        return basic_auth_env(clone_url, "x-access-token", self._token)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()
