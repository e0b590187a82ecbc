"""Roles and admission (issue 40): the pure rules the console's sign-in and the API's tokens share."""

from __future__ import annotations

import pytest

from worker.auth_settings import AuthSettings
from worker.roles import Role, admitted, allows, role_of, team_of

AUTH = AuthSettings.model_validate({
    "admit": {"groups": ["staff"], "email_domains": ["Example.com"]},
    "roles": {"admin": ["platform"], "operator": ["oncall", "dev"], "viewer": ["auditors"]},
    "teams": {"payments": ["pay-devs"], "search": ["search-devs", "dev"]},
})


@pytest.mark.parametrize(("groups", "email", "expected"), [
    (["staff"], "", Role.VIEWER),  # admitted by group, no role group
    ([], "ann@example.com", Role.VIEWER),  # admitted by domain (case-insensitive)
    ([], "ann@EXAMPLE.COM", Role.VIEWER),
    (["staff", "oncall"], "", Role.OPERATOR),
    (["dev", "platform"], "", Role.ADMIN),  # the highest role wins
    (["platform"], "", Role.ADMIN),  # a role's group admits by itself
    (["auditors"], "", Role.VIEWER),
    ([], "ann@example.com.evil.org", None),  # a domain is matched whole, never as a prefix
    ([], "ann@notexample.com", None),
    ([], "example.com", None),  # no @: no domain
    (["Staff"], "", None),  # groups are matched exactly
    ([], "", None),
])
def test_role_of_admits_by_group_or_domain_and_takes_the_highest_role(
    groups: list[str], email: str, expected: Role | None
) -> None:
    assert role_of(groups, email, AUTH) == expected


def test_nobody_is_admitted_when_nothing_is_configured() -> None:
    empty = AuthSettings()
    assert not admitted(["staff", "platform"], "ann@example.com", empty)
    assert role_of(["admins"], "root@localhost", empty) is None


def test_allows_orders_the_roles() -> None:
    assert [allows(r, Role.OPERATOR) for r in Role] == [False, True, True]
    assert [allows(r, Role.ADMIN) for r in Role] == [False, False, True]
    assert all(allows(r, Role.VIEWER) for r in Role)
    assert [r.label for r in Role] == ["viewer", "operator", "admin"]


def test_team_of_takes_the_first_configured_team() -> None:
    assert team_of(["dev", "pay-devs"], AUTH) == "payments"
    assert team_of(["dev"], AUTH) == "search"
    assert team_of(["staff"], AUTH) is None


def test_an_issuer_needs_a_client_id() -> None:
    with pytest.raises(ValueError, match="client id"):
        AuthSettings.model_validate({"oidc": {"issuer": "https://id.example.com"}})
    assert AuthSettings.model_validate(
        {"oidc": {"issuer": "https://id.example.com", "client_id": "tasuki"}}).oidc.configured
    assert not AuthSettings().oidc.configured
