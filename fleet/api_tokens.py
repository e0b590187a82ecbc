"""Personal API tokens of a fleet in its PostgreSQL (issue 40): :mod:`contexts.api_tokens`'s rows in
``tasuki_api_tokens`` (fleet/schema.py, version 8), so a token made in one host's console is known to every
intake. The secret's SHA-256 only; a lookup finds the row by that hash's unique index."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from contexts.api_tokens import (
    PREFIX,
    ApiToken,
    TokenError,
    hash_secret,
    live_match,
    new_token,
    row_of,
    token_of,
)
from fleet.store import FleetStore

_SELECT = "SELECT id, hash, owner, name, role, groups, created_at, expires_at, revoked_at FROM tasuki_api_tokens"
_INSERT = ("INSERT INTO tasuki_api_tokens (id, hash, owner, name, role, groups, created_at, expires_at, revoked_at) "
           "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL)")


class PostgresTokens:
    """:class:`contexts.api_tokens.Tokens` on the fleet store."""

    def __init__(self, fleet: FleetStore) -> None:
        self.fleet = fleet

    def create(self, owner: str, role: str, groups: Collection[str], name: str, expires_at: datetime,
               now: datetime) -> tuple[ApiToken, str]:
        """A new token and its secret, which is nowhere else."""
        token, secret = new_token(owner, role, groups, name, expires_at, now)
        with self.fleet.connection() as conn:
            conn.execute(_INSERT, row_of(token, secret))
        return token, secret

    def lookup(self, secret: str, now: datetime) -> ApiToken | None:
        """The live token whose secret this is; None for an unknown, expired or revoked one."""
        if not secret.startswith(PREFIX):
            return None
        wanted = hash_secret(secret)
        with self.fleet.reading() as conn:
            row = conn.execute(_SELECT + " WHERE hash = %s", (wanted,)).fetchone()
        return live_match(row, wanted, now)

    def get(self, token_id: str) -> ApiToken | None:
        """The token ``token_id``, live or not."""
        with self.fleet.reading() as conn:
            row = conn.execute(_SELECT + " WHERE id = %s", (token_id,)).fetchone()
        return None if row is None else token_of(row)

    def revoke(self, token_id: str, now: datetime) -> ApiToken:
        """Revoke ``token_id`` from ``now`` on (revoking twice keeps the first time); TokenError if there is none."""
        with self.fleet.connection() as conn:
            conn.execute("UPDATE tasuki_api_tokens SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL",
                         (now.timestamp(), token_id))
            row = conn.execute(_SELECT + " WHERE id = %s", (token_id,)).fetchone()
        if row is None:
            raise TokenError(f"no token {token_id}")
        return token_of(row)

    def list(self, owner: str | None = None) -> list[ApiToken]:
        """Every token (``owner``: only that person's), newest first."""
        with self.fleet.reading() as conn:
            rows = conn.execute(_SELECT + " WHERE %s::text IS NULL OR owner = %s ORDER BY created_at DESC, id",
                                (owner, owner)).fetchall()
        return [token_of(row) for row in rows]
