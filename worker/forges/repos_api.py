"""What GitHub's REST API and Gitea's (modelled on it) share: a repository under ``/repos/{owner}/{repo}``, and
issues — pull requests too — with their conversation comments under ``.../issues/{number}``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from worker.forges.base import Comment, ForgeHTTP, Item, ItemRef, Repository


class ReposAPI:
    """The shared half of :class:`~worker.forges.github.GitHubForge` and :class:`~worker.forges.gitea.GiteaForge`."""

    http: ForgeHTTP

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
        """The issue (or pull request) and its conversation comments, oldest first."""
        data = self.http.json("GET", self._issue(ref))
        comments = tuple(
            Comment(int(c["id"]), str((c.get("user") or {}).get("login", "")), str(c.get("body") or ""))
            for c in self.http.pages(f"{self._issue(ref)}/comments", {})
        )
        return Item(ref, str(data.get("title") or ""), str(data.get("body") or ""), str(data.get("html_url") or ""),
                    tuple(label_names(data.get("labels"))), comments)


def label_names(labels: Any) -> Iterable[str]:
    """The names of an issue's ``labels`` list (GitHub and Gitea give objects with a ``name``)."""
    return (str(label["name"]) for label in labels or [] if isinstance(label, dict) and "name" in label)
