"""Events that change who may do what on a repository (issue 40): the cached permissions they touch are dropped.

GitHub: ``member`` (a collaborator added, removed or changed on a repository), ``membership`` (a person added to
or removed from a team), ``organization`` (a member added, removed or invited), ``team`` (a team's access to a
repository changed: every member of the organization is dropped, the event names no people). GitLab: a group's
Member Hook (``event_name`` ``user_add_to_group``, ``user_remove_from_group``, ``user_update_for_group``, …) and
the system hook's project member events (``user_add_to_team``, ``user_remove_from_team``, ``user_update_for_team``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhooks.payload import get, text

GITLAB_MEMBER_EVENTS = ("_to_group", "_from_group", "_for_group", "_to_team", "_from_team", "_for_team")


@dataclass(frozen=True)
class MembershipChanged:
    """``login``'s permissions on ``source`` under ``owner`` (a user, organization or group path) may have changed;
    ``login`` empty: everyone's under ``owner``."""

    source: str
    owner: str
    login: str


def github_membership(event: str, payload: dict[str, Any]) -> MembershipChanged | None:
    """A GitHub event that changes memberships; None for any other."""
    if event == "member":
        owner, login = text(get(payload, "repository", "owner", "login")), text(get(payload, "member", "login"))
    elif event == "membership":
        owner, login = text(get(payload, "organization", "login")), text(get(payload, "member", "login"))
    elif event == "organization":
        owner, login = text(get(payload, "organization", "login")), text(get(payload, "membership", "user", "login"))
    elif event == "team":
        owner, login = text(get(payload, "organization", "login")), ""
    else:
        return None
    return MembershipChanged("github", owner, login) if owner else None


def gitlab_membership(payload: dict[str, Any]) -> MembershipChanged | None:
    """A GitLab group or project member event; None for any other payload."""
    name = text(get(payload, "event_name"))
    if not name.startswith("user_") or not name.endswith(GITLAB_MEMBER_EVENTS):
        return None
    login = text(get(payload, "user_username"))
    project = text(get(payload, "project_path_with_namespace"))
    owner = project.rsplit("/", 1)[0] if "/" in project else text(get(payload, "group_path"))
    return MembershipChanged("gitlab", owner, login) if owner and login else None
