"""A fake GitHub, GitLab and Gitea in one real HTTP server, over local bare git repositories.

- ``/api/v3/...`` speaks the GitHub REST subset Tasuki uses, ``/api/v4/...`` the GitLab REST v4 subset,
  ``/api/v1/...`` the Gitea (and Forgejo) REST v1 subset; the first two refuse a request without
  ``Authorization: Bearer {token}``, Gitea's without ``Authorization: token {token}``.
- With ``app=FakeApp(...)`` (tests/helpers/fake_github_app.py) the GitHub side is a GitHub App's: it takes
  only installation tokens valid at the moment (API and git), and the App's JWT on ``/app/...``.
- ``/git/{owner}/{repo}.git`` is git's smart HTTP protocol, served by ``git http-backend`` from bare
  repositories under ``root``; it refuses a request without the Basic credentials of the dialect
  (``x-access-token:{token}`` for GitHub, ``oauth2:{token}`` for GitLab, ``tasuki:{token}`` for Gitea), so a
  clone or push only works when the worker passed them out of band.

with FakeForge(tmp_path / "forge", token="t0ken").serve() as forge:
    forge.add_repo("octo", "hello", source_checkout)
    forge.add_item("octo", "hello", 1, "Fix add()", labels=["bug"])
    ... forge.github_api_url, forge.gitlab_api_url, forge.item("octo", "hello", 1).comments
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.helpers.fake_github_app import FakeApp
from tests.helpers.git_http import git_authorized, git_backend, git_password


@dataclass
class FakeComment:
    id: int
    author: str
    body: str
    history: list[str] = field(default_factory=list)  # earlier bodies, oldest first (edits in place)


@dataclass
class FakeItem:
    """An issue, pull request or merge request."""

    owner: str
    repo: str
    number: int
    title: str
    body: str = ""
    kind: str = "issue"
    labels: list[str] = field(default_factory=list)
    comments: list[FakeComment] = field(default_factory=list)


@dataclass
class FakeChange:
    """A pull/merge request opened through the API."""

    owner: str
    repo: str
    number: int
    head: str
    base: str
    title: str
    body: str
    url: str
    draft: bool = False  # GitHub's draft flag; GitLab's and Gitea's read from the title, as they do


# How GitLab and Gitea tell a draft by its title (GitLab: "Draft merge requests"; Gitea's default
# WORK_IN_PROGRESS_PREFIXES), case-insensitive as both are.
GITLAB_DRAFT = re.compile(r"^\s*(\[draft\]|\(draft\)|draft:)", re.IGNORECASE)
GITEA_WIP = re.compile(r"^\s*(wip:|\[wip\])", re.IGNORECASE)


@dataclass
class FakeReviewComment:
    """A line comment of a pull request review (GitHub) or a diff note (GitLab), and the replies in its thread."""

    id: int
    review_id: int
    author: str
    body: str
    path: str
    line: int
    diff_hunk: str
    replies: list[str] = field(default_factory=list)

    def github(self, pull_url: str) -> dict[str, Any]:
        """As GitHub's REST API and webhooks show it."""
        return {"id": self.id, "pull_request_review_id": self.review_id, "user": {"login": self.author},
                "body": self.body, "path": self.path, "line": self.line, "original_line": self.line,
                "side": "RIGHT", "diff_hunk": self.diff_hunk, "author_association": "OWNER",
                "pull_request_url": pull_url, "in_reply_to_id": None}


@dataclass
class FakeJob:
    """A CI job (a GitHub Actions job, which is also its check run; a GitLab job) and its log."""

    id: int
    name: str
    conclusion: str  # success | failure
    log: str


@dataclass(frozen=True)
class Raw:
    """An answer that is not JSON: a redirect or a plain-text log."""

    status: int
    body: bytes
    headers: dict[str, str]


class ForgeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RawAnswer(Exception):
    """Raised by a route whose answer is not JSON."""

    def __init__(self, raw: Raw) -> None:
        super().__init__(raw.status)
        self.raw = raw


