"""The ``auth`` section (issue 40): who may sign in to the console and the API, through which OpenID Connect
provider, with which role, and whether the old shared console token still works (break-glass).

Secrets never live here: the provider's client secret comes from the environment variable ``client_secret_env``
names (``settings.secrets.oidc_client_secret``), the session key from ``TASUKI_CONSOLE_SESSION_SECRET``.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, Field, model_validator

from contexts.sections import HashableDict, HttpUrl, Name, PositiveInt, Section, cross_field_error

DEFAULT_CLIENT_SECRET_ENV = "TASUKI_OIDC_CLIENT_SECRET"  # noqa: S105 - the variable's name, not a secret


class OIDCSettings(Section):
    issuer: HttpUrl | None = None
    """The OpenID Connect provider's issuer URL (its discovery document is {issuer}/.well-known/openid-configuration);
    null: no sign-in through a provider."""
    client_id: str | None = None
    """The console's client id at the provider."""
    client_secret_env: Name = DEFAULT_CLIENT_SECRET_ENV
    """The environment variable holding the client secret (unset: a public client, PKCE only)."""
    scopes: tuple[Name, ...] = ("openid", "email", "profile", "groups")
    """Scopes asked for; openid is always sent."""
    groups_claim: Name = "groups"
    """The ID token (or userinfo) claim listing the person's groups."""

    @property
    def configured(self) -> bool:
        """Whether people can sign in through a provider."""
        return self.issuer is not None and bool(self.client_id)

    @model_validator(mode="after")
    def _client_with_issuer(self) -> Self:
        if self.issuer is not None and not self.client_id:
            raise cross_field_error("client_id", self.client_id, "the client id registered at the issuer")
        return self


class AdmitSettings(Section):
    groups: tuple[Name, ...] = ()
    """Provider groups whose members may sign in (members of a role's groups may too)."""
    email_domains: tuple[Name, ...] = ()
    """E-mail domains (verified by the provider) whose people may sign in, e.g. example.com."""


class RoleGroups(Section):
    admin: tuple[Name, ...] = ()
    """Groups whose members are admins: budgets, settings, tokens, the audit log."""
    operator: tuple[Name, ...] = ()
    """Groups whose members are operators: submit, cancel, retry, follow-ups."""
    viewer: tuple[Name, ...] = ()
    """Groups whose members are viewers (an admitted person in no role group is a viewer too)."""


Teams = Annotated[dict[str, tuple[Name, ...]], AfterValidator(HashableDict)]


class AuthSettings(Section):
    oidc: OIDCSettings = OIDCSettings()
    """The OpenID Connect provider the console signs people in through."""
    admit: AdmitSettings = AdmitSettings()
    """Who may sign in at all: by the provider's groups or by e-mail domain."""
    roles: RoleGroups = RoleGroups()
    """Each role's provider groups (the highest role a person's groups give wins)."""
    break_glass: bool = False
    """Let the shared console token (console.token, else TASUKI_API_TOKEN) sign in as "break-glass" with the admin
    role, and the legacy API token call the API; every page then says so."""
    teams: Teams = Field(default_factory=HashableDict)
    """Teams for budgets: {team: [groups]}; a person's team is the first whose groups they are in."""
    token_max_days: PositiveInt = 90
    """Longest life of a personal API token, in days."""
