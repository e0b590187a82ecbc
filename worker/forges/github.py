"""GitHub's REST API (github.com or Enterprise at ``github.api_url``) as a :class:`~worker.forges.base.Forge`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from contexts.masking import mask
from worker.forges.base import (
    BearerAuth,
    Credential,
    FailedJob,
    ForgeError,
    ForgeHTTP,
    ForgeRefused,
    ItemRef,
    LiveGitEnv,
    ReviewComment,
    StaticToken,
    asked_permission,
    basic_auth_env,
    log_tail,
    unreadable,
)
from worker.forges.repos_api import ReposAPI
from worker.permissions import Level, Person, github_level

API_VERSION = "2022-11-28"
HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION, "User-Agent": "tasuki"}


class GitHubForge(ReposAPI):
    """Issues, labels, comments and pull requests through ``/repos/{owner}/{repo}/...``."""

    source = "github"

    def __init__(self, api_url: str, credential: str | Credential | None, *, timeout_s: float = 30.0,
                 backoff_s: float = 0.5, identity: Callable[[], dict[str, str]] | None = None) -> None:
        """``credential``: a token, or where to get one valid at each call (a GitHub App's installation);
        ``identity``: git's author and committer variables (the App's bot), asked for as git first runs."""
        self.credential = StaticToken(credential) if credential is None or isinstance(credential, str) else credential
        self.http = ForgeHTTP(api_url, HEADERS, timeout_s=timeout_s, backoff_s=backoff_s,
                              auth=BearerAuth(self.credential))
        self.identity = identity

    def move_labels(self, ref: ItemRef, add: Sequence[str], remove: Sequence[str]) -> None:
        """``DELETE .../labels/{name}`` each (404: already gone), then ``POST .../labels``."""
        for name in remove:
            self.http.request("DELETE", f"{self._issue(ref)}/labels/{quote(name, safe='')}", missing_ok=True)
        if add:
            self.http.request("POST", f"{self._issue(ref)}/labels", json={"labels": list(add)})

    def comment(self, ref: ItemRef, body: str, comment_id: int | None = None) -> int:
        """``PATCH .../issues/comments/{id}``, or ``POST .../comments`` (also when the old one was deleted)."""
        if comment_id is not None:
            path = f"{self._repo(ref.owner, ref.repo)}/issues/comments/{comment_id}"
            response = self.http.request("PATCH", path, json={"body": body}, missing_ok=True)
            if response.status_code != 404:
                return comment_id
        return int(self.http.json("POST", f"{self._issue(ref)}/comments", json={"body": body})["id"])

    def open_change(self, owner: str, repo: str, head: str, base: str, title: str, body: str, *,
                    draft: bool = False) -> str:
        """The pull request of ``head`` (found, or opened now): one per branch, whoever asks and how often. A draft
        is opened with ``draft: true`` (``POST /repos/{owner}/{repo}/pulls``)."""
        pulls = f"{self._repo(owner, repo)}/pulls"
        found = self._pull_of(pulls, owner, head)
        if found is not None:
            return found
        body_json: dict[str, Any] = {"title": title, "head": head, "base": base, "body": body}
        if draft:
            body_json["draft"] = True
        created = self.http.request("POST", pulls, json=body_json, answered=(422,))
        if created.status_code == 422:  # "A pull request already exists": opened since we looked
            found = self._pull_of(pulls, owner, head)
            if found is None:
                raise ForgeError(f"POST {pulls}: HTTP 422: {mask(created.text)[:300]}")
            return found
        return str(created.json()["html_url"])

    def _pull_of(self, pulls: str, owner: str, head: str) -> str | None:
        existing = self.http.json("GET", pulls, params={"head": f"{owner}:{head}", "state": "all"})
        return str(existing[0]["html_url"]) if isinstance(existing, list) and existing else None

    def allows(self, ref: ItemRef, trigger: Mapping[str, Any]) -> bool:
        """Always: the intake already checked the comment's ``author_association`` (labels need triage rights)."""
        return True

    def permission(self, owner: str, repo: str, person: Person) -> Level:
        """``GET /repos/{owner}/{repo}/collaborators/{user}/permission`` (its ``role_name``, else ``permission``);
        an unknown user (404) has none."""
        path = f"{self._repo(owner, repo)}/collaborators/{quote(person.login, safe='')}/permission"
        answer = asked_permission(self.http, path)
        return github_level(answer) if isinstance(answer, dict) else Level.NONE

    def review_comments(self, ref: ItemRef, review_id: int) -> list[ReviewComment]:
        """``GET /repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}/comments``."""
        path = f"{self._repo(ref.owner, ref.repo)}/pulls/{ref.number}/reviews/{review_id}/comments"
        return [review_comment(c) for c in self.http.pages(path, {})]

    def reply_in_thread(self, ref: ItemRef, comment: ReviewComment, body: str) -> None:
        """``POST /repos/{owner}/{repo}/pulls/{number}/comments/{comment_id}/replies``."""
        top = int(comment.thread) if comment.thread.isdigit() else comment.id  # replies to replies are not allowed
        path = f"{self._repo(ref.owner, ref.repo)}/pulls/{ref.number}/comments/{top}/replies"
        self.http.request("POST", path, json={"body": body})

    def failed_jobs(self, owner: str, repo: str, ci: Mapping[str, Any], max_lines: int) -> list[FailedJob]:
        """The failed jobs of a workflow run (``run_id``) or the failed check runs of a check suite
        (``check_suite_id``; an Actions check run's id is its job's id), each with its log's tail."""
        base = self._repo(owner, repo)
        if ci.get("run_id"):
            jobs = self.http.json("GET", f"{base}/actions/runs/{int(ci['run_id'])}/jobs").get("jobs", [])
        else:
            suite = int(ci.get("check_suite_id") or 0)
            jobs = self.http.json("GET", f"{base}/check-suites/{suite}/check-runs").get("check_runs", [])
        failed = [j for j in jobs if isinstance(j, dict) and j.get("conclusion") in ("failure", "timed_out")]
        return [FailedJob(str(j.get("name") or j.get("id")), self._job_log(base, int(j["id"]), max_lines))
                for j in failed]

    def _job_log(self, base: str, job_id: int, max_lines: int) -> str:
        # The API answers 302 to a short-lived download URL (another host: httpx drops the token there).
        try:
            response = self.http.request("GET", f"{base}/actions/jobs/{job_id}/logs", follow_redirects=True)
        except ForgeRefused as exc:
            return f"({unreadable('the log', exc)})"
        return log_tail(response.text, max_lines)

    def git_env(self, clone_url: str) -> Mapping[str, str]:
        """``Authorization: Basic x-access-token:TOKEN`` for the clone URL's origin, with the token valid each
        time git runs (and the App's bot as author and committer)."""
        if isinstance(self.credential, StaticToken):
            return basic_auth_env(clone_url, "x-access-token", self.credential.value)
        identity = self.identity
        return LiveGitEnv(lambda: {**(identity() if identity is not None else {}),
                                   **basic_auth_env(clone_url, "x-access-token", self.credential.token())})

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()


def review_comment(data: dict[str, Any]) -> ReviewComment:
    """A review comment of GitHub's REST API or of a ``pull_request_review_comment`` webhook."""
    line = data.get("line") or data.get("original_line")
    return ReviewComment(int(data["id"]), str((data.get("user") or {}).get("login", "")), str(data.get("body") or ""),
                         str(data.get("path") or ""), line if isinstance(line, int) else None,
                         str(data.get("diff_hunk") or ""))
