"""Forge clients (SPEC §5, §8): GitHub REST, GitLab REST v4 and Gitea/Forgejo REST v1 behind one :class:`Forge`
contract, and the registry that names them: a ``task_source`` is a forge exactly when it is a key of
:data:`FORGES` (a new forge is its client's module and one line there)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr

from worker.forges.base import Comment, CredentialError, Forge, ForgeError, Item, ItemRef, Repository
from worker.forges.gitea import GiteaForge
from worker.forges.github import GitHubForge
from worker.forges.github_app import InstallationCredential, github_app
from worker.forges.gitlab import GitLabForge
from worker.settings_models import LabelSettings, Settings

__all__ = [
    "FORGES",
    "Comment",
    "CredentialError",
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
    "installation_of",
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

    make: Callable[[Settings, Mapping[str, str], Mapping[str, object]], Forge]
    """The client, on its configured API root with its credential, for a task key and the trigger that came in
    (a GitHub App's webhook names its installation)."""
    section: Callable[[Settings], ForgeSection]
    """Its settings section (bot login, labels)."""
    change_kind: str
    """The ``task_type`` of what a task opens there: ``pull_request`` or ``merge_request``."""


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def _github(settings: Settings, task_key: Mapping[str, str], trigger: Mapping[str, object]) -> Forge:
    if settings.github.auth == "app":
        return _github_app(settings, task_key, installation_of(trigger))
    return GitHubForge(settings.github.api_url, _secret(settings.secrets.github_token))


def _github_app(settings: Settings, task_key: Mapping[str, str], installation: int | None) -> GitHubForge:
    """Tokens of the App's ``installation`` (else of the one holding the task key's repository), valid at each
    call, and the App's bot as git's author."""
    key, app_id = settings.secrets.github_app_private_key, settings.github.app_id
    if key is None or app_id is None:
        raise CredentialError("github.auth is app but the App's private key is not in GITHUB_APP_PRIVATE_KEY "
                              "(or a file named by GITHUB_APP_PRIVATE_KEY_PATH)")
    app = github_app(settings.github.api_url, app_id, key.get_secret_value())
    credential = InstallationCredential(app, task_key.get("owner", ""), task_key.get("repo", ""), installation)
    return GitHubForge(settings.github.api_url, credential, identity=credential.identity)


def installation_of(trigger: Mapping[str, object]) -> int | None:
    """The GitHub App installation a task's trigger came through (its webhook's ``installation.id``)."""
    value = trigger.get("installation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gitlab(settings: Settings, task_key: Mapping[str, str], trigger: Mapping[str, object]) -> Forge:
    return GitLabForge(settings.gitlab.api_url, _secret(settings.secrets.gitlab_token))


def _gitea(settings: Settings, task_key: Mapping[str, str], trigger: Mapping[str, object]) -> Forge:
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


def make_forge(source: str, settings: Settings, task_key: Mapping[str, str] | None = None,
               trigger: Mapping[str, object] | None = None) -> Forge:
    """The client for ``source`` (a key of :data:`FORGES`), on its configured API root with its credential, for
    the task key's repository and the trigger it came in by."""
    return _kind(source).make(settings, task_key or {}, trigger or {})


def forge_section(source: str, settings: Settings) -> ForgeSection:
    """The settings section of ``source``'s forge."""
    return _kind(source).section(settings)
