"""What a verified webhook event asks for (SPEC §8): start a task, cancel one, or nothing.

Pure functions of the event name, the parsed payload and the forge's settings; a payload of an
unexpected shape is simply not a trigger (webhook senders add fields and events all the time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from webhooks.ci_events import CIFailure, github_ci, gitlab_ci
from webhooks.membership_events import MembershipChanged, github_membership, gitlab_membership
from webhooks.payload import get as _get
from webhooks.payload import number as _number
from webhooks.payload import text as _text
from webhooks.pull_events import PullEnded, github_pull_ended, gitlab_pull_ended
from worker.settings_models import GitHubSettings, GitLabSettings

COMMAND_PREFIX = "/tasuki"
CANCEL_COMMAND = "/tasuki cancel"
COMMANDS = ("cancel", "retry", "autofix on", "autofix off")
MODEL_COMMAND = "model"
"""``/tasuki model NAME``: start the task (or the follow-up) with the model profile NAME, the comment's other lines
as what to do, as the trigger label ``coding agent:NAME`` does."""
COMMAND_FORMS = (*COMMANDS, f"{MODEL_COMMAND} NAME")
"""Every command as a person writes it (the answer to an unknown one lists them)."""
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Trigger:
    """Start a task for ``task_key`` (unless one is active)."""

    task_key: dict[str, str]
    user: str
    issue: dict[str, Any]
    prompt: str = ""
    trigger: dict[str, Any] = field(default_factory=dict)  # kind: label | comment | review
    body: str = ""  # a pull/merge request's body (it carries the thread marker of one a task opened)
    head: str = ""  # a pull/merge request's head branch, when the payload names it
    details: dict[str, Any] = field(default_factory=dict)  # review_id, comments (path, line, diff hunk)
    profile: str | None = None  # the model profile a label ``coding agent:NAME`` or ``/tasuki model NAME`` chose


@dataclass(frozen=True)
class Note:
    """A comment from an allowed author without the mention: for the task running on the thread, if any."""

    task_key: dict[str, str]
    user: str
    text: str
    body: str = ""
    head: str = ""
    trigger: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Command:
    """A ``/tasuki`` command other than cancel: ``retry``, ``autofix on|off``, or an unknown one (``name`` is
    what was written)."""

    task_key: dict[str, str]
    user: str
    name: str
    body: str = ""
    head: str = ""
    trigger: dict[str, Any] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        """Whether Tasuki knows the command."""
        return self.name in COMMANDS


@dataclass(frozen=True)
class Cancel:
    """Cancel the active task of ``task_key``."""

    task_key: dict[str, str]
    user: str


@dataclass(frozen=True)
class Ignore:
    """Nothing to do; ``reason`` is logged and counted."""

    reason: str


Action = Trigger | Cancel | Note | Command | CIFailure | PullEnded | MembershipChanged | Ignore


def live_lines(body: str) -> list[str]:
    """The lines of a comment that the author wrote now: not quoted (``>``), not inside a code fence."""
    lines, fenced = [], False
    for line in body.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and not line.lstrip().startswith(">"):
            lines.append(line)
    return lines


def mentions(body: str, mention: str) -> bool:
    """True when ``mention`` (``@tasuki``) stands as a word in a live line of ``body``."""
    pattern = re.compile(rf"(?<![\w@]){re.escape(mention)}(?![\w-])", re.IGNORECASE)
    return any(pattern.search(line) for line in live_lines(body))


def asks_to_cancel(body: str) -> bool:
    """True when a live line of ``body`` is the ``/tasuki cancel`` command."""
    return command(body) == "cancel"


def command(body: str) -> str | None:
    """The ``/tasuki`` command of the first live line that is one (``retry``, ``autofix off``, …), or None."""
    for line in live_lines(body):
        words = line.strip().lower().split()
        if words and words[0] == COMMAND_PREFIX:
            return " ".join(words[1:])[:60]
    return None


def model_command(body: str) -> tuple[str | None, str]:
    """The profile of a ``/tasuki model NAME`` command (None: the command names none) and the comment's other live
    lines; the name keeps its case (profile names are the operator's)."""
    lines = live_lines(body)
    for number, line in enumerate(lines):
        words = line.strip().split()
        if len(words) >= 2 and words[0].lower() == COMMAND_PREFIX and words[1].lower() == MODEL_COMMAND:
            rest = lines[:number] + lines[number + 1:]
            return (words[2] if len(words) > 2 else None), "\n".join(rest).strip()
    return None, "\n".join(lines).strip()


def label_profile(label: str, trigger_label: str) -> str | None:
    """The profile a trigger label names: ``NAME`` of ``coding agent:NAME``; None for any other label."""
    head, colon, name = label.partition(":")
    return name.strip() or None if colon and head == trigger_label else None


def _key(source: str, owner: str, repo: str, task_type: str, number: int) -> dict[str, str]:
    return {"task_source": source, "owner": owner, "repo": repo, "task_type": task_type, "task_id": str(number)}


def _commanded(
    body: str, user: str, key: dict[str, str], issue: dict[str, Any], pull: tuple[str, str],
    trigger: dict[str, Any],
) -> Action | None:
    """The ``/tasuki`` command of a comment, if it holds one; ``/tasuki model NAME`` starts work as a mention does."""
    said = command(body)
    if said == "cancel":
        return Cancel(key, user)
    if said is not None and said.split()[:1] == [MODEL_COMMAND] and len(said.split()) > 1:
        profile, text = model_command(body)
        return Trigger(key, user, issue, text, {**trigger, "kind": "comment"}, *pull, profile=profile)
    return Command(key, user, said, *pull, trigger={**trigger, "kind": "comment"}) if said is not None else None


def _comment_action(
    body: str, user: str, key: dict[str, str], issue: dict[str, Any], mention: str, trigger: dict[str, Any],
    pull: tuple[str, str] = ("", ""),
) -> Action:
    """``pull``: the body and head branch of the pull/merge request commented on."""
    commanded = _commanded(body, user, key, issue, pull, trigger)
    if commanded is not None:
        return commanded
    text = "\n".join(live_lines(body)).strip()
    if mentions(body, mention):
        return Trigger(key, user, issue, text, trigger, *pull)
    if not text:
        return Ignore("comment without live text")
    return Note(key, user, text, *pull, trigger=trigger)


def _review_action(
    body: str, user: str, key: dict[str, str], issue: dict[str, Any], trigger: dict[str, Any],
    pull: tuple[str, str], details: dict[str, Any],
) -> Action:
    """A review or review comment: commands as in any comment, else a follow-up (when a task opened it)."""
    commanded = _commanded(body, user, key, issue, pull, trigger)
    if commanded is not None:
        return commanded
    return Trigger(key, user, issue, "\n".join(live_lines(body)).strip(), {**trigger, "kind": "review"}, *pull,
                   details=details)


def _forge_fact(ci: CIFailure | str | None, ended: PullEnded | None) -> Action | None:
    """What the forge reports whoever sent it, classified before the "sent by the bot" rule: a CI run's failure (a
    reason string: a run that did not fail) or a pull/merge request's ending."""
    if ci is not None:
        return ci if isinstance(ci, CIFailure) else Ignore(ci)
    return ended


# -- GitHub --------------------------------------------------------------------------------------


def github_action(event: str, payload: dict[str, Any], cfg: GitHubSettings) -> Action:
    """The action of a GitHub event (``X-GitHub-Event``) and its payload."""
    fact = _forge_fact(github_ci(event, payload), github_pull_ended(event, payload)) or github_membership(event,
                                                                                                         payload)
    if fact is not None:
        return fact
    sender = _text(_get(payload, "sender", "login"))
    if sender.lower() == cfg.bot_login.lower() or _by_the_app(payload, cfg):
        return Ignore("sent by the bot")
    action = _github_event_action(event, payload, cfg, sender)
    installation = _number(_get(payload, "installation", "id"))
    if installation is not None and isinstance(action, Trigger | Note | Command):
        # A GitHub App's webhook names its installation: the task's tokens are that installation's.
        return replace(action, trigger={**action.trigger, "installation": installation})
    return action


def _by_the_app(payload: dict[str, Any], cfg: GitHubSettings) -> bool:
    """Whether the App itself wrote the comment or review the event reports (GitHub names the App on it)."""
    if cfg.app_id is None:
        return False
    return any(_number(_get(payload, part, "performed_via_github_app", "id")) == cfg.app_id
               for part in ("comment", "review"))


def _github_event_action(event: str, payload: dict[str, Any], cfg: GitHubSettings, sender: str) -> Action:
    owner = _text(_get(payload, "repository", "owner", "login"))
    repo = _text(_get(payload, "repository", "name"))
    if not owner or not repo or not sender:
        return Ignore(f"{event or 'event'} without repository or sender")
    action = _text(_get(payload, "action"))  # untrusted: a list or an object here must not reach a dict lookup
    if event in ("issues", "pull_request"):
        return _github_label(event, action, payload, cfg, owner, repo, sender)
    handler = _GITHUB_COMMENTS.get((event, action))
    if handler is not None:
        return handler(event, payload, cfg, owner, repo, sender)
    return Ignore(f"event {event}.{action}" if action else f"event {event}")


def _github_comment(
    event: str, payload: dict[str, Any], cfg: GitHubSettings, owner: str, repo: str, sender: str
) -> Action:
    item = _get(payload, "issue") if event == "issue_comment" else _get(payload, "pull_request")
    number = _number(_get(item, "number"))
    if number is None:
        return Ignore("comment without an issue number")
    if _get(payload, "comment", "author_association") not in cfg.allowed_associations:
        return Ignore("comment author not allowed")
    is_pull = event == "pull_request_review_comment" or isinstance(_get(item, "pull_request"), dict)
    key = _key("github", owner, repo, "pull_request" if is_pull else "issue", number)
    body = _text(_get(payload, "comment", "body"))
    trigger = {"kind": "comment", "user": sender}
    pull = (_text(_get(item, "body")), _text(_get(item, "head", "ref"))) if is_pull else ("", "")
    if event == "pull_request_review_comment":
        details = {"comments": [_github_review_comment(_get(payload, "comment"))]}
        return _review_action(body, sender, key, _github_issue(item), trigger, pull, details)
    return _comment_action(body, sender, key, _github_issue(item), cfg.mention, trigger, pull)


def _github_review(
    event: str, payload: dict[str, Any], cfg: GitHubSettings, owner: str, repo: str, sender: str
) -> Action:
    item = _get(payload, "pull_request")
    number, review_id = _number(_get(item, "number")), _number(_get(payload, "review", "id"))
    if number is None or review_id is None:
        return Ignore("review without a pull request number or review id")
    if _get(payload, "review", "author_association") not in cfg.allowed_associations:
        return Ignore("review author not allowed")
    body = _text(_get(payload, "review", "body"))
    if _get(payload, "review", "state") == "approved" and not body.strip():
        return Ignore("approved without comments")
    key = _key("github", owner, repo, "pull_request", number)
    pull = (_text(_get(item, "body")), _text(_get(item, "head", "ref")))
    return _review_action(body, sender, key, _github_issue(item), {"kind": "review", "user": sender}, pull,
                          {"review_id": review_id})


_GITHUB_COMMENTS = {
    ("issue_comment", "created"): _github_comment,
    ("pull_request_review_comment", "created"): _github_comment,
    ("pull_request_review", "submitted"): _github_review,
}


def _github_review_comment(comment: Any) -> dict[str, Any]:
    """A review comment as a follow-up reads it: where (path, line, diff hunk), who, what, which thread."""
    line = _number(_get(comment, "line")) or _number(_get(comment, "original_line"))
    reply_to = _number(_get(comment, "in_reply_to_id"))
    return {"id": _number(_get(comment, "id")) or 0, "author": _text(_get(comment, "user", "login")),
            "body": _text(_get(comment, "body")), "path": _text(_get(comment, "path")), "line": line,
            "diff_hunk": _text(_get(comment, "diff_hunk")), "thread": str(reply_to) if reply_to else ""}


def _github_label(
    event: str, action: Any, payload: dict[str, Any], cfg: GitHubSettings, owner: str, repo: str, sender: str
) -> Action:
    item = _get(payload, "issue" if event == "issues" else "pull_request")
    number = _number(_get(item, "number"))
    label = _get(payload, "label", "name")
    if number is None or action not in ("labeled", "unlabeled"):
        return Ignore(f"event {event}.{action}")
    key = _key("github", owner, repo, "issue" if event == "issues" else "pull_request", number)
    if action == "labeled" and isinstance(label, str) and (label == cfg.labels.trigger or
                                                           label_profile(label, cfg.labels.trigger)):
        return Trigger(key, sender, _github_issue(item), trigger={"kind": "label", "user": sender},
                       profile=label_profile(label, cfg.labels.trigger))
    if action == "unlabeled" and label == cfg.labels.processing:
        return Cancel(key, sender)
    return Ignore(f"label {label!r} {action}")


def _github_issue(item: Any) -> dict[str, Any]:
    return {
        "number": _get(item, "number"),
        "title": _text(_get(item, "title")),
        "body": _text(_get(item, "body")),
        "url": _text(_get(item, "html_url")),
        "labels": sorted(_text(_get(label, "name")) for label in _get(item, "labels") or [] if isinstance(label, dict)),
    }


# -- GitLab --------------------------------------------------------------------------------------


def _label_titles(labels: Any) -> set[str]:
    if not isinstance(labels, list):
        return set()
    return {label["title"] for label in labels if isinstance(label, dict) and isinstance(label.get("title"), str)}


def gitlab_action(payload: dict[str, Any], cfg: GitLabSettings) -> Action:
    """The action of a GitLab event payload (``object_kind`` says which; the header only names it)."""
    fact = _forge_fact(gitlab_ci(payload), gitlab_pull_ended(payload)) or gitlab_membership(payload)
    if fact is not None:
        return fact
    user = _text(_get(payload, "user", "username"))
    if user.lower() == cfg.bot_login.lower():
        return Ignore("sent by the bot")
    path = _text(_get(payload, "project", "path_with_namespace"))
    kind = _get(payload, "object_kind")
    if "/" not in path or not user:
        return Ignore(f"{kind or 'event'} without project or user")
    owner, repo = path.rsplit("/", 1)
    trigger = {"kind": "label", "user": user, "user_id": _get(payload, "user", "id")}
    if kind in ("issue", "merge_request"):
        return _gitlab_labels(kind, payload, cfg, owner, repo, user, trigger)
    if kind == "note":
        return _gitlab_note(payload, cfg, owner, repo, user, {**trigger, "kind": "comment"})
    return Ignore(f"event {kind}")


def _gitlab_labels(
    kind: str, payload: dict[str, Any], cfg: GitLabSettings, owner: str, repo: str, user: str, trigger: dict[str, Any]
) -> Action:
    attributes = _get(payload, "object_attributes")
    number = _number(_get(attributes, "iid"))
    if number is None:
        return Ignore(f"{kind} without an iid")
    key = _key("gitlab", owner, repo, kind, number)
    before = _label_titles(_get(payload, "changes", "labels", "previous"))
    after = _label_titles(_get(payload, "changes", "labels", "current"))
    added = after - before
    profiles = sorted(filter(None, (label_profile(label, cfg.labels.trigger) for label in added)))
    if cfg.labels.trigger in added or profiles:
        return Trigger(key, user, _gitlab_issue(attributes), trigger=trigger, profile=profiles[0] if profiles else None)
    if cfg.labels.processing in before - after:
        return Cancel(key, user)
    return Ignore(f"{kind} without a trigger label change")


def _gitlab_note(
    payload: dict[str, Any], cfg: GitLabSettings, owner: str, repo: str, user: str, trigger: dict[str, Any]
) -> Action:
    note = _get(payload, "object_attributes")
    if _get(note, "system") is True or _get(note, "action") not in (None, "create"):
        return Ignore("system or edited note")
    noteable = _text(_get(note, "noteable_type"))  # a string, or nothing: it is used as a dict key
    kinds = {"Issue": ("issue", "issue"), "MergeRequest": ("merge_request", "merge_request")}
    if noteable not in kinds:
        return Ignore(f"note on {noteable}")
    task_type, section = kinds[noteable]
    item = _get(payload, section)
    number = _number(_get(item, "iid"))
    if number is None:
        return Ignore("note without an iid")
    key = _key("gitlab", owner, repo, task_type, number)
    body = _text(_get(note, "note"))
    if task_type == "issue":
        return _comment_action(body, user, key, _gitlab_issue(item), cfg.mention, trigger)
    pull = (_text(_get(item, "description")), _text(_get(item, "source_branch")))
    if isinstance(_get(note, "position"), dict) or _get(note, "type") == "DiffNote":
        details = {"comments": [_gitlab_diff_note(note, user)]}
        return _review_action(body, user, key, _gitlab_issue(item), trigger, pull, details)
    return _comment_action(body, user, key, _gitlab_issue(item), cfg.mention, trigger, pull)


def _gitlab_diff_note(note: Any, user: str) -> dict[str, Any]:
    """A diff note as a follow-up reads it: its position (path, line), the diff if the hook has it, its discussion."""
    position = _get(note, "position")
    line = _number(_get(position, "new_line")) or _number(_get(position, "old_line"))
    return {"id": _number(_get(note, "id")) or 0, "author": user, "body": _text(_get(note, "note")),
            "path": _text(_get(position, "new_path")) or _text(_get(position, "old_path")), "line": line,
            "diff_hunk": _text(_get(note, "st_diff", "diff")), "thread": _text(_get(note, "discussion_id"))}


def _gitlab_issue(item: Any) -> dict[str, Any]:
    return {
        "number": _get(item, "iid"),
        "title": _text(_get(item, "title")),
        "body": _text(_get(item, "description")),
        "url": _text(_get(item, "url")),
    }

