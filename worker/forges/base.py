"""The forge seam (SPEC §5, §8): one contract for GitHub and GitLab, and the HTTP they share.

Tokens travel only in request headers and in git's environment (``http.<origin>.extraHeader``), never in a
URL that is cloned, persisted or logged.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import structlog

from contexts.errors import TasukiError
from contexts.masking import mask
from worker.permissions import Level, PermissionUnknown, Person

log = structlog.get_logger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_PAGES = 20


class ForgeError(TasukiError):
    """A forge API call failed; the message names the call and the answer, never a credential."""


class CredentialError(ForgeError):
    """No valid credential can be had for the forge (a GitHub App's installation suspended or removed, its key
    wrong, this host's clock too far off): the task cannot go on; the message names which."""


class Credential(Protocol):
    """Where a forge client gets its token, at the moment of each call (a GitHub App's expire within the hour)."""

    def token(self) -> str | None:
        """A token valid now; None: no authentication."""
        ...

    def refused(self, token: str) -> bool:
        """The forge refused ``token`` (401) before its time: whether another one may be had."""
        ...


@dataclass(frozen=True)
class StaticToken:
    """A token that does not expire (a personal or project access token from the environment)."""

    value: str | None

    def token(self) -> str | None:
        """The token itself."""
        return self.value

    def refused(self, token: str) -> bool:
        """There is no other."""
        return False


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer`` with the credential's token as of each request (and each retry)."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Set the header (httpx drops it on a redirect to another host); a token refused before its time
        (revoked) is replaced once."""
        token = self.credential.token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401 and token and self.credential.refused(token):
            fresh = self.credential.token()
            if fresh and fresh != token:
                request.headers["Authorization"] = f"Bearer {fresh}"
                yield request


class LiveGitEnv(Mapping[str, str]):
    """Git's environment computed anew each time git is run, so a push hours into a task carries a token
    valid at that moment (the mapping is read once per git command)."""

    def __init__(self, current: Callable[[], dict[str, str]]) -> None:
        self._current = current

    def __getitem__(self, key: str) -> str:
        return self._current()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


class ForgeRefused(ForgeError):
    """The forge refused the call or found nothing there (HTTP 401, 403, 404): asking again will not help;
    a token without a permission gets these (GitHub answers 404 for what a token may not see)."""


REFUSED_STATUSES = frozenset({401, 403, 404})
PERMISSION_RETRIES = 1  # a lookup the forge does not answer at once is held and asked again later (the intake's)


def asked_permission(http: ForgeHTTP, path: str, params: Mapping[str, Any] | None = None) -> Any:
    """The JSON of a permission lookup; None when the forge says the person is not there (404); raises
    :class:`PermissionUnknown` for anything else that is not an answer (5xx, timeout, 401/403 of a suspended
    installation or a refused token): never read as "no permission", never as "allowed"."""
    try:
        response = http.request("GET", path, params=params, missing_ok=True, retries=PERMISSION_RETRIES)
        return None if response.status_code == 404 else response.json()
    except (ForgeError, ValueError) as exc:
        raise PermissionUnknown(f"the forge did not say: {mask(str(exc))[:200]}") from None


@dataclass(frozen=True)
class ItemRef:
    """An issue, pull request or merge request: ``kind`` is the task key's ``task_type``."""

    owner: str
    repo: str
    kind: str
    number: int

    @classmethod
    def from_task_key(cls, task_key: Mapping[str, str]) -> ItemRef | None:
        """The item a task key names; None for a prompt-only task."""
        if task_key.get("task_type") not in ("issue", "pull_request", "merge_request"):
            return None
        return cls(task_key["owner"], task_key["repo"], task_key["task_type"], int(task_key["task_id"]))


@dataclass(frozen=True)
class Comment:
    """One comment (GitHub) or note (GitLab)."""

    id: int
    author: str
    body: str


@dataclass(frozen=True)
class Item:
    """What the task reads of its issue or pull/merge request."""

    ref: ItemRef
    title: str
    body: str
    url: str
    labels: tuple[str, ...]
    comments: tuple[Comment, ...]


@dataclass(frozen=True)
class ReviewComment:
    """A comment on a line of a pull/merge request's diff: what a follow-up addresses and answers."""

    id: int
    author: str
    body: str
    path: str = ""
    line: int | None = None
    diff_hunk: str = ""
    thread: str = ""  # GitLab's discussion id (replies go there); GitHub replies to the comment's id

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReviewComment:
        """From the dict a task request carries."""
        line = data.get("line")
        return cls(int(data.get("id") or 0), str(data.get("author") or ""), str(data.get("body") or ""),
                   str(data.get("path") or ""), line if isinstance(line, int) else None,
                   str(data.get("diff_hunk") or ""), str(data.get("thread") or ""))


@dataclass(frozen=True)
class FailedJob:
    """A failed CI job and the tail of its log."""

    name: str
    log: str


@dataclass(frozen=True)
class Repository:
    """Where to clone from and which branch a pull/merge request targets."""

    clone_url: str
    default_branch: str


class Forge(Protocol):
    """GitHub or GitLab, as far as a task needs it."""

    source: str

    def repository(self, owner: str, repo: str) -> Repository:
        """The repository's clone URL and default branch."""
        ...

    def read_item(self, ref: ItemRef) -> Item:
        """The issue or pull/merge request with its labels and comments."""
        ...

    def move_labels(self, ref: ItemRef, add: Sequence[str], remove: Sequence[str]) -> None:
        """Add and remove labels (removing an absent label is not an error)."""
        ...

    def comment(self, ref: ItemRef, body: str, comment_id: int | None = None) -> int:
        """Post a comment, or replace the text of ``comment_id``; return the comment's id."""
        ...

    def open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str, *,
                    draft: bool = False) -> str:
        """Open a pull/merge request from ``head`` into ``base`` (or find the one already open); its URL. ``draft``:
        opened as a draft (the work of a task stopped by a limit), in the forge's own way."""
        ...

    def allows(self, ref: ItemRef, trigger: Mapping[str, Any]) -> bool:
        """Whether the user who triggered the task may start one on this repository."""
        ...

    def permission(self, owner: str, repo: str, person: Person) -> Level:
        """``person``'s permission on the repository on Tasuki's scale (none when not a member); raises
        :class:`~worker.permissions.PermissionUnknown` when the forge cannot say."""
        ...

    def review_comments(self, ref: ItemRef, review_id: int) -> list[ReviewComment]:
        """The line comments of one submitted review (GitHub); GitLab's notes come with their webhook."""
        ...

    def reply_in_thread(self, ref: ItemRef, comment: ReviewComment, body: str) -> None:
        """Answer in the review thread of ``comment``."""
        ...

    def failed_jobs(self, owner: str, repo: str, ci: Mapping[str, Any], max_lines: int) -> list[FailedJob]:
        """The failed jobs of a CI run (``ci`` as the intake recorded it) with their logs' last lines."""
        ...

    def git_env(self, clone_url: str) -> Mapping[str, str]:
        """Environment that gives git the token for ``clone_url``'s host only."""
        ...

    def close(self) -> None:
        """Release the HTTP connections."""
        ...


