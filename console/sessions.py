"""Who is looking: a signed expiring session cookie that says who signed in and with which role, a CSRF token,
and a limit on sign-in attempts (SPEC §15, issue 40). Pure except for the randomness of new session ids."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from itsdangerous import BadSignature, TimestampSigner, URLSafeTimedSerializer

from worker.roles import Role

COOKIE = "tasuki_console"
SALT = "tasuki-console-session"
BREAK_GLASS = "break-glass"  # the actor of a sign-in with the shared console token
MAX_GROUPS = 64  # a cookie holds about 4 KB: a person in more groups keeps the first ones (teams, display)


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who (the audit log's actor), their role and groups, its random id and the CSRF token
    its forms carry."""

    sid: str
    csrf: str
    actor: str = BREAK_GLASS
    role: Role = Role.ADMIN
    name: str = ""
    groups: tuple[str, ...] = ()

    @property
    def break_glass(self) -> bool:
        """Signed in with the shared token rather than as a person."""
        return self.actor == BREAK_GLASS

    def may(self, needed: Role) -> bool:
        """Whether this session's role allows what needs ``needed``."""
        return self.role >= needed


def token_matches(given: str, token: str | None) -> bool:
    """Whether ``given`` is the console token (constant time; no token configured: nothing matches)."""
    if token is None:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def session_key(secret: str | None, token: str | None) -> str:
    """The key cookies are signed with: TASUKI_CONSOLE_SESSION_SECRET, else one derived from the break-glass token
    (a new token ends every session), else a random one (sessions end when the console restarts)."""
    seed = secret or (f"token\0{token}" if token else None) or secrets.token_hex(32)
    return hashlib.sha256(b"tasuki-console\0" + seed.encode()).hexdigest()


class Sessions:
    """Session cookies signed with the console's session key, expiring after ``lifetime_s``. A break-glass session
    holds only while break-glass is on with the token it was made with (turning it off, or a new token, ends it)."""

    def __init__(self, key: str, lifetime_s: int, clock: Callable[[], float], *,
                 break_glass: str | None = None) -> None:
        # Keyed with the session key: the cookie (readable, only signed) never lets a weak token be guessed offline.
        self.token_mark = (hmac.new(key.encode(), b"break-glass\0" + break_glass.encode(), hashlib.sha256).hexdigest()
                           if break_glass else None)

        class Signer(TimestampSigner):  # signs and checks ages on the console's clock, not time.time()
            def get_timestamp(self) -> int:
                return int(clock())

        self.serializer = URLSafeTimedSerializer(key, salt=SALT, signer=Signer)
        self.lifetime_s = lifetime_s

    def new(self, actor: str = BREAK_GLASS, role: Role = Role.ADMIN, name: str = "",
            groups: tuple[str, ...] = ()) -> tuple[Session, str]:
        """A fresh session for ``actor`` and the cookie value that carries it."""
        session = Session(secrets.token_urlsafe(16), secrets.token_urlsafe(24), actor, role, name,
                          groups[:MAX_GROUPS])
        data = {"sid": session.sid, "csrf": session.csrf, "actor": actor, "role": int(role), "name": name,
                "groups": list(session.groups)}
        if session.break_glass:
            data["token_mark"] = self.token_mark or ""
        return session, self.serializer.dumps(data)

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie carries, or None when it is absent, forged or older than the lifetime."""
        if not cookie:
            return None
        try:
            data = self.serializer.loads(cookie, max_age=self.lifetime_s)
        except BadSignature:  # SignatureExpired is one too
            return None
        fields = ("sid", "csrf", "actor", "name")
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in fields):
            return None
        groups = data.get("groups")
        if data.get("role") not in {int(r) for r in Role} or not isinstance(groups, list):
            return None
        if data["actor"] == BREAK_GLASS and (self.token_mark is None or data.get("token_mark") != self.token_mark):
            return None
        return Session(data["sid"], data["csrf"], data["actor"], Role(data["role"]), data["name"],
                       tuple(str(g) for g in groups))


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
