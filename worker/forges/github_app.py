"""GitHub App authentication (``github.auth: app``): the App's JWT exchanged for installation tokens, cached
per installation in this process and renewed before they expire; the App's bot as git's author.

One :class:`GitHubApp` per process and App (:func:`github_app`); one :class:`InstallationCredential` per forge
client, which remembers the first refusal it met: the task fails on it, and while the token it had is still
valid that token can still tell the issue so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import structlog

from contexts.masking import mask
from worker.forges.app_tokens import (
    IssuedToken,
    TokenCache,
    app_jwt,
    clock_skew,
    parse_expiry,
    refusal,
)
from worker.forges.base import CredentialError, ForgeError

log = structlog.get_logger(__name__)

HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "tasuki"}


def bot_email(user_id: int, slug: str) -> str:
    """The noreply address GitHub credits a bot's commits to."""
    return f"{user_id}+{slug}[bot]@users.noreply.github.com"


class GitHubApp:
    """One App on one GitHub: its JWT, its installations' tokens, which installation holds a repository."""

    def __init__(self, api_url: str, app_id: int, private_key: str, *, clock: Callable[[], float] = time.time,
                 timeout_s: float = 30.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.app_id = app_id
        self._private_key = private_key
        self.clock = clock
        self.tokens = TokenCache()
        self._http = httpx.Client(base_url=self.api_url + "/", headers=HEADERS, timeout=timeout_s)
        self._installations: dict[tuple[str, str], int] = {}
        self._identity: dict[str, str] | None = None
        self._lock = threading.Lock()

    def _as_app(self, method: str, path: str, what: str) -> dict[str, Any]:
        """A call signed with the App's JWT; a refusal raises :class:`CredentialError` naming its cause."""
        now = self.clock()
        try:
            jwt_token = app_jwt(self.app_id, self._private_key, now)
        except (ValueError, TypeError) as exc:  # not an RSA private key in PEM at all
            raise CredentialError(f"github app {self.app_id}: the private key cannot sign: "
                                  f"{type(exc).__name__}") from None
        try:
            response = self._http.request(method, path, headers={"Authorization": f"Bearer {jwt_token}"})
        except httpx.TransportError as exc:
            raise ForgeError(f"{method} {path}: {type(exc).__name__}: {mask(str(exc))[:200]}") from None
        if response.status_code < 400:
            return dict(response.json())
        message = mask(response.text)[:200]
        cause = refusal(response.status_code, message, clock_skew(response.headers.get("date"), now))
        if cause:
            raise CredentialError(f"github app {self.app_id}: {cause} ({what}: HTTP {response.status_code})")
        raise ForgeError(f"{method} {path}: HTTP {response.status_code}: {message}")

    def issue(self, installation: int) -> IssuedToken:
        """A new installation token (``POST /app/installations/{id}/access_tokens``)."""
        now = self.clock()
        data = self._as_app("POST", f"app/installations/{installation}/access_tokens",
                            f"token of installation {installation}")
        log.info("github app installation token issued", installation=installation)
        return IssuedToken(str(data["token"]), now, parse_expiry(str(data["expires_at"])))

    def token(self, installation: int) -> IssuedToken:
        """The installation's token valid now (cached until it nears its end)."""
        return self.tokens.get(installation, self.clock(), self.issue)

    def installation_for(self, owner: str, repo: str) -> int:
        """The installation that holds ``owner/repo`` (``GET /repos/{owner}/{repo}/installation``), for a task
        submitted by hand rather than by the App's webhook."""
        key = (owner.lower(), repo.lower())
        with self._lock:
            if key in self._installations:
                return self._installations[key]
        data = self._as_app("GET", f"repos/{quote(owner, safe='')}/{quote(repo, safe='')}/installation",
                            f"installation of {owner}/{repo}")
        with self._lock:
            self._installations[key] = int(data["id"])
        return int(data["id"])

    def identity(self, token: str) -> dict[str, str]:
        """Git's author and committer: the App's bot, ``slug[bot]`` with its noreply address (``GET /app``, then
        ``GET /users/{slug}[bot]`` for the bot's user id); asked once per process."""
        with self._lock:
            if self._identity is not None:
                return self._identity
        slug = str(self._as_app("GET", "app", "the App itself")["slug"])
        user_id, lasting = self._bot_user_id(slug, token)
        name = f"{slug}[bot]"
        email = bot_email(user_id, slug) if user_id is not None else f"{name}@users.noreply.github.com"
        identity = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
                    "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}
        if lasting:
            with self._lock:
                self._identity = identity
        return identity

    def _bot_user_id(self, slug: str, token: str) -> tuple[int | None, bool]:
        """The bot user's id (``GET /users/{slug}[bot]``) and whether the answer lasts. It only decorates the commit
        e-mail: a lookup that fails never fails the task. A 404 (GitHub Enterprise without the bot user, a token
        that may not see it) lasts: the address without the id is kept, and said once per process."""
        path = f"users/{quote(slug + '[bot]', safe='')}"
        try:
            response = self._http.get(path, headers={"Authorization": f"Bearer {token}"})
            if response.status_code < 400:
                return int(response.json()["id"]), True
            problem, lasting = f"HTTP {response.status_code}: {mask(response.text)[:200]}", response.status_code == 404
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            problem, lasting = f"{type(exc).__name__}: {mask(str(exc))[:200]}", False
        log.warning("the App's bot user could not be looked up; commits carry its address without the user id",
                    path=f"/{path}", error=problem)
        return None, lasting


class InstallationCredential:
    """A forge client's token: of the event's installation, or of the one holding ``owner/repo``."""

    def __init__(self, app: GitHubApp, owner: str, repo: str, installation: int | None = None) -> None:
        self.app = app
        self.owner, self.repo = owner, repo
        self.installation = installation
        self.failure: CredentialError | None = None
        self._last: IssuedToken | None = None

    def token(self) -> str:
        """A token valid now. After a refusal: the last token while it lasts (to tell the issue), else the
        refusal again — one log line per client, not one per call."""
        if self.failure is not None:
            if self._last is not None and self._last.valid(self.app.clock()):
                return self._last.token
            raise self.failure
        try:
            if self.installation is None:
                self.installation = self.app.installation_for(self.owner, self.repo)
            self._last = self.app.token(self.installation)
        except CredentialError as exc:
            self.failure = exc
            log.error(str(exc), repository=f"{self.owner}/{self.repo}", installation=self.installation)
            raise
        return self._last.token

    def refused(self, token: str) -> bool:
        """GitHub refused ``token`` before it expired (revoked): the next call gets a new one."""
        if self.installation is None:
            return False
        log.warning("github app installation token refused before its time; getting a new one",
                    installation=self.installation)
        self.app.tokens.drop(self.installation, token)
        return True

    def identity(self) -> dict[str, str]:
        """The bot's git identity."""
        return self.app.identity(self.token())


_apps: dict[tuple[str, int, str], GitHubApp] = {}
_apps_lock = threading.Lock()


def github_app(api_url: str, app_id: int, private_key: str) -> GitHubApp:
    """This process's :class:`GitHubApp` for ``app_id`` on ``api_url`` (its token cache serves every task)."""
    key = (api_url.rstrip("/"), app_id, private_key)
    with _apps_lock:
        if key not in _apps:
            _apps[key] = GitHubApp(api_url, app_id, private_key)
        return _apps[key]

