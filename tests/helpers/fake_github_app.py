"""The GitHub App side of the fake GitHub (tests/helpers/fake_forge.py): it verifies the App's JWT against the
App's public key as GitHub does (RS256, ``iss`` the App's ID, ``iat`` not in the future, ``exp`` at most ten
minutes ahead), issues installation tokens that expire (``token_lifetime_s``, scaled down in tests), refuses an
expired token with 401, a suspended installation with 403, an unknown one with 404, and answers
``GET /repos/{owner}/{repo}/installation``.

    app = FakeApp.generate(app_id=7, slug="tasuki-app", token_lifetime_s=3.0)
    app.install(42, ("octo", "hello"))
    FakeForge(root, token, bot_login=app.bot_login, app=app)
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

MAX_JWT_LIFETIME_S = 600  # GitHub's limit on exp - now

NOT_DECODED = "A JSON web token could not be decoded"
IAT_IN_FUTURE = "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
EXP_TOO_FAR = "'Expiration time' claim ('exp') is too far in the future"
EXPIRED_JWT = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which " \
              "the assertion expires"
SUSPENDED = "This installation has been suspended"


def rsa_private_key() -> str:
    """A new 2048-bit RSA private key in PEM (what GitHub hands an App's owner)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def public_key_of(private_pem: str) -> str:
    """The public half of a PEM private key, in PEM."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass
class FakeInstallation:
    id: int
    repos: set[tuple[str, str]]
    suspended: bool = False


@dataclass(frozen=True)
class IssuedFake:
    """A token the fake issued."""

    token: str
    installation: int
    issued_at: float
    expires_at: float


@dataclass
class FakeApp:
    """A registered GitHub App: its ID, slug, public key, installations and the tokens issued for them."""

    app_id: int
    slug: str
    private_key: str  # the App owner's copy: tests hand it to Tasuki through GITHUB_APP_PRIVATE_KEY
    token_lifetime_s: float = 3600.0
    bot_user_id: int = 41898282
    bot_user_visible: bool = True  # False: GET /users/{slug}[bot] answers 404 (an Enterprise without the bot user)
    clock: Callable[[], float] = time.time
    installations: dict[int, FakeInstallation] = field(default_factory=dict)
    issued: list[IssuedFake] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why) of every 401/403 it answered
    revoked: set[str] = field(default_factory=set)  # tokens revoked before their time
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def generate(cls, app_id: int, slug: str, **kwargs: object) -> FakeApp:
        """An App with a freshly generated key pair."""
        return cls(app_id, slug, rsa_private_key(), **kwargs)  # type: ignore[arg-type]

    @property
    def public_key(self) -> str:
        return public_key_of(self.private_key)

    @property
    def bot_login(self) -> str:
        return f"{self.slug}[bot]"

    def install(self, installation: int, *repos: tuple[str, str]) -> FakeInstallation:
        found = FakeInstallation(installation, set(repos))
        self.installations[installation] = found
        return found

    # -- what the HTTP handler asks -----------------------------------------------------------------

    def jwt_refusal(self, authorization: str | None) -> str | None:
        """Why GitHub would refuse this ``Authorization: Bearer JWT`` now; None when it accepts it."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme != "Bearer" or not token:
            return NOT_DECODED
        now = self.clock()
        try:
            claims = jwt.decode(token, self.public_key, algorithms=["RS256"],
                                options={"require": ["iat", "exp", "iss"], "verify_exp": False,
                                         "verify_iat": False})
        except jwt.InvalidTokenError:
            return NOT_DECODED
        problems = [
            (str(claims["iss"]) != str(self.app_id), NOT_DECODED),  # GitHub says as little of a wrong app_id
            (claims["iat"] > now + 1, IAT_IN_FUTURE),
            (claims["exp"] > now + MAX_JWT_LIFETIME_S + 1, EXP_TOO_FAR),
            (claims["exp"] <= now, EXPIRED_JWT),
        ]
        return next((why for wrong, why in problems if wrong), None)

    def installation_token(self, token: str) -> IssuedFake | None:
        """The issued token ``token`` if it is valid now (not expired, installation not suspended)."""
        with self.lock:
            found = next((t for t in self.issued if t.token == token), None)
        if found is None or found.expires_at <= self.clock() or token in self.revoked:
            return None
        installation = self.installations.get(found.installation)
        return found if installation is not None and not installation.suspended else None

    def issue(self, installation_id: int) -> tuple[int, dict[str, object]]:
        """``POST /app/installations/{id}/access_tokens`` (the JWT already verified)."""
        installation = self.installations.get(installation_id)
        if installation is None:
            return 404, {"message": "Not Found"}
        if installation.suspended:
            return 403, {"message": SUSPENDED}
        now = self.clock()
        issued = IssuedFake("ghs_" + secrets.token_hex(18), installation_id, now, now + self.token_lifetime_s)
        with self.lock:
            self.issued.append(issued)
        # GitHub writes whole seconds; the scaled-down lifetimes of the tests need milliseconds.
        expires = datetime.fromtimestamp(issued.expires_at, UTC).isoformat(timespec="milliseconds")
        return 201, {"token": issued.token, "expires_at": expires.replace("+00:00", "Z"),
                     "permissions": {"contents": "write", "issues": "write", "pull_requests": "write"},
                     "repository_selection": "selected"}

    def installation_of(self, owner: str, repo: str) -> tuple[int, dict[str, object]]:
        """``GET /repos/{owner}/{repo}/installation``."""
        for installation in self.installations.values():
            if (owner, repo) in installation.repos:
                return 200, {"id": installation.id, "app_id": self.app_id, "account": {"login": owner}}
        return 404, {"message": "Not Found"}

    @staticmethod
    def app_path(parts: list[str]) -> bool:
        """Whether a path under /api/v3 is one of the App's own (signed with its JWT, not a token)."""
        return parts[:1] == ["app"] or (len(parts) == 4 and parts[0] == "repos" and parts[3] == "installation")

    def route(self, method: str, parts: list[str]) -> tuple[int, dict[str, object]]:
        """The App's own endpoints (JWT-authenticated) under /api/v3."""
        if parts == ["app"] and method == "GET":
            return 200, {"id": self.app_id, "slug": self.slug, "name": self.slug}
        if len(parts) == 4 and parts[:2] == ["app", "installations"] and parts[3] == "access_tokens" \
                and method == "POST":
            return self.issue(int(parts[2]))
        if len(parts) == 4 and parts[0] == "repos" and parts[3] == "installation" and method == "GET":
            return self.installation_of(parts[1], parts[2])
        return 404, {"message": "Not Found"}

    def answer(self, method: str, parts: list[str], authorization: str | None) -> tuple[int, object] | None:
        """The answer to a request under /api/v3 that the App decides alone (its endpoints, the bot user, a
        refused token); None: the token is valid, the fake GitHub answers as usual."""
        path = "/".join(parts)
        if self.app_path(parts):
            why = self.jwt_refusal(authorization)
            if why is not None:
                self.refuse(path, why)
                return 401, {"message": why}
            return self.route(method, parts)
        scheme, _, token = (authorization or "").partition(" ")
        issued = self.installation_token(token) if scheme in ("Bearer", "token") else None
        if issued is None:
            self.refuse(path, "Bad credentials")
            return 401, {"message": "Bad credentials"}
        if parts == ["users", self.bot_login] and method == "GET" and self.bot_user_visible:
            return 200, {"id": self.bot_user_id, "login": self.bot_login, "type": "Bot"}
        if parts[:1] == ["repos"] and len(parts) >= 3 and \
                (parts[1], parts[2]) not in self.installations[issued.installation].repos:
            return 404, {"message": "Not Found"}
        return None

    def git_allows(self, password: str) -> bool:
        """Whether git's Basic password is an installation token valid now."""
        if self.installation_token(password) is not None:
            return True
        self.refuse("git", "Bad credentials")
        return False

    def refuse(self, path: str, why: str) -> None:
        with self.lock:
            self.refused.append((path, why))
