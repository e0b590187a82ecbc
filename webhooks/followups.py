"""Follow-ups at the intake (SPEC §14): new work on a pull/merge request a task opened continues its thread.

A trigger on such a request becomes a follow-up request on the thread's task key (one active task per
thread) and its branch; text for a task that is already running goes to that task's inbox instead; failed
CI runs start fix tasks up to ``followups.max_ci_fixes`` in a row; ``/tasuki`` commands other than cancel.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable
from typing import Any

import redis
import structlog

from webhooks.ci_events import CIFailure
from webhooks.events import COMMAND_FORMS, Command, Note, Trigger
from worker.forges import forge_section
from worker.inbox import deliver
from worker.names import (
    ACTIVE_PREFIX,
    AUTOFIX,
    AUTOFIX_OFF_PREFIX,
    CI_FIXES_PREFIX,
    CI_SEEN_PREFIX,
    FORGE_REPLY,
    LAST_TASK_PREFIX,
    MAINTENANCE_QUEUE,
)
from worker.profiles import PROFILE_KEY
from worker.settings_models import Settings
from worker.submit import Enqueued, task_key_id
from worker.threads import (
    THREAD_TTL_S,
    Thread,
    find_branch_thread,
    find_issue_thread,
    find_thread,
    followup_of,
    key_id,
)

log = structlog.get_logger(__name__)

PULL_KINDS = ("pull_request", "merge_request")
Submit = Callable[[dict[str, Any]], Enqueued]
Outcome = tuple[int, dict[str, Any], str]  # HTTP status, body, metrics outcome


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def may_continue_thread(task_key: dict[str, str]) -> bool:
    """Whether a trigger on this task key may continue a task's thread (a pull/merge request, not an issue)."""
    return task_key.get("task_type") in PULL_KINDS


def new_task_request(action: Trigger) -> dict[str, Any]:
    """The request of a trigger that starts new work (the request of a trigger on an issue); the model profile it
    chose, if any, in ``config.profile`` (worker/profiles.py)."""
    request = {"task_key": action.task_key, "issue": action.issue, "user": action.user, "prompt": action.prompt,
               "trigger": action.trigger}
    return {**request, "config": {PROFILE_KEY: action.profile}} if action.profile else request