def find_comment(comments: Sequence[Comment], marker: str) -> int | None:
    """The id of the newest comment that carries ``marker``."""
    found = [c.id for c in comments if marker in c.body]
    return found[-1] if found else None


def log_tail(text: str, max_lines: int) -> str:
    """The last ``max_lines`` lines of a CI log, masked (logs print environment and tokens)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return mask("\n".join(lines[-max_lines:]).strip())


def unreadable(what: str, exc: ForgeError) -> str:
    """What the model is told in place of a CI log the forge would not give, and why (a 403/404 is usually a
    token without permission to read checks or CI jobs)."""
    hint = " (the token may lack permission to read CI checks and job logs)" if isinstance(exc, ForgeRefused) else ""
    return mask(f"{what} could not be read: {exc}{hint}")


def basic_auth_env(clone_url: str, username: str, token: str | None) -> dict[str, str]:
    """``GIT_CONFIG_*`` variables adding ``Authorization: Basic`` for the clone URL's origin, nothing else."""
    parts = urlsplit(clone_url)
    if not token or parts.scheme not in ("http", "https") or not parts.hostname:
        return {}
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    credentials = base64.b64encode(f"{username}:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"http.{parts.scheme}://{host}/.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {credentials}",
    }


class ForgeHTTP:
    """A JSON client on one API root; retries rate limits, 5xx and connection errors with backoff."""

    def __init__(
        self,
        api_url: str,
        headers: Mapping[str, str],
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        auth: httpx.Auth | None = None,
    ) -> None:
        self.client = httpx.Client(base_url=api_url.rstrip("/") + "/", headers=dict(headers), timeout=timeout_s,
                                   auth=auth)
        self.retries = retries
        self.backoff_s = backoff_s

    def request(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
        missing_ok: bool = False, follow_redirects: bool = False, answered: Collection[int] = (),
        retries: int | None = None,
    ) -> httpx.Response:
        """One call; raises :class:`ForgeError` on a final failure (a 404 too, unless ``missing_ok``; a status in
        ``answered`` is the caller's to read). ``retries``: fewer than the client's, for a caller that retries
        later itself (the intake's permission lookups hold the delivery instead)."""
        tries = self.retries if retries is None else retries
        # A POST that reached the server may have taken effect: retry it only when it surely did not.
        retry_on = RETRY_STATUSES if method != "POST" else frozenset({429})
        retry_errors = httpx.TransportError if method != "POST" else httpx.ConnectError
        for attempt in range(tries + 1):
            last = attempt == tries
            try:
                response = self.client.request(method, path.lstrip("/"), params=params, json=json,
                                               follow_redirects=follow_redirects)
            except retry_errors as exc:
                if last:
                    raise ForgeError(f"{method} {path}: {type(exc).__name__}: {mask(str(exc))[:200]}") from None
                time.sleep(self._delay(attempt, None))
                continue
            except httpx.TransportError as exc:
                raise ForgeError(f"{method} {path}: {type(exc).__name__}: {mask(str(exc))[:200]}") from None
            if response.status_code in retry_on and not last:
                time.sleep(self._delay(attempt, response))
                continue
            break
        if (response.status_code == 404 and missing_ok) or response.status_code in answered:
            return response
        if response.status_code >= 400:
            failed = ForgeRefused if response.status_code in REFUSED_STATUSES else ForgeError
            raise failed(f"{method} {path}: HTTP {response.status_code}: {mask(response.text)[:300]}")
        return response

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        retry_after = response.headers.get("retry-after", "") if response is not None else ""
        if retry_after.isdigit():
            return min(float(retry_after), 30.0)
        return float(self.backoff_s * 2**attempt)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """The decoded JSON answer of a call."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ForgeError(f"{method} {path}: answer is not JSON") from None

    def pages(self, path: str, params: Mapping[str, Any]) -> Iterator[Any]:
        """Every element of a paged list (GitHub's ``Link: rel="next"``, GitLab's ``X-Next-Page``)."""
        url, query = path, {**params, "per_page": 100}
        for _ in range(MAX_PAGES):
            response = self.request("GET", url, params=query)
            items = response.json()
            if not isinstance(items, list):
                raise ForgeError(f"GET {path}: expected a list")
            yield from items
            following = response.links.get("next", {}).get("url", "")
            next_page = response.headers.get("x-next-page", "")
            if following.startswith(str(self.client.base_url)):  # never send the token to another host
                url, query = following, {}
            elif next_page.isdigit():
                query = {**query, "page": int(next_page)}
            else:
                return

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
