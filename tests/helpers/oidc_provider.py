"""A fake OpenID Connect provider that speaks the whole protocol over real HTTP, for the console's sign-in tests.

Issue 40 asked for a real provider started by the tests, Dex for instance; Dex cannot be built offline here (its Go
module's dependencies are not in the module cache and the proxy is out of reach), so this fake stands at the edge
instead and speaks what the console's Authlib client meets at a real one:

- ``/.well-known/openid-configuration`` (discovery) and ``/jwks`` (a real RS256 key made with ``cryptography``);
- ``/authorize``: checks the client, the registered redirect URI, ``response_type=code``, the ``openid`` scope and a
  PKCE challenge with method S256 (a missing or ``plain`` challenge is refused), then shows a sign-in page where a
  person is picked; the answer redirects back with ``code`` and ``state``;
- ``/token``: client authentication (``client_secret_basic`` or ``client_secret_post``), a single-use code bound to
  its client and redirect URI, and the ``code_verifier`` checked against the challenge; an ID token signed RS256
  with ``iss``, ``sub``, ``aud``, ``exp``, ``iat``, ``nonce`` (and the groups, unless the person's are given only by
  userinfo, as some providers do);
- ``/userinfo``: the person's claims for the bearer access token.

Every authorization and token request is kept (``authorizations``, ``token_requests``) for the tests to inspect.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass(frozen=True)
class Person:
    """Someone the provider knows: the claims it vouches for."""

    username: str
    email: str
    groups: tuple[str, ...] = ()
    email_verified: bool = True
    groups_in_token: bool = True  # False: the groups come from userinfo only

    @property
    def sub(self) -> str:
        return f"sub-{self.username}"


@dataclass
class Grant:
    person: Person
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str | None


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of a verifier (RFC 7636 §4.2)."""
    return b64url(hashlib.sha256(verifier.encode()).digest())