class FakeForge:
    """The forge's state; :meth:`serve` puts it behind HTTP."""

    def __init__(self, root: Path, token: str, bot_login: str = "tasuki-bot", app: FakeApp | None = None) -> None:
        self.root = root
        self.app = app  # a GitHub App: the GitHub side takes its installation tokens (and JWT) instead of ``token``
        self.git_root = root / "git"
        self.git_root.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.bot_login = bot_login
        self.items: dict[tuple[str, str, int], FakeItem] = {}
        self.changes: list[FakeChange] = []
        # The published examples' senders own their repositories (GitLab's root, user 1; Gitea's unknwon of gogits),
        # as on the forges the examples came from; a test changes them to try another permission.
        self.members: dict[int, int] = {1: 50}  # GitLab user id -> access level
        self.permissions: dict[str, str] = {"unknwon": "owner"}  # Gitea login -> permission (owner, admin, write, read)
        # GitHub login -> role (admin, maintain, write, triage, read); a repository's owner is its admin, as on GitHub
        self.roles: dict[str, str] = {}
        self.usernames: dict[str, int] = {}  # GitLab username -> user id (GET /users?username=)
        # A suspended forge: the status every permission lookup answers (503, or 403 for a suspended installation)
        self.permission_fault: int | None = None
        self.repo_labels: dict[tuple[str, str], dict[str, int]] = {}  # Gitea: a repository's labels, name -> id
        self.review_comments: list[FakeReviewComment] = []
        self.discussion_replies: dict[str, list[str]] = {}  # GitLab discussion id -> reply bodies
        self.on_open: Callable[[FakeChange], None] | None = None  # called as a pull/merge request is opened
        self.runs: dict[int, list[FakeJob]] = {}  # workflow run / check suite / pipeline id -> its jobs
        self.requests: list[dict[str, Any]] = []
        self.faults: list[int] = []  # statuses the next API requests get instead of an answer
        # A token without permission to read CI: the status its job listings (checks, runs, pipelines) and its
        # job logs answer instead (GitHub answers 403, or 404 for what the token may not see).
        self.ci_refused: int | None = None
        self.logs_refused: int | None = None
        self.lock = threading.Lock()
        self._ids = 1000
        self.url = ""

    # -- set-up ------------------------------------------------------------------------------------

    def add_repo(self, owner: str, repo: str, source: Path) -> Path:
        """A bare clone of the checkout ``source`` as ``owner/repo``."""
        bare = self.git_root / owner / f"{repo}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True, capture_output=True)
        return bare

    def add_item(self, owner: str, repo: str, number: int, title: str, body: str = "", *, kind: str = "issue",
                 labels: list[str] | None = None, comments: tuple[tuple[str, str], ...] = ()) -> FakeItem:
        item = FakeItem(owner, repo, number, title, body, kind, list(labels or []))
        for author, text in comments:
            item.comments.append(FakeComment(self._next_id(), author, text))
        self.items[(owner, repo, number)] = item
        return item

    def add_review(self, owner: str, repo: str, pull: int, author: str,
                   comments: list[tuple[str, int, str, str]]) -> tuple[int, list[FakeReviewComment]]:
        """A submitted review with line comments ``(path, line, diff_hunk, body)``; its id and comments."""
        review_id = self._next_id()
        made = [FakeReviewComment(self._next_id(), review_id, author, body, path, line, hunk)
                for path, line, hunk, body in comments]
        self.review_comments += made
        return review_id, made

    def add_run(self, jobs: list[tuple[str, str, str]]) -> int:
        """A finished CI run with jobs ``(name, conclusion, log)``; its id (run, check suite and pipeline)."""
        run_id = self._next_id()
        self.runs[run_id] = [FakeJob(self._next_id(), name, conclusion, log) for name, conclusion, log in jobs]
        return run_id

    def _job(self, job_id: int) -> FakeJob:
        for jobs in self.runs.values():
            for job in jobs:
                if job.id == job_id:
                    return job
        raise ForgeError(404, "Not Found")

    def _refuse_ci(self, log: bool) -> None:
        status = self.logs_refused if log else self.ci_refused
        if status is not None:
            raise ForgeError(status, "Resource not accessible by integration" if status == 403 else "Not Found")

    def change(self, owner: str, repo: str, head: str) -> FakeChange:
        """The pull/merge request of a branch."""
        return next(c for c in self.changes if (c.owner, c.repo, c.head) == (owner, repo, head))

    def item(self, owner: str, repo: str, number: int) -> FakeItem:
        return self.items[(owner, repo, number)]

    def branch_file(self, owner: str, repo: str, branch: str, path: str) -> str:
        """A file's text on a branch of the bare repository."""
        bare = self.git_root / owner / f"{repo}.git"
        return subprocess.run(["git", "show", f"{branch}:{path}"], cwd=bare, check=True, capture_output=True,
                              text=True).stdout

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    @property
    def github_api_url(self) -> str:
        return f"{self.url}/api/v3"

    @property
    def gitlab_api_url(self) -> str:
        return f"{self.url}/api/v4"

    @property
    def gitea_api_url(self) -> str:
        return f"{self.url}/api/v1"

    def git_url(self, owner: str, repo: str) -> str:
        return f"{self.url}/git/{owner}/{repo}.git"

    @contextmanager
    def serve(self, host: str = "127.0.0.1") -> Iterator[FakeForge]:
        """Serve on a free port of ``host`` (an address of the network namespace the calling thread is in)."""
        server = ThreadingHTTPServer((host, 0), _handler_for(self))
        server.daemon_threads = True
        self.url = f"http://{host}:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-forge",
                                  daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

    # -- shared behaviour --------------------------------------------------------------------------

    def _find(self, owner: str, repo: str, number: int) -> FakeItem:
        found = self.items.get((owner, repo, number))
        if found is None:
            raise ForgeError(404, "Not Found")
        return found

    def _comment(self, item: FakeItem, comment_id: int) -> FakeComment:
        for comment in item.comments:
            if comment.id == comment_id:
                return comment
        raise ForgeError(404, "Not Found")

    def _branch_exists(self, owner: str, repo: str, branch: str) -> bool:
        bare = self.git_root / owner / f"{repo}.git"
        found = subprocess.run(["git", "rev-parse", "--verify", "-q", f"refs/heads/{branch}"], cwd=bare,
                               capture_output=True, check=False)
        return found.returncode == 0

    def _default_branch(self, owner: str, repo: str) -> str:
        bare = self.git_root / owner / f"{repo}.git"
        if not bare.is_dir():
            raise ForgeError(404, "Not Found")
        head = subprocess.run(["git", "symbolic-ref", "--short", "HEAD"], cwd=bare, capture_output=True,
                              text=True, check=True)
        return head.stdout.strip()

    def _open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str, web: str,
                     draft: bool = False) -> FakeChange:
        if not self._branch_exists(owner, repo, head):
            raise ForgeError(422, f"head branch {head} does not exist")
        if any((c.owner, c.repo, c.head) == (owner, repo, head) for c in self.changes):  # as the real forges do
            raise ForgeError(422 if web == "pull" else 409, f"A pull request already exists for {owner}:{head}.")
        number = len(self.changes) + 100
        change = FakeChange(owner, repo, number, head, base, title, body, f"{self.url}/{owner}/{repo}/{web}/{number}",
                            draft)
        self.changes.append(change)
        # A pull request is an issue too (labels, conversation comments).
        kind = "merge_request" if web.endswith("merge_requests") else "pull_request"
        self.items[(owner, repo, number)] = FakeItem(owner, repo, number, title, body, kind)
        if self.on_open is not None:
            self.on_open(change)
        return change

    # -- GitHub ------------------------------------------------------------------------------------

    def github(self, method: str, parts: list[str], query: dict[str, str], data: Any) -> tuple[int, Any]:
        if len(parts) < 3 or parts[0] != "repos":
            raise ForgeError(404, "Not Found")
        owner, repo, rest = parts[1], parts[2], parts[3:]
        if not rest and method == "GET":
            return 200, {"full_name": f"{owner}/{repo}", "clone_url": self.git_url(owner, repo),
                         "default_branch": self._default_branch(owner, repo)}
        if rest[:2] == ["issues", "comments"] and len(rest) == 3 and method == "PATCH":
            for item in self.items.values():
                for comment in item.comments:
                    if comment.id == int(rest[2]) and (item.owner, item.repo) == (owner, repo):
                        comment.history.append(comment.body)
                        comment.body = data["body"]
                        return 200, self._github_comment(comment)
            raise ForgeError(404, "Not Found")
        if rest[:1] == ["issues"] and len(rest) >= 2:
            return self._github_issue(method, self._find(owner, repo, int(rest[1])), rest[2:], data)
        if rest == ["pulls"]:
            return self._github_pulls(method, owner, repo, query, data)
        if rest[:1] == ["pulls"] and len(rest) >= 3:
            return self._github_pull(method, owner, repo, int(rest[1]), rest[2:], data)
        return self._github_actions(method, owner, repo, rest)

    def _github_permission(self, owner: str, login: str) -> tuple[int, Any]:
        """``role_name`` and the folded ``permission`` (maintain is write, triage is read), as GitHub answers."""
        self._permission_fault()
        role = self.roles.get(login) or ("admin" if login == owner else None)
        if role is None:
            raise ForgeError(404, f"{login} is not a user")
        folded = {"maintain": "write", "triage": "read"}.get(role, role)
        return 200, {"permission": folded, "role_name": role, "user": {"login": login}}

    def _permission_fault(self) -> None:
        if self.permission_fault is not None:
            raise ForgeError(self.permission_fault, "scripted: the forge cannot say (suspended)")

    def _github_pulls(self, method: str, owner: str, repo: str, query: dict[str, str], data: Any
                      ) -> tuple[int, Any]:
        if method == "GET":
            head = query.get("head", "").split(":", 1)[-1]
            return 200, [{"number": c.number, "html_url": c.url} for c in self.changes
                         if (c.owner, c.repo, c.head) == (owner, repo, head)]
        if not isinstance(data.get("draft", False), bool):
            raise ForgeError(422, "draft is not a boolean")
        change = self._open_change(owner, repo, data["head"], data["base"], data["title"], data.get("body", ""),
                                   "pull", data.get("draft", False))
        return 201, {"number": change.number, "html_url": change.url}

    def _github_pull(self, method: str, owner: str, repo: str, number: int, rest: list[str], data: Any
                     ) -> tuple[int, Any]:
        pull_url = f"{self.github_api_url}/repos/{owner}/{repo}/pulls/{number}"
        if len(rest) == 3 and rest[0] == "reviews" and rest[2] == "comments" and method == "GET":
            return 200, [c.github(pull_url) for c in self.review_comments if c.review_id == int(rest[1])]
        if len(rest) == 3 and rest[0] == "comments" and rest[2] == "replies" and method == "POST":
            comment = next((c for c in self.review_comments if c.id == int(rest[1])), None)
            if comment is None:
                raise ForgeError(404, "Not Found")
            comment.replies.append(data["body"])
            return 201, {"id": self._next_id(), "body": data["body"], "in_reply_to_id": comment.id,
                         "user": {"login": self.bot_login}}
        raise ForgeError(404, "Not Found")

    def _github_actions(self, method: str, owner: str, repo: str, rest: list[str]) -> tuple[int, Any]:
        if method != "GET":
            raise ForgeError(404, "Not Found")
        if len(rest) == 3 and rest[0] == "collaborators" and rest[2] == "permission":
            return self._github_permission(owner, rest[1])
        self._refuse_ci(rest[-1] == "logs")
        if len(rest) == 4 and rest[:2] == ["actions", "runs"] and rest[3] == "jobs":
            jobs = self.runs.get(int(rest[2]), [])
            return 200, {"total_count": len(jobs), "jobs": [
                {"id": j.id, "run_id": int(rest[2]), "name": j.name, "status": "completed",
                 "conclusion": j.conclusion} for j in jobs]}
        if len(rest) == 3 and rest[0] == "check-suites" and rest[2] == "check-runs":
            jobs = self.runs.get(int(rest[1]), [])
            return 200, {"total_count": len(jobs), "check_runs": [
                {"id": j.id, "name": j.name, "status": "completed", "conclusion": j.conclusion} for j in jobs]}
        if len(rest) == 4 and rest[:2] == ["actions", "jobs"] and rest[3] == "logs":
            job = self._job(int(rest[2]))
            # As GitHub does: a redirect to a short-lived download URL (here, on the same server).
            raise RawAnswer(Raw(302, b"", {"Location": f"{self.url}/_logs/{job.id}"}))
        raise ForgeError(404, "Not Found")

    def _github_issue(self, method: str, item: FakeItem, rest: list[str], data: Any) -> tuple[int, Any]:
        if not rest and method == "GET":
            issue = {"number": item.number, "title": item.title, "body": item.body,
                     "html_url": f"{self.url}/{item.owner}/{item.repo}/issues/{item.number}",
                     "labels": [{"name": name} for name in item.labels]}
            if item.kind == "pull_request":
                issue["pull_request"] = {"url": "..."}
            return 200, issue
        if rest == ["comments"] and method == "GET":
            return 200, [self._github_comment(c) for c in item.comments]
        if rest == ["comments"] and method == "POST":
            comment = FakeComment(self._next_id(), self.bot_login, data["body"])
            item.comments.append(comment)
            return 201, self._github_comment(comment)
        if rest == ["labels"] and method == "POST":
            item.labels += [name for name in data["labels"] if name not in item.labels]
            return 200, [{"name": name} for name in item.labels]
        if len(rest) == 2 and rest[0] == "labels" and method == "DELETE":
            if rest[1] not in item.labels:
                raise ForgeError(404, "Label does not exist")
            item.labels.remove(rest[1])
            return 200, [{"name": name} for name in item.labels]
        raise ForgeError(404, "Not Found")

    @staticmethod
    def _github_comment(comment: FakeComment) -> dict[str, Any]:
        return {"id": comment.id, "body": comment.body, "user": {"login": comment.author}}

    # -- GitLab ------------------------------------------------------------------------------------

    def gitlab(self, method: str, parts: list[str], query: dict[str, str], data: Any) -> tuple[int, Any]:
        if len(parts) < 2 or parts[0] != "projects" or "/" not in parts[1]:
            raise ForgeError(404, "404 Project Not Found")
        owner, repo = parts[1].rsplit("/", 1)
        rest = parts[2:]
        if not rest and method == "GET":
            return 200, {"id": 7, "path_with_namespace": parts[1], "http_url_to_repo": self.git_url(owner, repo),
                         "default_branch": self._default_branch(owner, repo)}
        if rest[:2] == ["members", "all"] and len(rest) == 3:
            self._permission_fault()
            level = self.members.get(int(rest[2]))
            if level is None:
                raise ForgeError(404, "404 Not found")
            return 200, {"id": int(rest[2]), "access_level": level}
        if rest == ["merge_requests"] and method == "GET":
            return 200, [{"iid": c.number, "web_url": c.url} for c in self.changes
                         if (c.owner, c.repo, c.head) == (owner, repo, query.get("source_branch"))]
        if rest == ["merge_requests"] and method == "POST":
            change = self._open_change(owner, repo, data["source_branch"], data["target_branch"], data["title"],
                                       data.get("description", ""), "-/merge_requests",
                                       bool(GITLAB_DRAFT.match(data["title"])))
            return 201, {"iid": change.number, "web_url": change.url}
        if rest[:1] in (["issues"], ["merge_requests"]) and len(rest) >= 2:
            return self._gitlab_item(method, self._find(owner, repo, int(rest[1])), rest[2:], data)
        if len(rest) == 3 and rest[0] in ("pipelines", "jobs") and rest[2] in ("jobs", "trace") and method == "GET":
            self._refuse_ci(rest[2] == "trace")
        if len(rest) == 3 and rest[0] == "pipelines" and rest[2] == "jobs" and method == "GET":
            scope = query.get("scope[]")
            return 200, [{"id": j.id, "name": j.name, "status": "failed" if j.conclusion == "failure" else "success"}
                         for j in self.runs.get(int(rest[1]), [])
                         if scope is None or (scope == "failed") == (j.conclusion == "failure")]
        if len(rest) == 3 and rest[0] == "jobs" and rest[2] == "trace" and method == "GET":
            raise RawAnswer(Raw(200, self._job(int(rest[1])).log.encode(), {"Content-Type": "text/plain"}))
        raise ForgeError(404, "404 Not Found")

    def gitlab_users(self, username: str) -> tuple[int, Any]:
        self._permission_fault()
        found = self.usernames.get(username)
        return 200, [{"id": found, "username": username}] if found is not None else []

    def _gitlab_item(self, method: str, item: FakeItem, rest: list[str], data: Any) -> tuple[int, Any]:
        if not rest and method in ("GET", "PUT"):
            if method == "PUT":
                for name in filter(None, data.get("remove_labels", "").split(",")):
                    if name in item.labels:
                        item.labels.remove(name)
                item.labels += [n for n in filter(None, data.get("add_labels", "").split(",")) if n not in item.labels]
            return 200, {"iid": item.number, "title": item.title, "description": item.body, "labels": item.labels,
                         "web_url": f"{self.url}/{item.owner}/{item.repo}/-/issues/{item.number}"}
        if rest == ["notes"] and method == "GET":
            return 200, [self._gitlab_note(c) for c in item.comments]
        if rest == ["notes"] and method == "POST":
            comment = FakeComment(self._next_id(), self.bot_login, data["body"])
            item.comments.append(comment)
            return 201, self._gitlab_note(comment)
        if len(rest) == 3 and rest[0] == "discussions" and rest[2] == "notes" and method == "POST":
            self.discussion_replies.setdefault(rest[1], []).append(data["body"])
            return 201, {"id": self._next_id(), "body": data["body"], "author": {"username": self.bot_login}}
        if len(rest) == 2 and rest[0] == "notes" and method == "PUT":
            comment = self._comment(item, int(rest[1]))
            comment.history.append(comment.body)
            comment.body = data["body"]
            return 200, self._gitlab_note(comment)
        raise ForgeError(404, "404 Not Found")

    @staticmethod
    def _gitlab_note(comment: FakeComment) -> dict[str, Any]:
        return {"id": comment.id, "body": comment.body, "author": {"username": comment.author}, "system": False}


    # -- Gitea -------------------------------------------------------------------------------------

    def gitea(self, method: str, parts: list[str], query: dict[str, str], data: Any) -> tuple[int, Any]:
        if len(parts) < 3 or parts[0] != "repos":
            raise ForgeError(404, "The target couldn't be found.")
        owner, repo, rest = parts[1], parts[2], parts[3:]
        if not rest and method == "GET":
            return 200, {"full_name": f"{owner}/{repo}", "clone_url": self.git_url(owner, repo),
                         "default_branch": self._default_branch(owner, repo)}
        if rest[:2] == ["issues", "comments"] and len(rest) == 3 and method == "PATCH":
            for item in self.items.values():
                for comment in item.comments:
                    if comment.id == int(rest[2]) and (item.owner, item.repo) == (owner, repo):
                        comment.history.append(comment.body)
                        comment.body = data["body"]
                        return 200, self._github_comment(comment)
            raise ForgeError(404, "The target couldn't be found.")
        if rest[:1] == ["issues"] and len(rest) >= 2:
            return self._gitea_issue(method, self._find(owner, repo, int(rest[1])), rest[2:], data)
        if rest == ["labels"]:
            return self._gitea_labels(method, owner, repo, data)
        if rest[:1] == ["pulls"]:
            return self._gitea_pulls(method, owner, repo, rest[1:], data)
        if len(rest) == 3 and rest[0] == "collaborators" and rest[2] == "permission" and method == "GET":
            self._permission_fault()
            permission = self.permissions.get(rest[1])
            if permission is None:
                raise ForgeError(404, "user does not exist")
            return 200, {"permission": permission, "role_name": permission, "user": {"login": rest[1]}}
        raise ForgeError(404, "The target couldn't be found.")

    def _gitea_label_id(self, owner: str, repo: str, name: str) -> int:
        """The id of a repository label (a label an item was set up with exists in its repository)."""
        labels = self.repo_labels.setdefault((owner, repo), {})
        if name not in labels:
            labels[name] = self._next_id()
        return labels[name]

    def _gitea_label_list(self, owner: str, repo: str, names: list[str]) -> list[dict[str, Any]]:
        return [{"id": self._gitea_label_id(owner, repo, n), "name": n, "color": "ededed"} for n in names]

    def _gitea_labels(self, method: str, owner: str, repo: str, data: Any) -> tuple[int, Any]:
        known = self.repo_labels.setdefault((owner, repo), {})
        if method == "GET":
            return 200, self._gitea_label_list(owner, repo, list(known))
        if method == "POST":
            if data["name"] in known or not data.get("color"):
                raise ForgeError(422, "label exists or has no colour")
            return 201, self._gitea_label_list(owner, repo, [data["name"]])[0]
        raise ForgeError(405, "Method Not Allowed")

    def _gitea_issue(self, method: str, item: FakeItem, rest: list[str], data: Any) -> tuple[int, Any]:
        owner, repo = item.owner, item.repo
        if not rest and method == "GET":
            web = "pulls" if item.kind == "pull_request" else "issues"
            issue = {"number": item.number, "title": item.title, "body": item.body,
                     "html_url": f"{self.url}/{owner}/{repo}/{web}/{item.number}",
                     "labels": self._gitea_label_list(owner, repo, item.labels),
                     "pull_request": {"merged": False} if item.kind == "pull_request" else None}
            return 200, issue
        if rest == ["comments"] and method == "GET":
            return 200, [self._github_comment(c) for c in item.comments]
        if rest == ["comments"] and method == "POST":
            comment = FakeComment(self._next_id(), self.bot_login, data["body"])
            item.comments.append(comment)
            return 201, self._github_comment(comment)
        if rest == ["labels"] and method == "POST":
            ids = {i: n for n, i in self.repo_labels.get((owner, repo), {}).items()}
            if not all(isinstance(i, int) and i in ids for i in data["labels"]):  # ids of repository labels only
                raise ForgeError(422, "labels must be ids of the repository's labels")
            item.labels += [ids[i] for i in data["labels"] if ids[i] not in item.labels]
            return 200, self._gitea_label_list(owner, repo, item.labels)
        if len(rest) == 2 and rest[0] == "labels" and method == "DELETE":
            names = {i: n for n, i in self.repo_labels.get((owner, repo), {}).items()}
            name = names.get(int(rest[1]))
            if name is None or name not in item.labels:
                raise ForgeError(404, "label not found")
            item.labels.remove(name)
            return 204, None
        raise ForgeError(404, "The target couldn't be found.")

    def _gitea_pulls(self, method: str, owner: str, repo: str, rest: list[str], data: Any) -> tuple[int, Any]:
        if not rest and method == "POST":
            if any((c.owner, c.repo, c.head, c.base) == (owner, repo, data["head"], data["base"])
                   for c in self.changes):
                raise ForgeError(409, "pull request already exists for these targets")
            change = self._open_change(owner, repo, data["head"], data["base"], data["title"], data.get("body", ""),
                                       "pulls", bool(GITEA_WIP.match(data["title"])))
            return 201, {"number": change.number, "html_url": change.url}
        if len(rest) >= 2 and method == "GET":  # /pulls/{base}/{head...}: the head branch may hold slashes
            base, head = rest[0], "/".join(rest[1:])
            for change in self.changes:
                if (change.owner, change.repo, change.base, change.head) == (owner, repo, base, head):
                    return 200, {"number": change.number, "html_url": change.url,
                                 "head": {"ref": change.head}, "base": {"ref": change.base}}
            raise ForgeError(404, "pull request does not exist")
        raise ForgeError(404, "The target couldn't be found.")