class Followups:
    """The intake's follow-up rules over the broker's Redis."""

    def __init__(self, settings: Settings, client: redis.Redis, celery_app: Any) -> None:
        self.settings = settings
        self.client = client
        self.celery_app = celery_app

    def thread_of(self, task_key: dict[str, str], body: str = "", head: str = "") -> Thread | None:
        """The thread of a pull/merge request a task opened; None for anything else."""
        if not may_continue_thread(task_key):
            return None
        return find_thread(self.client, task_key, body, head)

    def request(self, action: Trigger) -> dict[str, Any] | None:
        """The task request of a trigger; None when it is a review on a request no task opened."""
        request = new_task_request(action)
        thread = self.thread_of(action.task_key, action.body, action.head)
        if thread is None:
            return None if action.trigger.get("kind") == "review" else request
        self.client.delete(CI_FIXES_PREFIX + key_id(thread.pull_key))  # a person spoke: CI fixes count anew
        kind = "review" if action.trigger.get("kind") == "review" else "comment"
        return {**request, "task_key": thread.task_key, "followup": followup_of(thread, kind, action.details)}

    def active(self, task_key: dict[str, str]) -> str | None:
        """The UUID of the queued or running task of a task key."""
        return _text(self.client.get(ACTIVE_PREFIX + task_key_id(task_key)))

    def to_inbox(self, task_key: dict[str, str], uuid: str, entry: dict[str, Any]) -> bool:
        """Hand text to the running task of ``task_key``: it reads it at its next step boundary. False when the
        task has let its task key go meanwhile (it will not read its inbox again)."""
        if not deliver(self.client, task_key, uuid, entry):
            log.info("task ended before the comment could be delivered", uuid=uuid)
            return False
        log.info("comment delivered to the running task", uuid=uuid, author=entry.get("author"))
        return True

    def note(self, action: Note) -> Outcome:
        """A comment without the mention: for the running task of its thread, else nothing."""
        thread = self.thread_of(action.task_key, action.body, action.head)
        task_key = thread.task_key if thread else action.task_key
        uuid = self.active(task_key)
        if uuid is None or not self.to_inbox(task_key, uuid, inbox_entry(action.user, action.text, action.trigger)):
            return 200, {"status": "ignored", "reason": "comment without the mention"}, "ignored"
        return 200, {"status": "delivered", "task_id": uuid}, "delivered"

    def ci_failure(self, action: CIFailure, submit: Submit) -> Outcome:
        """A fix task for a failed run on a Tasuki branch, unless autofix is off or the limit is reached."""
        thread = find_branch_thread(self.client, action.source, action.owner, action.repo, action.branch)
        if thread is None:
            return 200, {"status": "ignored", "reason": "not a branch of a Tasuki pull/merge request"}, "ignored"
        pull = key_id(thread.pull_key)
        if self.client.exists(AUTOFIX_OFF_PREFIX + pull):
            return 200, {"status": "ignored", "reason": "autofix is off"}, "ignored"
        fixes = int(_text(self.client.get(CI_FIXES_PREFIX + pull)) or 0)
        limit = self.settings.followups.max_ci_fixes
        if fixes >= limit:
            return 200, {"status": "ignored", "reason": f"{limit} CI fixes in a row; `/tasuki autofix on` resets"}, \
                "ignored"
        seen = f"{CI_SEEN_PREFIX}{pull}:{action.ci.get('sha') or ''}"
        if action.ci.get("sha") and not self.client.set(seen, "1", nx=True, ex=THREAD_TTL_S):
            # check_suite and workflow_run both report one failed commit: one fix task for it
            return 200, {"status": "ignored", "reason": "this commit's failure already has a fix task"}, "ignored"
        request = {"task_key": thread.task_key, "issue": {"number": thread.pull, "title": "", "body": ""},
                   "user": forge_section(action.source, self.settings).bot_login,
                   "prompt": "The CI run on this branch failed. Make it pass.",
                   "trigger": {"kind": "ci"}, "followup": followup_of(thread, "ci", {"ci": action.ci})}
        enqueued = submit(request)
        if enqueued.already_active:
            return 200, {"status": "active", "task_id": enqueued.uuid}, "active"
        self.client.set(CI_FIXES_PREFIX + pull, fixes + 1, ex=THREAD_TTL_S)
        log.info("CI-fix task enqueued", uuid=enqueued.uuid, pull=pull, fixes=fixes + 1)
        return 202, {"task_id": enqueued.uuid}, "enqueued"

    def command(self, action: Command, submit: Submit) -> Outcome:
        """``/tasuki retry``, ``/tasuki autofix on|off``; an unknown command gets a reply listing the known."""
        thread = self.thread_of(action.task_key, action.body, action.head)
        if action.name in ("autofix on", "autofix off"):
            if thread is None:
                return 200, {"status": "ignored", "reason": "autofix applies to a Tasuki pull/merge request"}, \
                    "ignored"
            pull = key_id(thread.pull_key)
            if "user_id" in action.trigger:
                # The payload said nothing of the author's role (GitLab, Gitea): a worker checks the access first.
                self.celery_app.send_task(AUTOFIX, args=[thread.pull_key, action.name == "autofix on",
                                                         action.trigger], queue=MAINTENANCE_QUEUE)
                return 202, {"status": action.name.replace(" ", "_"), "pending": "access check"}, "command"
            if action.name == "autofix off":
                self.client.set(AUTOFIX_OFF_PREFIX + pull, "1", ex=THREAD_TTL_S)
            else:
                self.client.delete(AUTOFIX_OFF_PREFIX + pull, CI_FIXES_PREFIX + pull)
            return 200, {"status": action.name.replace(" ", "_")}, "command"
        if action.name == "retry":
            return self._retry(action, thread, submit)
        known = ", ".join(f"`/tasuki {name}`" for name in COMMAND_FORMS)
        self.reply(action.task_key, f"Unknown command `/tasuki {action.name}`. Known commands: {known}.")
        return 200, {"status": "ignored", "reason": "unknown command"}, "ignored"

    def _retry(self, action: Command, thread: Thread | None, submit: Submit) -> Outcome:
        thread = thread or find_issue_thread(self.client, action.task_key)  # continue its request's branch
        task_key = thread.task_key if thread else action.task_key
        previous = thread.last_uuid if thread else _text(self.client.get(LAST_TASK_PREFIX + task_key_id(task_key)))
        followup = followup_of(thread, "retry") if thread else {"kind": "retry", "previous": previous}
        request = {"task_key": task_key, "issue": {"number": int(task_key["task_id"]), "title": "", "body": ""},
                   "user": action.user, "prompt": "Retry the task; the previous attempt is summarized above.",
                   "trigger": {"kind": "comment", "user": action.user, **action.trigger}, "followup": followup}
        enqueued = submit(request)
        if enqueued.already_active:
            return 200, {"status": "active", "task_id": enqueued.uuid}, "active"
        return 202, {"task_id": enqueued.uuid}, "enqueued"

    def reply(self, task_key: dict[str, str], body: str) -> None:
        """A short comment on the issue or pull/merge request, posted by a worker (the intake never waits
        on the forge)."""
        self.celery_app.send_task(FORGE_REPLY, args=[task_key, body], queue=MAINTENANCE_QUEUE)


def inbox_entry(author: str, text: str, trigger: dict[str, Any], comments: list[Any] | None = None
                ) -> dict[str, Any]:
    """One inbox record: who wrote what (and the review comments it carries)."""
    # The id lets a resumed task tell a comment it already holds from one it has not heard (worker/inbox.py).
    entry: dict[str, Any] = {"id": uuid_module.uuid4().hex, "author": author, "body": text, "comments": comments or []}
    if trigger.get("user_id") is not None:
        entry["user_id"] = trigger["user_id"]  # GitLab, Gitea: the worker checks the author's access
    return entry
