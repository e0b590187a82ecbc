"""Sign-in through an OpenID Connect provider (issue 40) with Authlib's Starlette client: discovery, the
authorization code with PKCE (S256), the ID token verified by Authlib (signature against the provider's JWKS,
``iss``, ``aud``, ``exp``, ``nonce``), userinfo for the groups or e-mail the token lacks, then admission and the
role by :mod:`worker.roles`.

Authlib keeps the sign-in's state, nonce and code verifier in Starlette's signed session (a short-lived cookie of
its own, ``tasuki_signin``); the console's own session cookie is made only once the person is admitted.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx
import structlog
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.starlette_client import OAuth
from joserfc.errors import JoseError
from starlette.requests import Request
from starlette.responses import Response

from contexts.errors import TasukiError
from worker.roles import Role, role_of
from worker.settings_models import Settings

SIGNIN_COOKIE = "tasuki_signin"
SIGNIN_MAX_AGE_S = 600  # the time a person has at the provider's page
log = structlog.get_logger(__name__)


def _transport_errors() -> tuple[type[Exception], ...]:
    """HTTP failures of Authlib's client: it runs on httpx2 where that is installed, else on httpx."""
    modules: list[ModuleType] = [httpx]
    with contextlib.suppress(ImportError):
        modules.append(importlib.import_module("httpx2"))
    return tuple(module.HTTPError for module in modules)


TRANSPORT_ERRORS = _transport_errors()
UNREACHABLE: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, AuthlibBaseError, ValueError, KeyError)
NO_EXCHANGE: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, ValueError, KeyError)
NO_USERINFO: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, AuthlibBaseError, ValueError)


class SignInRefused(TasukiError):
    """A sign-in through the provider that did not end with an admitted person; the message is one line."""

    def __init__(self, reason: str, actor: str = "oidc:?") -> None:
        super().__init__(reason)
        self.reason = reason
        self.actor = actor

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.actor))


@dataclass(frozen=True)
class Identity:
    """A person the provider vouched for, and what Tasuki makes of them."""

    actor: str  # oidc:<email or sub>
    name: str
    email: str  # verified by the provider, else ""
    groups: tuple[str, ...]
    role: Role | None  # None: not admitted


def _groups(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(g) for g in value)
    return None


def identity(claims: dict[str, Any], settings: Settings) -> Identity:
    """Who the merged ID token and userinfo claims describe; an e-mail counts only when the provider verified it."""
    email = str(claims.get("email") or "")
    verified = email if claims.get("email_verified") is True else ""
    groups = _groups(claims.get(settings.auth.oidc.groups_claim)) or ()
    actor = f"oidc:{verified or claims.get('sub')}"
    name = str(claims.get("name") or claims.get("preferred_username") or email or claims.get("sub"))
    return Identity(actor, name, verified, groups, role_of(groups, verified, settings.auth))


class OIDCSignIn:
    """The console's client at the configured provider (one per console: Authlib caches discovery and JWKS)."""

    def __init__(self, settings: Settings) -> None:
        oidc = settings.auth.oidc
        assert oidc.issuer is not None  # noqa: S101 - built only when configured
        self.settings = settings
        self.issuer = oidc.issuer.rstrip("/")
        if settings.secrets.tasuki_console_session_secret is None:
            log.warning("secret not set", variable="TASUKI_CONSOLE_SESSION_SECRET",
                        consequence="console sessions end when it restarts and hold on one process only")
        secret = settings.secrets.oidc_client_secret
        scopes = ["openid", *(s for s in oidc.scopes if s != "openid")]
        client_kwargs: dict[str, Any] = {"scope": " ".join(scopes), "code_challenge_method": "S256"}
        if secret is None:  # a public client: PKCE alone proves the code is ours
            client_kwargs["token_endpoint_auth_method"] = "none"  # noqa: S105 - a method's name, not a password
        self.client = OAuth().register(
            "oidc", client_id=oidc.client_id, client_secret=secret.get_secret_value() if secret else None,
            server_metadata_url=f"{self.issuer}/.well-known/openid-configuration", client_kwargs=client_kwargs)

    async def start(self, request: Request, redirect_uri: str) -> Response:
        """The redirect to the provider's authorization endpoint (state, nonce and code challenge made here)."""
        try:
            response: Response = await self.client.authorize_redirect(request, redirect_uri)
        except UNREACHABLE as exc:
            raise SignInRefused(f"the provider at {self.issuer} cannot be reached: {type(exc).__name__}") from None
        return response

    async def finish(self, request: Request) -> Identity:
        """The person the provider sent back, verified; raises SignInRefused with a one-line reason."""
        error = request.query_params.get("error")
        if error:
            raise SignInRefused(f"the provider refused the sign-in: {error[:80]}")
        try:
            token = await self.client.authorize_access_token(request)
        except AuthlibBaseError as exc:  # state mismatch, the token endpoint's refusal
            raise SignInRefused(_why(exc)) from None
        except JoseError as exc:  # the ID token's signature or claims
            raise SignInRefused(f"the ID token is not valid ({exc.error})") from None
        except NO_EXCHANGE as exc:
            raise SignInRefused(f"the provider did not answer the code exchange: {type(exc).__name__}") from None
        claims = dict(token.get("userinfo") or {})
        if not claims:
            raise SignInRefused("the provider sent no ID token")
        if str(claims.get("iss", "")).rstrip("/") != self.issuer:
            raise SignInRefused("the ID token's issuer is not the configured one")
        groups_claim = self.settings.auth.oidc.groups_claim
        if groups_claim not in claims or "email" not in claims:
            claims = {**await self._userinfo(token, claims), **claims}
        return identity(claims, self.settings)

    async def _userinfo(self, token: dict[str, Any], claims: dict[str, Any]) -> dict[str, Any]:
        """The userinfo endpoint's claims, when the provider has one and they are the same person's."""
        metadata = await self.client.load_server_metadata()
        if not metadata.get("userinfo_endpoint"):
            return {}
        try:
            info = dict(await self.client.userinfo(token=token))
        except NO_USERINFO as exc:
            raise SignInRefused(f"the provider's userinfo did not answer: {type(exc).__name__}") from None
        if info.get("sub") != claims.get("sub"):  # OIDC Core 5.3.2: otherwise it must not be used
            raise SignInRefused("the provider's userinfo is another person's")
        return info


def _why(exc: AuthlibBaseError) -> str:
    if exc.error == "mismatching_state":
        return "the sign-in expired or began in another browser; sign in again"
    described = f": {exc.description[:120]}" if exc.description else ""
    return f"the provider refused the code ({exc.error}{described})"
