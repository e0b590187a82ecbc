"""Personal API tokens (issue 40): one SQLite file (WAL, 0600) beside the contexts, ``<root>/api_tokens.sqlite3``.

A token's secret (``tsk_`` + 32 random bytes, URL-safe) is shown once, when it is made; the file keeps only its
SHA-256, so a copy of the file lets nobody in. A lookup hashes what the caller sent and finds the row by that hash
(an index lookup whose time does not depend on how much of a secret was right), then compares the hashes with
:func:`hmac.compare_digest`. Roles are kept as their names: what they allow is the worker's business
(``worker/roles.py``), not this file's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from contexts.errors import TasukiError
from contexts.sqlite_files import create_private, immediate, open_wal

TOKENS_FILE = "api_tokens.sqlite3"
PREFIX = "tsk_"
SECRET_BYTES = 32
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    groups TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX IF NOT EXISTS tokens_owner ON tokens (owner);
"""


class TokenError(TasukiError):
    """A token cannot be made or changed as asked (a role above its creator's, too long a life, no such token)."""


@dataclass(frozen=True)
class ApiToken:
    """One personal token as the store knows it: never its secret."""

    id: str
    owner: str
    name: str
    role: str
    groups: tuple[str, ...]
    """The owner's groups when the token was made: the team its tasks are counted under (budgets)."""
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None

    def live(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and now < self.expires_at

    def status(self, now: datetime) -> str:
        """``active``, ``revoked`` or ``expired``, as a person reads it."""
        if self.revoked_at is not None:
            return "revoked"
        return "active" if now < self.expires_at else "expired"


def new_secret() -> str:
    """A fresh secret: the prefix (so secret scanners and people recognize it) and 32 random bytes."""
    return PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    """The SHA-256 (hex) a secret is stored and found under; a 256-bit random secret needs no slow hash."""
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()


def new_token(owner: str, role: str, groups: Collection[str], name: str, expires_at: datetime,
              now: datetime) -> tuple[ApiToken, str]:
    """A token not yet stored and its secret; TokenError for one without an owner or already expired."""
    if not owner:
        raise TokenError("a token needs an owner")
    if expires_at <= now:
        raise TokenError("a token must expire after it is made")
    token = ApiToken(secrets.token_hex(8), owner, name.strip()[:100] or "token", role, tuple(sorted(set(groups))),
                     now, expires_at)
    return token, new_secret()


def row_of(token: ApiToken, secret: str) -> tuple[object, ...]:
    """The stored row of a new token: the columns of both stores, the secret's hash in its place."""
    return (token.id, hash_secret(secret), token.owner, token.name, token.role, json.dumps(token.groups),
            token.created_at.timestamp(), token.expires_at.timestamp())


def token_of(row: Sequence[Any]) -> ApiToken:
    """A token from its stored row (id, hash, owner, name, role, groups, created, expires, revoked)."""
    id_, _hash, owner, name, role, groups, created, expires, revoked = row
    decoded = json.loads(groups) if isinstance(groups, str) else groups  # PostgreSQL's json comes decoded
    return ApiToken(str(id_), str(owner), str(name), str(role), tuple(decoded),
                    datetime.fromtimestamp(float(created), UTC), datetime.fromtimestamp(float(expires), UTC),
                    None if revoked is None else datetime.fromtimestamp(float(revoked), UTC))


def live_match(row: Sequence[Any] | None, wanted: str, now: datetime) -> ApiToken | None:
    """The row a hash lookup found, if its hash is the wanted one (compared in constant time) and it is live."""
    if row is None or not hmac.compare_digest(str(row[1]).encode(), wanted.encode()):
        return None
    token = token_of(row)
    return token if token.live(now) else None


class Tokens(Protocol):
    """Where personal tokens are kept: this file on one host, PostgreSQL in a fleet (fleet/api_tokens.py)."""

    def create(self, owner: str, role: str, groups: Collection[str], name: str, expires_at: datetime,
               now: datetime) -> tuple[ApiToken, str]: ...
    def lookup(self, secret: str, now: datetime) -> ApiToken | None: ...
    def get(self, token_id: str) -> ApiToken | None: ...
    def revoke(self, token_id: str, now: datetime) -> ApiToken: ...
    def list(self, owner: str | None = None) -> list[ApiToken]: ...


class TokenStore:
    """The personal tokens of one contexts root; safe to share between the threads of a process, and between
    processes (SQLite's lock orders the writers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        create_private(path)
        self._db = open_wal(path, BUSY_TIMEOUT_S)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(SCHEMA)

    @classmethod
    def beside(cls, contexts_root: Path) -> TokenStore:
        """The store of the contexts root ``contexts_root``."""
        return cls(Path(contexts_root) / TOKENS_FILE)

    def close(self) -> None:
        """Close the connection (the file stays)."""
        with self._lock:
            self._db.close()

    def create(self, owner: str, role: str, groups: Collection[str], name: str, expires_at: datetime,
               now: datetime) -> tuple[ApiToken, str]:
        """A new token and its secret, which is nowhere else: the caller shows it once and forgets it."""
        token, secret = new_token(owner, role, groups, name, expires_at, now)
        with self._lock, immediate(self._db):
            self._db.execute("INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)", row_of(token, secret))
        return token, secret

    def lookup(self, secret: str, now: datetime) -> ApiToken | None:
        """The live token whose secret this is; None for an unknown, expired or revoked one (all alike to a caller)."""
        if not secret.startswith(PREFIX):
            return None
        wanted = hash_secret(secret)
        with self._lock:
            row = self._db.execute("SELECT * FROM tokens WHERE hash = ?", (wanted,)).fetchone()
        return live_match(row, wanted, now)

    def get(self, token_id: str) -> ApiToken | None:
        """The token ``token_id``, live or not."""
        with self._lock:
            row = self._db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return None if row is None else token_of(row)

    def revoke(self, token_id: str, now: datetime) -> ApiToken:
        """Revoke ``token_id`` from ``now`` on (revoking twice keeps the first time); TokenError if there is none."""
        with self._lock, immediate(self._db):
            self._db.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                             (now.timestamp(), token_id))
            row = self._db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        if row is None:
            raise TokenError(f"no token {token_id}")
        return token_of(row)

    def list(self, owner: str | None = None) -> list[ApiToken]:
        """Every token (``owner``: only that person's), newest first."""
        query, args = "SELECT * FROM tokens", ()
        if owner is not None:
            query, args = query + " WHERE owner = ?", (owner,)  # type: ignore[assignment]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at DESC, id", args).fetchall()
        return [token_of(row) for row in rows]
