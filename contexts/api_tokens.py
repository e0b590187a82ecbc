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
import sqlite3
import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

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


def _time(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _token(row: sqlite3.Row | tuple[object, ...]) -> ApiToken:
    id_, _hash, owner, name, role, groups, created, expires, revoked = row
    return ApiToken(str(id_), str(owner), str(name), str(role), tuple(json.loads(str(groups))),
                    datetime.fromtimestamp(float(created), UTC),  # type: ignore[arg-type]
                    datetime.fromtimestamp(float(expires), UTC),  # type: ignore[arg-type]
                    _time(None if revoked is None else float(revoked)))  # type: ignore[arg-type]


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
        if not owner:
            raise TokenError("a token needs an owner")
        if expires_at <= now:
            raise TokenError("a token must expire after it is made")
        secret, token_id = new_secret(), secrets.token_hex(8)
        token = ApiToken(token_id, owner, name.strip()[:100] or "token", role, tuple(sorted(set(groups))), now,
                         expires_at)
        with self._lock, immediate(self._db):
            self._db.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                (token.id, hash_secret(secret), token.owner, token.name, token.role, json.dumps(token.groups),
                 now.timestamp(), expires_at.timestamp()))
        return token, secret

    def lookup(self, secret: str, now: datetime) -> ApiToken | None:
        """The live token whose secret this is; None for an unknown, expired or revoked one (all alike to a caller)."""
        if not secret.startswith(PREFIX):
            return None
        wanted = hash_secret(secret)
        with self._lock:
            row = self._db.execute("SELECT * FROM tokens WHERE hash = ?", (wanted,)).fetchone()
        if row is None or not hmac.compare_digest(str(row[1]).encode(), wanted.encode()):
            return None
        token = _token(row)
        return token if token.live(now) else None

    def get(self, token_id: str) -> ApiToken | None:
        """The token ``token_id``, live or not."""
        with self._lock:
            row = self._db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return None if row is None else _token(row)

    def revoke(self, token_id: str, now: datetime) -> ApiToken:
        """Revoke ``token_id`` from ``now`` on (revoking twice keeps the first time); TokenError if there is none."""
        with self._lock, immediate(self._db):
            self._db.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                             (now.timestamp(), token_id))
            row = self._db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()
        if row is None:
            raise TokenError(f"no token {token_id}")
        return _token(row)

    def list(self, owner: str | None = None) -> list[ApiToken]:
        """Every token (``owner``: only that person's), newest first."""
        query, args = "SELECT * FROM tokens", ()
        if owner is not None:
            query, args = query + " WHERE owner = ?", (owner,)  # type: ignore[assignment]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at DESC, id", args).fetchall()
        return [_token(row) for row in rows]
