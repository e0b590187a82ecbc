"""Personal API tokens under the ``auth`` settings (issue 40): who may make one with which role and life, and the
identity a token stands for. The console makes them, the task API checks them, ``tasuki token`` lists and revokes
them on the host; the file itself is :mod:`contexts.api_tokens`."""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from contexts.api_tokens import ApiToken, TokenError, Tokens, TokenStore
from worker.roles import Role, team_of
from worker.settings_models import Settings
from worker.stores import fleet_store

_STORES: dict[Path, TokenStore] = {}
_STORES_LOCK = threading.Lock()


def token_store(settings: Settings) -> Tokens:
    """Where tokens are kept: the fleet's PostgreSQL when ``fleet.store`` is set (every intake knows every token),
    else the file beside the configured contexts root, opened once per process."""
    if urlsplit(settings.fleet.store or "").scheme in ("postgresql", "postgres"):
        from fleet.api_tokens import PostgresTokens  # fleet mode only: one host never loads the driver

        return PostgresTokens(fleet_store(settings))
    path = Path(settings.contexts.base_dir).absolute()
    with _STORES_LOCK:
        if path not in _STORES:
            _STORES[path] = TokenStore.beside(path)
        return _STORES[path]


def role_named(name: str) -> Role:
    """The role a form or a command line names (``viewer``, ``operator``, ``admin``); TokenError otherwise."""
    try:
        return Role[name.strip().upper()]
    except KeyError:
        raise TokenError(f"no role {name!r}: viewer, operator or admin") from None


def issue_token(settings: Settings, store: Tokens, *, owner: str, owner_role: Role, groups: Collection[str],
                role: Role, expires_days: int, name: str, now: datetime) -> tuple[ApiToken, str]:
    """A token for ``owner`` (who holds ``owner_role`` now) and its secret, shown once: its role at most the
    owner's, its life at most ``auth.token_max_days``. ``groups`` are kept with it for its team's budgets."""
    if role > owner_role:
        raise TokenError(f"a token's role ({role.label}) cannot exceed its owner's ({owner_role.label})")
    if owner_role < Role.OPERATOR:
        raise TokenError("only operators and admins make API tokens")
    longest = settings.auth.token_max_days
    if not 1 <= expires_days <= longest:
        raise TokenError(f"a token lives 1 to {longest} days (auth.token_max_days), not {expires_days}")
    return store.create(owner, role.label, groups, name, now + timedelta(days=expires_days), now)


@dataclass(frozen=True)
class Caller:
    """Who an API request comes from: the token's owner with the token's role, and the team of the groups kept with
    the token (None: no team); ``actor`` is how the audit log names them."""

    user: str
    role: Role
    team: str | None
    actor: str
    token_id: str | None = None


def caller_of(settings: Settings, token: ApiToken) -> Caller:
    """The identity a live token stands for."""
    return Caller(token.owner, role_named(token.role), team_of(token.groups, settings.auth), f"token:{token.owner}",
                  token.id)


BREAK_GLASS = Caller("break-glass", Role.ADMIN, None, "break-glass")
"""The legacy shared API token, accepted only with ``auth.break_glass``: an admin with no person or team."""
