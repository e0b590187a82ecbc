"""Forge clients (SPEC §5, §8): GitHub REST, GitLab REST v4 and Gitea/Forgejo REST v1 behind one :class:`Forge`
contract, and the registry that names them: a ``task_source`` is a forge exactly when it is a key of
:data:`FORGES` (a new forge is its client's module and one line there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr

from worker.forges.base import Comment, Forge, ForgeError, Item, ItemRef, Repository
from worker.forges.gitea import GiteaForge
from worker.forges.github import GitHubForge
from worker.forges.gitlab import GitLabForge
from worker.settings_models import LabelSettings, Settings

__all__ = [
    "FORGES",
    "Comment",
    "Forge",
    "ForgeError",
    "ForgeKind",
    "GitHubForge",
    "GitLabForge",
    "GiteaForge",
    "Item",
    "ItemRef",
    "Repository",
    "forge_section",
    "is_forge",
    "make_forge",
]


class ForgeSection(Protocol):
    """What the forge-neutral code reads of a forge's settings section."""

    @property
    def bot_login(self) -> str:
        """The bot's account."""
        ...

    @property
    def labels(self) -> LabelSettings:
        """The label state machine's names."""
        ...


@dataclass(frozen=True)
class ForgeKind:
    """One forge as the rest of Tasuki knows it."""

    make: Callable[[Settings], Forge]
    """The client, on its configured API root with its token."""
    section: Callable[[Settings], ForgeSection]
    """Its settings section (bot login, labels)."""
    change_kind: str
    """The ``task_type`` of what a task opens there: ``pull_request`` or ``merge_request``."""


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def _github(settings: Settings) -> Forge:
    return GitHubForge(settings.github.api_url, _secret(settings.secrets.github_token))


def _gitlab(settings: Settings) -> Forge:
    return GitLabForge(settings.gitlab.api_url, _secret(settings.secrets.gitlab_token))


def _gitea(settings: Settings) -> Forge:
    return GiteaForge(settings.gitea.api_url, _secret(settings.secrets.gitea_token),
                      allowed_permissions=settings.gitea.allowed_permissions)


FORGES: dict[str, ForgeKind] = {
    "github": ForgeKind(_github, lambda s: s.github, "pull_request"),
    "gitlab": ForgeKind(_gitlab, lambda s: s.gitlab, "merge_request"),
    "gitea": ForgeKind(_gitea, lambda s: s.gitea, "pull_request"),
}


def is_forge(source: str | None) -> bool:
    """Whether a task source is a forge (not ``local``, not a prompt)."""
    return source in FORGES


def _kind(source: str) -> ForgeKind:
    kind = FORGES.get(source)
    if kind is None:
        raise ForgeError(f"no forge for task source {source!r}")
    return kind


def make_forge(source: str, settings: Settings) -> Forge:
    """The client for ``source`` (a key of :data:`FORGES`), on its configured API root with its token."""
    return _kind(source).make(settings)


def forge_section(source: str, settings: Settings) -> ForgeSection:
    """The settings section of ``source``'s forge."""
    return _kind(source).section(settings)
