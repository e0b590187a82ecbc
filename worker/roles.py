"""Roles (issue 40): viewer < operator < admin, from the provider's groups; who is admitted at all. Pure: the
console's sign-in and the API's tokens both ask here, so both rooms answer the same question the same way."""

from __future__ import annotations

from collections.abc import Collection
from enum import IntEnum

from worker.auth_settings import AuthSettings


class Role(IntEnum):
    """What a signed-in person may do; a higher role may do everything a lower one may."""

    VIEWER = 1  # read: fleet, tasks, contexts, evals
    OPERATOR = 2  # submit, cancel, retry, follow-ups
    ADMIN = 3  # budgets, settings, tokens, the audit log

    @property
    def label(self) -> str:
        """``viewer``, ``operator`` or ``admin``."""
        return self.name.lower()


def email_domain(email: str) -> str:
    """The domain of an address, lower-cased; empty when there is none."""
    local, at, domain = email.strip().rpartition("@")
    return domain.lower() if at and local and domain else ""


def admitted(groups: Collection[str], email: str, settings: AuthSettings) -> bool:
    """Whether a person may sign in: in an admitted group or a role's group, or of an admitted e-mail domain.
    ``email`` must be one the provider verified (the caller passes "" otherwise)."""
    role_groups = {*settings.roles.admin, *settings.roles.operator, *settings.roles.viewer}
    if set(groups) & ({*settings.admit.groups} | role_groups):
        return True
    domain = email_domain(email)
    return bool(domain) and domain in {d.lower().lstrip("@") for d in settings.admit.email_domains}


def role_of(groups: Collection[str], email: str, settings: AuthSettings) -> Role | None:
    """The person's role: the highest whose groups they are in, viewer when admitted through no role group;
    None when not admitted."""
    if not admitted(groups, email, settings):
        return None
    held = set(groups)
    for role, role_groups in ((Role.ADMIN, settings.roles.admin), (Role.OPERATOR, settings.roles.operator)):
        if held & set(role_groups):
            return role
    return Role.VIEWER


def allows(role: Role, needed: Role) -> bool:
    """Whether ``role`` may do what needs ``needed``."""
    return role >= needed


def team_of(groups: Collection[str], settings: AuthSettings) -> str | None:
    """The first team (in configuration order) whose groups hold the person; None: no team."""
    held = set(groups)
    return next((team for team, team_groups in settings.teams.items() if held & set(team_groups)), None)
