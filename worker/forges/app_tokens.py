"""A GitHub App's short-lived credentials, as pure functions of ``now``: the JWT it signs, when an installation
token is due for renewal, and what a refusal means.

An installation token lives an hour; a task runs for hours. Each call asks the cache for a token valid at that
moment: the cached one until shortly before it expires (about 55 minutes into its hour), then a fresh one —
one renewal per installation per ~55 minutes, never one per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

import jwt

JWT_BACKDATE_S = 60  # GitHub's advice: issued a minute in the past, against a little clock drift
JWT_LIFETIME_S = 540  # GitHub refuses an expiry more than 10 minutes after the issue time
REFRESH_MARGIN_S = 300.0  # renew an hour's token 5 minutes before it expires
REFRESH_SHARE = 1 / 12  # ... and a shorter-lived one (tests scale the hour down) as early in proportion
CLOCK_TOLERANCE_S = JWT_BACKDATE_S  # a clock further off than the backdating makes GitHub refuse the JWT

# What a refused token exchange or installation lookup means, named once for the log line and the issue.
SUSPENDED = "installation suspended"
UNINSTALLED = "App not installed"
WRONG_KEY = "wrong private key or app_id"
CLOCK = "clock too far off for the JWT"


@dataclass(frozen=True)
class IssuedToken:
    """An installation token and its lifetime, in seconds since the epoch (of this host's clock)."""

    token: str
    issued_at: float
    expires_at: float

    def valid(self, now: float) -> bool:
        """Whether GitHub still accepts it at ``now``."""
        return now < self.expires_at


def refresh_at(token: IssuedToken) -> float:
    """When ``token`` is renewed: :data:`REFRESH_MARGIN_S` before it expires, or a twelfth of its life for a
    shorter-lived one, so a call never goes out with a token about to lapse on its way."""
    lifetime = max(token.expires_at - token.issued_at, 0.0)
    return token.expires_at - min(REFRESH_MARGIN_S, lifetime * REFRESH_SHARE)


def refresh_due(token: IssuedToken | None, now: float) -> bool:
    """Whether a call at ``now`` needs a new token (none yet, or this one is near its end)."""
    return token is None or now >= refresh_at(token)


def app_jwt(app_id: int, private_key: str, now: float) -> str:
    """The App's JWT (RS256) at ``now``: what GitHub takes in exchange for an installation token."""
    issued = int(now) - JWT_BACKDATE_S
    return jwt.encode({"iat": issued, "exp": issued + JWT_BACKDATE_S + JWT_LIFETIME_S, "iss": str(app_id)},
                      private_key, algorithm="RS256")


def parse_expiry(expires_at: str) -> float:
    """GitHub's ``expires_at`` (``2016-07-11T22:14:10Z``) as seconds since the epoch."""
    return datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp()


def clock_skew(server_date: str | None, now: float) -> float | None:
    """Seconds this host's clock is ahead of the server's (its ``Date`` header); None without one."""
    if not server_date:
        return None
    try:
        return now - parsedate_to_datetime(server_date).timestamp()
    except (TypeError, ValueError):
        return None


def refusal(status: int, message: str, skew: float | None) -> str:
    """What an HTTP refusal of the App's JWT or of an installation means (one of the names above), or ''."""
    if status == 401:
        claims = "'Issued at'" in message or "'Expiration time'" in message
        if claims or (skew is not None and abs(skew) > CLOCK_TOLERANCE_S):
            return CLOCK
        return WRONG_KEY
    if status == 403 and "suspended" in message.lower():
        return SUSPENDED
    if status == 404:
        return UNINSTALLED
    return ""


class TokenCache:
    """This process's installation tokens, one per installation, shared by every task; thread-safe (a
    checkpoint push runs in a thread of its own)."""

    def __init__(self) -> None:
        self._tokens: dict[int, IssuedToken] = {}
        self._lock = threading.Lock()
        self.issued = 0  # tokens asked of GitHub (the benchmark's count)

    def get(self, installation: int, now: float, issue: Callable[[int], IssuedToken]) -> IssuedToken:
        """The installation's token valid at ``now``: the cached one, or one ``issue`` gets now."""
        with self._lock:  # one renewal at a time: the threads of a task need one token, not one each
            token = self._tokens.get(installation)
            if refresh_due(token, now):
                token = issue(installation)
                self._tokens[installation] = token
                self.issued += 1
            assert token is not None  # noqa: S101 - refresh_due is true for None
            return token

    def peek(self, installation: int) -> IssuedToken | None:
        """The cached token, whatever its age."""
        with self._lock:
            return self._tokens.get(installation)

    def drop(self, installation: int, token: str) -> None:
        """Forget ``token`` (GitHub refused it before its time: revoked); the next call gets a new one."""
        with self._lock:
            if (cached := self._tokens.get(installation)) is not None and cached.token == token:
                del self._tokens[installation]