@dataclass
class FakeOIDCProvider:
    """The provider's state: its key, its one client, its people, its outstanding codes and tokens."""

    client_id: str
    client_secret: str
    redirect_uris: tuple[str, ...] = ()
    people: dict[str, Person] = field(default_factory=dict)
    url: str = ""
    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(public_exponent=65537,
                                                                                  key_size=2048))
    kid: str = "fake-key-1"
    forged_key: rsa.RSAPrivateKey | None = None  # set: ID tokens are signed with this key, not the published one
    codes: dict[str, Grant] = field(default_factory=dict)
    access_tokens: dict[str, Person] = field(default_factory=dict)
    authorizations: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, person: Person) -> None:
        self.people[person.username] = person

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "userinfo_endpoint": f"{self.url}/userinfo",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "email", "profile", "groups"],
        }

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()

        def whole(n: int) -> str:
            return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))

        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid, "n": whole(numbers.n),
                          "e": whole(numbers.e)}]}

    def claims(self, person: Person, *, userinfo: bool) -> dict[str, Any]:
        claims: dict[str, Any] = {"sub": person.sub, "email": person.email, "email_verified": person.email_verified,
                                  "name": person.username.title(), "preferred_username": person.username}
        if userinfo or person.groups_in_token:
            claims["groups"] = list(person.groups)
        return claims

    def id_token(self, grant: Grant) -> str:
        now = int(time.time())
        payload = {**self.claims(grant.person, userinfo=False), "iss": self.url, "aud": grant.client_id,
                   "iat": now, "exp": now + 300, "auth_time": now}
        if grant.nonce is not None:
            payload["nonce"] = grant.nonce
        return jwt.encode(payload, self.forged_key or self.key, algorithm="RS256", headers={"kid": self.kid})

    # -- the endpoints' rules (the handler below only moves bytes) -----------------------------------------------

    def authorize(self, query: dict[str, str]) -> tuple[int, str]:
        """The sign-in page for a valid request, else (400, why)."""
        with self.lock:
            self.authorizations.append(query)
        status, why = self.check(query)
        if status != 200:
            return status, why
        hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in query.items())
        choices = "".join(f'<button type="submit" name="username" value="{html.escape(u)}" id="as-{html.escape(u)}">'
                          f"{html.escape(u)}</button>" for u in self.people)
        return 200, (f"<!doctype html><title>Fake provider</title><h1>Sign in to the fake provider</h1>"
                     f'<form method="post" action="/login">{hidden}{choices}</form>')

    def check(self, query: dict[str, str]) -> tuple[int, str]:
        """(200, "") for an authorization request the provider takes, else (400, why)."""
        problems = [
            ("unknown client", query.get("client_id") != self.client_id),
            ("redirect_uri not registered", query.get("redirect_uri") not in self.redirect_uris),
            ("response_type must be code", query.get("response_type") != "code"),
            ("the openid scope is missing", "openid" not in query.get("scope", "").split()),
            ("PKCE: a code_challenge with method S256 is required",
             not query.get("code_challenge") or query.get("code_challenge_method") != "S256"),
        ]
        for why, wrong in problems:
            if wrong:
                return 400, why
        return 200, ""

    def login(self, form: dict[str, str]) -> tuple[int, str]:
        """The redirect back to the client with a fresh code and the state."""
        status, why = self.check(form)
        if status != 200:
            return status, why
        person = self.people.get(form.get("username", ""))
        if person is None:
            return 400, "no such person"
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = Grant(person, form["client_id"], form["redirect_uri"], form["code_challenge"],
                                     form.get("nonce"))
        back = {"code": code, **({"state": form["state"]} if "state" in form else {})}
        return 302, f"{form['redirect_uri']}?{urlencode(back)}"

    def token(self, form: dict[str, str], authorization: str | None) -> tuple[int, dict[str, Any]]:
        """Exchange a code: client authentication, the code's binding, and the PKCE verifier."""
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.startswith("Basic "):
            client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
        with self.lock:
            grant = self.codes.pop(form.get("code", ""), None)  # single use, even when refused
            self.token_requests.append({"form": form, "client_id": client_id, "basic": authorization is not None})
        if client_id != self.client_id or secret != self.client_secret:
            return 401, {"error": "invalid_client"}
        if form.get("grant_type") != "authorization_code" or grant is None:
            return 400, {"error": "invalid_grant", "error_description": "unknown or used code"}
        if grant.client_id != client_id or grant.redirect_uri != form.get("redirect_uri"):
            return 400, {"error": "invalid_grant", "error_description": "the code was issued to another client"}
        verifier = form.get("code_verifier")
        if not verifier or s256(verifier) != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verification failed"}
        access = secrets.token_urlsafe(24)
        with self.lock:
            self.access_tokens[access] = grant.person
        return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300,
                     "id_token": self.id_token(grant)}

    def userinfo(self, authorization: str | None) -> tuple[int, dict[str, Any]]:
        person = self.access_tokens.get((authorization or "").removeprefix("Bearer ").strip())
        if person is None:
            return 401, {"error": "invalid_token"}
        return 200, self.claims(person, userinfo=True)

    def exchange(self, code: str, verifier: str, redirect_uri: str) -> int:
        """A token request as another party would send it (the tests' PKCE check); its status."""
        status, _ = self.token({"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                                "code_verifier": verifier, "client_id": self.client_id,
                                "client_secret": self.client_secret}, None)
        return status


def _handler(provider: FakeOIDCProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: str | dict[str, Any], location: str | None = None) -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            kind = "application/json" if isinstance(body, dict) else "text/html; charset=utf-8"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def _form(self) -> dict[str, str]:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            if parts.path == "/.well-known/openid-configuration":
                self._send(200, provider.discovery())
            elif parts.path == "/jwks":
                self._send(200, provider.jwks())
            elif parts.path == "/authorize":
                self._send(*provider.authorize(query))
            elif parts.path == "/userinfo":
                self._send(*provider.userinfo(self.headers.get("Authorization")))
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            if path == "/login":
                status, text = provider.login(self._form())
                self._send(status, "", location=text) if status == 302 else self._send(status, text)
            elif path == "/token":
                self._send(*provider.token(self._form(), self.headers.get("Authorization")))
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, *_: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serve_provider(provider: FakeOIDCProvider) -> Iterator[FakeOIDCProvider]:
    """Serve ``provider`` on a free port of 127.0.0.1 while the block runs (its ``url`` set: the issuer)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    provider.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
