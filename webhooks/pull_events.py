"""A pull/merge request's ending (issue 28): GitHub ``pull_request`` ``closed`` (``pull_request.merged`` says
whether it was merged) or ``reopened``; GitLab's Merge Request Hook with ``object_attributes.action`` ``merge``,
``close`` or ``reopen``. Whether a task opened the request the intake decides (the outcome store knows).

Classified before the "sent by the bot" rule: an outcome is a fact whoever brought it about (with a token the
"bot" is often a person's account, who may merge the request themselves).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contexts.clock import parse_iso, utc_now
from webhooks.payload import get, number, text

GITLAB_ACTIONS = {"merge": "merged", "close": "closed", "reopen": "reopened"}


@dataclass(frozen=True)
class PullEnded:
    """A pull/merge request was merged, closed unmerged or reopened (``outcome``)."""

    pull_key: dict[str, str]
    outcome: str  # merged | closed | reopened
    at: datetime
    user: str
    body: str = ""  # carries the thread marker of a request a task opened
    head: str = ""
    review_comments: int | None = None  # the forge's count, when the payload has one (GitHub)


def _when(value: Any) -> datetime:
    try:
        return parse_iso(value) if isinstance(value, str) and value else utc_now()
    except ValueError:
        return utc_now()


def _key(source: str, owner: str, repo: str, kind: str, pull: int) -> dict[str, str]:
    return {"task_source": source, "owner": owner, "repo": repo, "task_type": kind, "task_id": str(pull)}


def github_pull_ended(event: str, payload: dict[str, Any], source: str = "github") -> PullEnded | None:
    """``pull_request`` closed or reopened; None for anything else. Gitea and Forgejo send the same event in the same
    shape (``source="gitea"``; older ones name the head branch ``head_branch`` and the owner ``username``)."""
    action = get(payload, "action")
    if event != "pull_request" or action not in ("closed", "reopened"):
        return None
    item = get(payload, "pull_request")
    owner = text(get(payload, "repository", "owner", "login")) or text(get(payload, "repository", "owner", "username"))
    repo = text(get(payload, "repository", "name"))
    pull = number(get(item, "number"))
    if pull is None or not owner or not repo:
        return None
    merged = get(item, "merged") is True
    outcome = "reopened" if action == "reopened" else ("merged" if merged else "closed")
    at = _when(get(item, "merged_at") if merged else get(item, "closed_at"))
    comments = get(item, "review_comments")
    head = text(get(item, "head", "ref")) or text(get(item, "head_branch"))
    return PullEnded(_key(source, owner, repo, "pull_request", pull), outcome, at,
                     text(get(payload, "sender", "login")), text(get(item, "body")), head,
                     comments if isinstance(comments, int) and not isinstance(comments, bool) else None)


def gitlab_pull_ended(payload: dict[str, Any]) -> PullEnded | None:
    """A Merge Request Hook whose action is merge, close or reopen; None for anything else."""
    attributes = get(payload, "object_attributes")
    outcome = GITLAB_ACTIONS.get(text(get(attributes, "action")))
    if get(payload, "object_kind") != "merge_request" or outcome is None:
        return None
    path, pull = text(get(payload, "project", "path_with_namespace")), number(get(attributes, "iid"))
    if "/" not in path or pull is None:
        return None
    owner, repo = path.rsplit("/", 1)
    at = _when(get(attributes, "merged_at") if outcome == "merged" else get(attributes, "closed_at")) \
        if outcome != "reopened" else utc_now()
    if outcome != "reopened" and not (get(attributes, "merged_at") or get(attributes, "closed_at")):
        at = _when(get(attributes, "updated_at"))  # older hooks name no merge or close time: the update is it
    return PullEnded(_key("gitlab", owner, repo, "merge_request", pull), outcome, at,
                     text(get(payload, "user", "username")), text(get(attributes, "description")),
                     text(get(attributes, "source_branch")))
