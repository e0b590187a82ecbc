"""Who may look: sign-in with the console token, a signed expiring session cookie, a CSRF token, and a limit
on sign-in attempts (SPEC §15). Pure except for the randomness of new session ids."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from itsdangerous import BadSignature, TimestampSigner, URLSafeTimedSerializer

COOKIE = "tasuki_console"
SALT = "tasuki-console-session"


@dataclass(frozen=True)
class Session:
    """A signed-in browser: its random id and the CSRF token its forms carry."""

    sid: str
    csrf: str


def token_matches(given: str, token: str | None) -> bool:
    """Whether ``given`` is the console token (constant time; no token configured: nothing matches)."""
    if token is None:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


class Sessions:
    """Session cookies signed with a key derived from the token: a new token ends every session."""

    def __init__(self, token: str | None, lifetime_s: int, clock: Callable[[], float]) -> None:
        key = hashlib.sha256(b"tasuki-console\0" + (token or secrets.token_hex(32)).encode()).hexdigest()

        class Signer(TimestampSigner):  # signs and checks ages on the console's clock, not time.time()
            def get_timestamp(self) -> int:
                return int(clock())

        self.serializer = URLSafeTimedSerializer(key, salt=SALT, signer=Signer)
        self.lifetime_s = lifetime_s

    def new(self) -> tuple[Session, str]:
        """A fresh session and the cookie value that carries it."""
        session = Session(secrets.token_urlsafe(16), secrets.token_urlsafe(24))
        return session, self.serializer.dumps({"sid": session.sid, "csrf": session.csrf})

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie carries, or None when it is absent, forged or older than the lifetime."""
        if not cookie:
            return None
        try:
            data = self.serializer.loads(cookie, max_age=self.lifetime_s)
        except BadSignature:  # SignatureExpired is one too
            return None
        if not isinstance(data, dict) or not isinstance(data.get("sid"), str) or not isinstance(data.get("csrf"), str):
            return None
        return Session(data["sid"], data["csrf"])


def csrf_matches(session: Session, given: str | None) -> bool:
    """Whether a form's CSRF token is this session's (constant time)."""
    return given is not None and hmac.compare_digest(session.csrf.encode(), given.encode())


@dataclass
class SignInLimiter:
    """At most ``per_minute`` sign-in attempts per client address in any 60 s (a sliding window)."""

    per_minute: int
    window_s: float = 60.0
    attempts: dict[str, deque[float]] = field(default_factory=dict)

    def allow(self, client: str, now: float) -> bool:
        """Count an attempt by ``client`` at ``now``; False when it is over the limit (not counted then)."""
        seen = self.attempts.setdefault(client, deque())
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        if len(seen) >= self.per_minute:
            return False
        seen.append(now)
        if len(self.attempts) > 10_000:  # forget idle clients rather than grow without bound
            for key in [k for k, v in self.attempts.items() if not v]:
                del self.attempts[key]
        return True
