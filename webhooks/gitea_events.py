"""What a verified Gitea or Forgejo event asks for (SPEC §8), as :mod:`webhooks.events` says it for GitHub and GitLab.

Gitea names the event in ``X-Gitea-Event`` (Forgejo also in ``X-Forgejo-Event``): ``issues`` and ``pull_request``
with the action ``label_updated`` or ``label_cleared`` for label changes, ``issue_comment`` for comments on both,
``pull_request_approved`` / ``_rejected`` / ``_comment`` with the action ``reviewed`` for a submitted review.
A label event carries the item's labels after the change, not which label changed; so the trigger label present
starts a task, and the processing label absent (with no final label either) cancels the item's running task.
Comment payloads carry no author role: the worker asks the forge (``user_id`` in the trigger says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhooks.events import Action, Cancel, Ignore, Trigger, label_profile
from webhooks.events import _comment_action as comment_action  # the comment rules every forge shares
from webhooks.events import _key as task_key
from webhooks.events import _review_action as review_action
from webhooks.payload import get, number, text
from webhooks.pull_events import github_pull_ended
from webhooks.signatures import verify_gitea
from worker.settings_models import GiteaSettings

LABEL_ACTIONS = ("label_updated", "label_cleared")
# A submitted review: X-Gitea-Event of its kind (a review comment is ``pull_request_comment``), action "reviewed".
REVIEW_EVENTS = ("pull_request_approved", "pull_request_rejected", "pull_request_comment")


def verify_delivery(secret: str | None, headers: Mapping[str, str], body: bytes) -> bool:
    """``X-Gitea-Signature`` or Forgejo's ``X-Forgejo-Signature``: the hex HMAC-SHA256 of the raw body."""
    return verify_gitea(secret, body, headers.get("x-gitea-signature"), headers.get("x-forgejo-signature"))


def event_name(headers: Mapping[str, str]) -> str:
    """The event a delivery names (Forgejo sends both headers, older Forgejo only its own)."""
    return headers.get("x-gitea-event") or headers.get("x-forgejo-event") or ""


def delivery_id(headers: Mapping[str, str]) -> str:
    """The delivery's UUID (the same on a redelivery), empty when the sender sent none."""
    return headers.get("x-gitea-delivery") or headers.get("x-forgejo-delivery") or ""


def gitea_action(event: str, payload: dict[str, Any], cfg: GiteaSettings) -> Action:
    """The action of a Gitea event (``X-Gitea-Event``) and its payload; a pull request's ending is an outcome,
    whoever brought it about (classified before the "sent by the bot" rule, as on the other forges)."""
    return github_pull_ended(event, payload, source="gitea") or _sent_action(event, payload, cfg)


def _sent_action(event: str, payload: dict[str, Any], cfg: GiteaSettings) -> Action:
    sender = text(get(payload, "sender", "login"))
    if sender.lower() == cfg.bot_login.lower():
        return Ignore("sent by the bot")
    owner = text(get(payload, "repository", "owner", "login")) or text(get(payload, "repository", "owner", "username"))
    repo = text(get(payload, "repository", "name"))
    if not owner or not repo or not sender:
        return Ignore(f"{event or 'event'} without repository or sender")
    action = text(get(payload, "action"))
    if event in ("issues", "pull_request") and action in LABEL_ACTIONS:
        return _labels(event, payload, cfg, owner, repo, sender)
    if event == "issue_comment" and action == "created":
        return _comment(payload, cfg, owner, repo, sender)
    if event in REVIEW_EVENTS and action == "reviewed":
        return _review(event, payload, owner, repo, sender)
    return Ignore(f"event {event}.{action}" if action else f"event {event}")


def _labels(event: str, payload: dict[str, Any], cfg: GiteaSettings, owner: str, repo: str, sender: str) -> Action:
    item = get(payload, "issue" if event == "issues" else "pull_request")
    found = number(get(item, "number"))
    if found is None:
        return Ignore(f"{event} without a number")
    key = task_key("gitea", owner, repo, "issue" if event == "issues" else "pull_request", found)
    labels = _names(get(item, "labels"))
    profiles = sorted(filter(None, (label_profile(label, cfg.labels.trigger) for label in labels)))
    if cfg.labels.trigger in labels or profiles:
        return Trigger(key, sender, _issue(item), trigger={"kind": "label", "user": sender},
                       profile=profiles[0] if profiles else None)
    if not labels & {cfg.labels.processing, cfg.labels.done, cfg.labels.failed}:
        # Not necessarily a removal of the processing label (the payload cannot say): a cancel with no task
        # running on this item is answered "ignored"; a finished item keeps its final label and is never cancelled.
        return Cancel(key, sender)
    return Ignore(f"labels changed without the trigger label ({event})")


def _comment(payload: dict[str, Any], cfg: GiteaSettings, owner: str, repo: str, sender: str) -> Action:
    issue = get(payload, "issue")
    found = number(get(issue, "number"))
    if found is None:
        return Ignore("comment without an issue number")
    is_pull = get(payload, "is_pull") is True or isinstance(get(issue, "pull_request"), dict)
    key = task_key("gitea", owner, repo, "pull_request" if is_pull else "issue", found)
    # user_id (never None, so the worker always checks): the payload names the author, not the author's role
    trigger = {"kind": "comment", "user": sender, "user_id": number(get(payload, "sender", "id")) or 0}
    pull = (text(get(issue, "body")), text(get(payload, "pull_request", "head", "ref"))) if is_pull else ("", "")
    return comment_action(text(get(payload, "comment", "body")), sender, key, _issue(issue), cfg.mention, trigger,
                          pull)


def _review(event: str, payload: dict[str, Any], owner: str, repo: str, sender: str) -> Action:
    """A review continues a pull request a task opened with its text (its line comments are not in the payload,
    nor is the id they could be fetched by)."""
    item = get(payload, "pull_request")
    found = number(get(item, "number"))
    if found is None:
        return Ignore("review without a pull request number")
    body = text(get(payload, "review", "content"))
    if event == "pull_request_approved" and not body.strip():
        return Ignore("approved without comments")
    key = task_key("gitea", owner, repo, "pull_request", found)
    trigger = {"kind": "review", "user": sender, "user_id": number(get(payload, "sender", "id")) or 0}
    pull = (text(get(item, "body")), text(get(item, "head", "ref")))
    return review_action(body, sender, key, _issue(item), trigger, pull, {})


def _names(labels: Any) -> set[str]:
    if not isinstance(labels, list):
        return set()
    return {label["name"] for label in labels if isinstance(label, dict) and isinstance(label.get("name"), str)}


def _issue(item: Any) -> dict[str, Any]:
    return {
        "number": get(item, "number"),
        "title": text(get(item, "title")),
        "body": text(get(item, "body")),
        "url": text(get(item, "html_url")),
    }
