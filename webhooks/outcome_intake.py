"""Outcomes at the intake (issue 28): a pull/merge request a task opened is merged, closed or reopened; reviews on
it are counted, and the newest kept for the repository memory should it be closed unmerged.

A request closed while a follow-up task runs on it cancels that task by the cancel path ``/tasuki cancel`` takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import structlog

from contexts import ContextCompletedError, ContextNotFoundError, ContextStore, TasukiError
from contexts.atomic import read_json
from contexts.masking import mask
from contexts.names import METADATA_FILE
from contexts.outcomes import REVIEW_CHARS, OutcomeStore
from webhooks.events import Trigger
from webhooks.followups import Followups
from webhooks.pull_events import PullEnded
from worker.names import ACTIVE_PREFIX, MAINTENANCE_QUEUE, REMEMBER_REJECTION, STATS_KEY
from worker.settings_models import Settings
from worker.stores import open_outcomes
from worker.submit import task_key_id
from worker.threads import key_id

log = structlog.get_logger(__name__)

Outcome = tuple[int, dict[str, Any], str]  # HTTP status, body, metrics outcome


def review_entries(action: Trigger) -> list[dict[str, Any]]:
    """A review trigger's remarks as the outcome keeps them: who, what, where; masked and cut."""
    comments = action.details.get("comments") or []
    if not comments and action.prompt:
        comments = [{"author": action.user, "body": action.prompt}]
    return [{"author": mask(str(c.get("author") or action.user)), "body": mask(str(c.get("body") or ""))[:REVIEW_CHARS],
             "path": mask(str(c.get("path") or "")), "line": c.get("line")} for c in comments if c.get("body")]


class PullOutcomes:
    """The intake's outcome rules over the outcome store, the broker's Redis and the context store."""

    def __init__(self, settings: Settings, client: redis.Redis, celery_app: Any, followups: Followups,
                 contexts: Callable[[], ContextStore]) -> None:
        self.settings, self.client, self.celery_app = settings, client, celery_app
        self.followups, self.contexts = followups, contexts
        self._store: OutcomeStore | None = None

    @property
    def store(self) -> OutcomeStore:
        """The outcome store (opened on first use)."""
        if self._store is None:
            self._store = open_outcomes(self.settings)
        return self._store

    def reviewed(self, request: dict[str, Any], action: Trigger) -> None:
        """A review on a request a task opened: counted, and its remarks kept as the request's last review."""
        followup = request.get("followup") or {}
        entries = review_entries(action)
        if followup.get("kind") != "review" or not followup.get("pull") or not entries:
            return
        pull = key_id({**request["task_key"], "task_type": str(followup["pull_kind"]),
                       "task_id": str(followup["pull"])})
        try:
            self.store.note_review(pull, entries)
        except TasukiError as exc:  # the follow-up goes ahead: the outcome misses a review, said in the log
            log.warning("review not recorded on the outcome", pull=pull, error=str(exc))

    def ended(self, action: PullEnded, cancel: Callable[[str], str]) -> Outcome:
        """Record the ending; a follow-up running on a request closed or merged is cancelled."""
        pull = key_id(action.pull_key)
        if action.outcome == "reopened":
            before = self.store.reopened(pull)
            if before is None:
                return 200, {"status": "ignored", "reason": "not a request a task opened"}, "ignored"
            log.info("pull request reopened", pull=pull, was=before)
            return 200, {"status": "reopened"}, "recorded"
        before = self.store.ended(pull, merged=action.outcome == "merged", at=action.at,
                                  review_comments=action.review_comments)
        cancelled = self._cancel_followup(action, cancel)
        if before is None and cancelled is None:
            return 200, {"status": "ignored", "reason": "not a request a task opened"}, "ignored"
        if before is not None and before != action.outcome:
            self.client.hincrby(STATS_KEY, f"pull_requests:{action.outcome}", 1)
            if action.outcome == "closed":  # its last review reaches the repository memory (a worker writes it)
                self.celery_app.send_task(REMEMBER_REJECTION, args=[pull], queue=MAINTENANCE_QUEUE)
        log.info("pull request ended", pull=pull, outcome=action.outcome, cancelled=cancelled)
        return 200, {"status": action.outcome, **({"cancelled": cancelled} if cancelled else {})}, "recorded"

    def _cancel_followup(self, action: PullEnded, cancel: Callable[[str], str]) -> str | None:
        """Cancel the thread's queued or running task when it works on this request; its UUID, if one was."""
        thread = self.followups.thread_of(action.pull_key, action.body, action.head)
        if thread is None:
            return None
        raw = self.client.get(ACTIVE_PREFIX + task_key_id(thread.task_key))
        uuid = raw.decode() if isinstance(raw, bytes) else raw
        if not uuid or not self._works_on(uuid, thread.pull):
            return None
        try:
            cancel(uuid)
        except ContextCompletedError:
            return None
        log.info("follow-up cancelled: its pull/merge request ended", uuid=uuid, outcome=action.outcome)
        return str(uuid)

    def _works_on(self, uuid: str, pull: int) -> bool:
        """Whether the task is a follow-up of request ``pull`` (a queued one, without a context yet, is taken to be:
        the thread's work is on its request)."""
        try:
            request = read_json(self.contexts().locate(uuid) / METADATA_FILE).get("request") or {}
        except ContextNotFoundError:
            return True
        except (OSError, ValueError, TasukiError):
            return False
        followup = request.get("followup") or {}
        return str(followup.get("pull") or "") == str(pull)
