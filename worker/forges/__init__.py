"""Forge clients (SPEC §5, §8): GitHub REST and GitLab REST v4 behind one :class:`Forge` contract."""

from __future__ import annotations

from worker.forges.base import Comment, Forge, ForgeError, Item, ItemRef, Repository
from worker.forges.github import GitHubForge
from worker.forges.gitlab import GitLabForge
from worker.settings_models import Settings

__all__ = [
    "Comment",
    "Forge",
    "ForgeError",
    "GitHubForge",
    "GitLabForge",
    "Item",
    "ItemRef",
    "Repository",
    "make_forge",
]


def make_forge(source: str, settings: Settings) -> GitHubForge | GitLabForge:
    """The client for ``source`` (``github`` or ``gitlab``), on its configured API root with its token."""
    if source == "github":
        token = settings.secrets.github_token
        return GitHubForge(settings.github.api_url, token.get_secret_value() if token else None)
    if source == "gitlab":
        token = settings.secrets.gitlab_token
        return GitLabForge(settings.gitlab.api_url, token.get_secret_value() if token else None)
    raise ForgeError(f"no forge for task source {source!r}")
