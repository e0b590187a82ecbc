"""A person's real permission on a repository (issue 40): each forge's answer on one scale, the configured minimum,
and the Redis cache the intake reads before asking the forge.

The scale is GitHub's roles: none < read < triage < write < maintain < admin. GitLab's access levels and Gitea's
collaborator permissions are mapped onto it, so one ``permissions.minimum`` means the same thing on every forge.
A forge that cannot answer raises :class:`PermissionUnknown`: the caller refuses for now (fail closed) and asks
again later; it never guesses from a payload's ``author_association``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import redis
import redis.asyncio

from contexts.errors import TasukiError
from worker.names import PERMISSION_PREFIX
from worker.settings_models import PermissionSettings


class Level(IntEnum):
    """A repository permission; a larger value may do everything a smaller one may."""

    NONE = 0
    READ = 1
    TRIAGE = 2
    WRITE = 3
    MAINTAIN = 4
    ADMIN = 5

    @classmethod
    def named(cls, name: str) -> Level:
        """The level of a name of the scale (``write``); an unknown name is NONE (never more than was said)."""
        return cls.__members__.get(name.upper(), cls.NONE)

    def __str__(self) -> str:
        return self.name.lower()


class PermissionUnknown(TasukiError):
    """The forge could not say (5xx, timeout, a suspended installation, a refused token): refuse, ask later."""


@dataclass(frozen=True)
class Person:
    """Who is behind a trigger: the forge login (GitLab: username) and, where the forge names people by number
    (GitLab's members API), the user id."""

    login: str
    user_id: int | None = None


GITHUB_ROLES = {"admin": Level.ADMIN, "maintain": Level.MAINTAIN, "write": Level.WRITE, "triage": Level.TRIAGE,
                "read": Level.READ, "none": Level.NONE}


def github_level(answer: Mapping[str, Any]) -> Level:
    """``GET /repos/{o}/{r}/collaborators/{user}/permission``: ``role_name`` (admin, maintain, write, triage, read)
    when it is one of GitHub's base roles, else ``permission`` (which folds maintain into write and triage into
    read; a custom role's name says nothing of its base, so the folded answer is the safe one)."""
    role = answer.get("role_name")
    if isinstance(role, str) and role in GITHUB_ROLES:
        return GITHUB_ROLES[role]
    permission = answer.get("permission")
    return GITHUB_ROLES.get(permission, Level.NONE) if isinstance(permission, str) else Level.NONE


def gitlab_level(access_level: Any) -> Level:
    """``GET /projects/:id/members/all/:user_id``'s ``access_level``: guest 10 reads, planner 15 and reporter 20
    triage (labels), developer 30 writes (pushes), maintainer 40 maintains, owner 50 administers."""
    if not isinstance(access_level, int) or isinstance(access_level, bool):
        return Level.NONE
    for least, level in ((50, Level.ADMIN), (40, Level.MAINTAIN), (30, Level.WRITE), (15, Level.TRIAGE),
                         (10, Level.READ)):
        if access_level >= least:
            return level
    return Level.NONE


def gitea_level(permission: Any) -> Level:
    """Gitea's and Forgejo's collaborator ``permission``: owner and admin administer, write writes, read reads."""
    names = {"owner": Level.ADMIN, "admin": Level.ADMIN, "write": Level.WRITE, "read": Level.READ}
    return names.get(permission, Level.NONE) if isinstance(permission, str) else Level.NONE


def minimum(settings: PermissionSettings, owner: str, repo: str) -> Level:
    """The least level that may trigger on ``owner/repo``: its own entry of ``permissions.repositories``, else
    ``permissions.minimum``."""
    wanted = f"{owner}/{repo}".lower()
    for name, level in settings.repositories.items():
        if name.lower() == wanted:
            return Level.named(level)
    return Level.named(settings.minimum)


def cache_key(source: str, owner: str, repo: str, login: str) -> str:
    """The Redis key of one person's level on one repository of one forge (names compared without case)."""
    return f"{PERMISSION_PREFIX}{source}:{owner.lower()}/{repo.lower()}:{login.lower()}"


def _cached(raw: bytes | str | None) -> Level | None:
    if raw is None:
        return None
    return Level.named(raw.decode() if isinstance(raw, bytes) else raw)


class PermissionCache:
    """Levels the forge gave, for ``permissions.cache_s``; dropped for a person when the forge says their
    membership changed."""

    def __init__(self, client: redis.Redis, async_client: redis.asyncio.Redis | None, ttl_s: int) -> None:
        self.client = client
        self.async_client = async_client
        self.ttl_s = ttl_s

    async def get_async(self, source: str, owner: str, repo: str, login: str) -> Level | None:
        """The cached level, from the event loop (one GET); None: not known."""
        if self.async_client is None or not self.ttl_s:
            return None
        return _cached(await self.async_client.get(cache_key(source, owner, repo, login)))

    def get(self, source: str, owner: str, repo: str, login: str) -> Level | None:
        """The cached level (one GET); None: not known."""
        return _cached(self.client.get(cache_key(source, owner, repo, login))) if self.ttl_s else None

    def put(self, source: str, owner: str, repo: str, login: str, level: Level) -> None:
        """Keep what the forge said for ``ttl_s``."""
        if self.ttl_s:
            self.client.set(cache_key(source, owner, repo, login), str(level), ex=self.ttl_s)

    def drop(self, source: str, login: str, owner: str = "") -> int:
        """Forget ``login``'s levels on ``source`` (on every repository of ``owner``, or everywhere: a team's or an
        organization's membership reaches repositories the event does not name). Returns how many were dropped."""
        scope = f"{_glob(owner.lower())}/*" if owner else "*"
        pattern = f"{PERMISSION_PREFIX}{_glob(source)}:{scope}:{_glob(login.lower())}"
        keys = list(self.client.scan_iter(match=pattern, count=500))
        return int(self.client.delete(*keys)) if keys else 0


def _glob(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)