def _handler_for(forge: FakeForge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm and delayed ACKs
            # hold every keep-alive answer back by ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the request log is ``forge.requests``."""

        def date_time_string(self, timestamp: float | None = None) -> str:
            """The ``Date`` header, by the App's clock when there is one (a test may move it an hour on)."""
            now = forge.app.clock() if forge.app is not None and timestamp is None else timestamp
            return formatdate(now, usegmt=True)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused_or_answered(self, parts: list[str]) -> bool:
            """Whether the credentials were refused (or the App answered alone); the answer is sent then."""
            scheme = "token" if parts[:2] == ["api", "v1"] else "Bearer"  # Gitea's, else GitHub's and GitLab's
            if forge.app is not None and parts[:2] == ["api", "v3"]:
                decided = forge.app.answer(self.command, parts[2:], self.headers.get("Authorization"))
            elif self.headers.get("Authorization") != f"{scheme} {forge.token}":
                decided = (401, {"message": "Bad credentials"})
            else:
                decided = None
            if decided is not None:
                self._send(decided[0], json.dumps(decided[1]).encode(), {"Content-Type": "application/json"})
            return decided is not None

        def _git_allowed(self, authorization: str) -> bool:
            if forge.app is None:
                return git_authorized(authorization, forge.token)
            password = git_password(authorization)
            return password is not None and forge.app.git_allows(password)

        def _send_log(self, job_id: str) -> None:
            try:
                log = forge._job(int(job_id)).log.encode()
            except (ForgeError, ValueError):
                self._send(404, b"Not Found", {})
                return
            self._send(200, log, {"Content-Type": "text/plain"})

        def _handle(self) -> None:
            split = urlsplit(self.path)
            body = self._body()
            record = {"method": self.command, "path": split.path, "authorization": self.headers.get("Authorization"),
                      "query": split.query}
            with forge.lock:
                forge.requests.append(record)
            if split.path.startswith("/git/"):
                if not self._git_allowed(self.headers.get("Authorization", "")):
                    self._send(401, b"auth required", {"WWW-Authenticate": 'Basic realm="fake forge"'})
                    return
                status, headers, payload = git_backend(forge.git_root, self.command, split.path[len("/git"):],
                                                       split.query, self.headers, body)
                self._send(status, payload, headers)
                return
            if split.path.startswith("/_logs/"):  # the pre-signed log download: no token (it is another host's)
                self._send_log(split.path.rsplit("/", 1)[-1])
                return
            parts = [unquote(p) for p in split.path.split("/") if p]
            if self._refused_or_answered(parts):
                return
            with forge.lock:
                fault = forge.faults.pop(0) if forge.faults else None
            if fault is not None:
                self._send(fault, b'{"message": "scripted fault"}', {"Content-Type": "application/json"})
                return
            query = {k: v[0] for k, v in parse_qs(split.query).items()}
            try:
                data = json.loads(body) if body else None
                with forge.lock:
                    if parts[:2] == ["api", "v3"]:
                        status, answer = forge.github(self.command, parts[2:], query, data)
                    elif parts[:3] == ["api", "v4", "users"] and self.command == "GET":
                        status, answer = forge.gitlab_users(query.get("username", ""))
                    elif parts[:2] == ["api", "v4"]:
                        status, answer = forge.gitlab(self.command, parts[2:], query, data)
                    elif parts[:2] == ["api", "v1"]:
                        status, answer = forge.gitea(self.command, parts[2:], query, data)
                    else:
                        raise ForgeError(404, "Not Found")
            except ForgeError as exc:
                status, answer = exc.status, {"message": str(exc)}
            except RawAnswer as raw:
                self._send(raw.raw.status, raw.raw.body, raw.raw.headers)
                return
            payload = b"" if status == 204 else json.dumps(answer).encode()  # a 204 has no body (keep-alive)
            self._send(status, payload, {"Content-Type": "application/json"})

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    return Handler
