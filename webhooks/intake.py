"""From an action to a queued task: dedupe the delivery, enqueue or cancel, answer (SPEC §2, §8).

A trigger on an issue, the common delivery, is one Redis round trip on the event loop: the admission script
dedupes it, claims the task key and pushes the message (worker/admission.py). Everything else (cancels,
comments for a running task, follow-ups on a pull/merge request, commands) makes blocking Redis, broker and
disk calls, which the ASGI app runs on a worker thread (``Blocking``).
"""

from __future__ import annotations

import hashlib
import json
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import redis
import redis.asyncio
import structlog
from celery.result import AsyncResult

from contexts import ContextCompletedError, ContextNotFoundError, ContextStore
from contexts.clock import utc_now
from webhooks.budget import not_started, over_budget, reply_text, should_reply
from webhooks.ci_events import CIFailure
from webhooks.events import Action, Cancel, Command, Ignore, Note, Trigger
from webhooks.followups import Followups, inbox_entry, may_continue_thread, new_task_request
from webhooks.membership_events import MembershipChanged
from webhooks.outcome_intake import PullOutcomes
from webhooks.permission_gate import PermissionGate
from webhooks.pull_events import PullEnded
from worker.admission import Admissions
from worker.names import ACTIVE_PREFIX, DELIVERY_PREFIX, TASK_PREFIX
from worker.permissions import PermissionUnknown
from worker.profiles import UnknownProfile, check_profile
from worker.settings_models import Settings
from worker.stores import open_store
from worker.submit import Enqueued, enqueue, release_active, request_cancel, run_task_admission, task_key_id

log = structlog.get_logger(__name__)

DELIVERY_TTL_S = 8 * 24 * 3600  # GitHub redelivers for a few days; eight covers it with room to spare

T = TypeVar("T")


class Blocking(Protocol):
    """Runs a blocking call (Redis, the broker, the disk) off the event loop."""

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread."""
        ...


@dataclass(frozen=True)
class Answer:
    """An HTTP answer and the outcome it is counted under in ``/metrics``."""

    status_code: int
    body: dict[str, Any]
    outcome: str


def delivery_key(source: str, delivery_id: str) -> str:
    """The Redis key of one delivery; the id is hashed so that no header can make the key large."""
    return f"{DELIVERY_PREFIX}{source}:{hashlib.sha256(delivery_id.encode('utf-8', 'replace')).hexdigest()[:40]}"


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class Intake:
    """Enqueues and cancels tasks for webhooks and the task API; one per app.

    ``client`` serves the blocking calls (on ``blocking``'s threads), ``async_client`` the event loop's.
    """

    def __init__(self, settings: Settings, client: redis.Redis, async_client: redis.asyncio.Redis,
                 celery_app: Any, blocking: Blocking) -> None:
        self.settings = settings
        self.client = client
        self.async_client = async_client
        self.admissions = Admissions(async_client)
        self.celery_app = celery_app
        self.blocking = blocking
        self._store: ContextStore | None = None
        self.followups = Followups(settings, client, celery_app)
        self.outcomes = PullOutcomes(settings, client, celery_app, self.followups, lambda: self.store)
        self.gate = PermissionGate(settings, client, async_client, blocking, self.followups.reply)

    @property
    def store(self) -> ContextStore:
        """The context store (created on first use: only the task API and cancels need it)."""
        if self._store is None:
            self._store = open_store(self.settings, must_exist=False)
        return self._store

    # -- webhooks --------------------------------------------------------------------------------

    async def deliver(self, source: str, delivery_id: str, action: Action, tries: int = 0) -> Answer:
        """Act on one verified delivery, at most once per delivery id, if its person may (webhooks/permission_gate.py;
        ``tries``: the checks a held delivery has had)."""
        if isinstance(action, Ignore):
            return Answer(200, {"status": "ignored", "reason": action.reason}, "ignored")
        if isinstance(action, MembershipChanged):
            dropped = await self.blocking(self.gate.membership, action.source, action.owner, action.login)
            return Answer(200, {"status": "permissions dropped", "dropped": dropped}, "membership")
        key = delivery_key(source, delivery_id)
        if isinstance(action, PullEnded):  # a fact, whoever brought it about
            return await self._admitted(key, action)
        self.gate.start_retries(self.deliver)
        try:
            verdict = await self.gate.judge(action)
        except PermissionUnknown as exc:  # fail closed, and check again later
            return Answer(*await self.blocking(self.gate.hold, key, source, delivery_id, action, tries, str(exc)))
        if not verdict.admitted:
            return Answer(*await self.blocking(self.gate.refuse, key, action, verdict))
        answer = await self._admitted(key, action)
        if answer.outcome != "duplicate":
            self.gate.admitted(verdict)
        return answer

    async def _admitted(self, key: str, action: Trigger | Cancel | Note | Command | CIFailure | PullEnded) -> Answer:
        # Daily budgets (SPEC §16) read and take Redis counters first: with any set, triggers go the blocking way.
        budgets = self.settings.limits.per_day
        if (isinstance(action, Trigger) and not may_continue_thread(action.task_key) and not budgets
                and self._profile_refusal(action) is None):
            return await self._new_task(key, action)
        return await self.blocking(self._deliver_blocking, key, action)

    async def _new_task(self, key: str, action: Trigger) -> Answer:
        """A trigger that starts new work: dedupe, claim and enqueue in one round trip; the rare task key that is
        already active is answered as ``_trigger`` answers it."""
        request = new_task_request(action)
        uuid = str(uuid_module.uuid4())
        admission = run_task_admission(self.celery_app, self.settings, request, uuid, delivery_key=key,
                                       delivery_ttl_s=DELIVERY_TTL_S)
        admitted = await self.admissions.admit(admission)
        if admitted.outcome == "duplicate":
            return Answer(200, {"status": "duplicate"}, "duplicate")
        if admitted.outcome == "enqueued":
            return self._answer(action, request, Enqueued(uuid, False))
        try:
            return await self.blocking(self._answer_active, action, request, Enqueued(admitted.uuid, True))
        except Exception:
            await self.async_client.delete(key)  # not acted on: a redelivery must be able to try again
            raise

    def _deliver_blocking(self, key: str, action: Trigger | Cancel | Note | Command | CIFailure | PullEnded) -> Answer:
        if not self.client.set(key, "1", nx=True, ex=DELIVERY_TTL_S):
            return Answer(200, {"status": "duplicate"}, "duplicate")
        try:
            return self._act(action)
        except Exception:
            self.client.delete(key)  # not acted on: a redelivery must be able to try again
            raise

    def _act(self, action: Trigger | Cancel | Note | Command | CIFailure | PullEnded) -> Answer:
        if isinstance(action, PullEnded):
            return Answer(*self.outcomes.ended(action, self.cancel))
        if isinstance(action, Trigger):
            return self._trigger(action)
        if isinstance(action, Cancel):
            return self._cancel(action)
        if isinstance(action, Note):
            return Answer(*self.followups.note(action))
        if isinstance(action, Command):
            return self._command(action)
        return self._ci_failure(action)

    def _profile_refusal(self, action: Trigger) -> str | None:
        """Why a trigger's model profile (a label ``coding agent:NAME``, ``/tasuki model NAME``) cannot be used, if
        it names one the configuration does not have."""
        if action.profile is None:
            return None
        try:
            check_profile(self.settings, action.profile)
        except UnknownProfile as exc:
            return str(exc)
        return None

    def _command(self, action: Command) -> Answer:
        """A ``/tasuki`` command; a retry starts a task, so it is held to the daily budgets as a trigger is."""
        if action.name == "retry":
            over = self._over_budget(action.task_key, action.user)
            if over is not None:
                return over
        answer = Answer(*self.followups.command(action, self.submit))
        if action.name == "retry" and answer.outcome != "enqueued":
            not_started(self.settings.limits, self.client, action.user, utc_now())
        return answer

    def _ci_failure(self, action: CIFailure) -> Answer:
        """A CI-fix task, unless its repository is over its daily budget (the runaway case: fix, fail, fix)."""
        repository = {"task_source": action.source, "owner": action.owner, "repo": action.repo}
        why = over_budget(self.settings.limits, self.client, repository, "", utc_now())
        if why is not None:
            log.info("CI failure over budget", repository=action.repo, reason=why)
            return Answer(200, {"status": "over_budget", "reason": why}, "over_budget")
        return Answer(*self.followups.ci_failure(action, self.submit))

    def _trigger(self, action: Trigger) -> Answer:
        why = self._profile_refusal(action)
        if why is not None:  # nothing starts; the issue hears why (one reply per delivery)
            self.followups.reply(action.task_key, f"Tasuki did not start this task: {why}.")
            log.info("trigger names an unknown model profile", task_key=task_key_id(action.task_key), reason=why)
            return Answer(200, {"status": "ignored", "reason": why}, "ignored")
        request = self.followups.request(action)
        if request is None:
            return Answer(200, {"status": "ignored", "reason": "review on a request no task opened"}, "ignored")
        self.outcomes.reviewed(request, action)
        enqueued = self.submit_within_budget(request)
        if isinstance(enqueued, str):
            return self._refused(action.task_key, enqueued)
        return self._answer(action, request, enqueued)

    def _active(self, request: dict[str, Any]) -> bool:
        """Whether the request's task key has a task queued or running: a trigger for it starts nothing (its words go
        to that task's inbox), so no daily budget holds it back."""
        key = ACTIVE_PREFIX + task_key_id(request["task_key"])
        return bool(self.settings.limits.per_day and self.client.exists(key))

    def _answer_active(self, action: Trigger, request: dict[str, Any], enqueued: Enqueued) -> Answer:
        return self._answer(action, request, self._unless_finished(request, enqueued))

    def _answer(self, action: Trigger, request: dict[str, Any], enqueued: Enqueued, tries: int = 3) -> Answer:
        if enqueued.already_active:
            if not action.prompt and not action.details.get("comments") and not action.details.get("review_id"):
                return Answer(200, {"status": "active", "task_id": enqueued.uuid}, "active")
            # One active task per thread: what was said reaches the running task at its next step.
            comments = action.details.get("comments")
            text = "" if comments else action.prompt  # a review comment's text is in its comment record
            entry = inbox_entry(action.user, text, action.trigger, comments)
            if self.followups.to_inbox(request["task_key"], enqueued.uuid,
                                       {**entry, "review_id": action.details.get("review_id")}):
                return Answer(200, {"status": "delivered", "task_id": enqueued.uuid}, "delivered")
            if tries <= 1:  # tasks of this key kept ending as it arrived: say so rather than claim a delivery
                return Answer(200, {"status": "ignored", "reason": "the task ended as the comment arrived"},
                              "ignored")
            # The task let its key go since it was found active: the trigger starts the next one.
            again = self.submit_within_budget(request)
            if isinstance(again, str):
                return self._refused(action.task_key, again)
            return self._answer(action, request, again, tries - 1)
        log.info("task enqueued", uuid=enqueued.uuid, task_key=task_key_id(request["task_key"]), user=action.user,
                 followup=request.get("followup", {}).get("kind"))
        return Answer(202, {"task_id": enqueued.uuid}, "enqueued")

    def _over_budget(self, task_key: dict[str, str], user: str) -> Answer | None:
        """The answer to a trigger whose repository or user is over its daily budget, else ``None``."""
        why = over_budget(self.settings.limits, self.client, task_key, user, utc_now())
        if why is None:
            return None
        log.info("trigger over budget", task_key=task_key_id(task_key), user=user, reason=why)
        return self._refused(task_key, why)

    def _refused(self, task_key: dict[str, str], why: str) -> Answer:
        """Nothing is queued; the issue is told once a day, with the time the budget resets."""
        now = utc_now()
        if should_reply(self.client, task_key, now):
            self.followups.reply(task_key, reply_text(why, now))
        return Answer(200, {"status": "over_budget", "reason": why}, "over_budget")

    def _finished(self, uuid: str) -> bool:
        """Whether the task's context is completed (as far as this host's contexts show)."""
        try:
            return self.store.completed_path(uuid).is_dir()
        except (OSError, ValueError):
            return False

    def _cancel(self, action: Cancel) -> Answer:
        thread = self.followups.thread_of(action.task_key)
        uuid = _text(self.client.get(ACTIVE_PREFIX + task_key_id(thread.task_key if thread else action.task_key)))
        if uuid is None:
            return Answer(200, {"status": "ignored", "reason": "no active task"}, "ignored")
        log.info("cancel requested", uuid=uuid, user=action.user)
        try:
            detail = self.cancel(uuid)
        except ContextCompletedError:
            return Answer(200, {"status": "ignored", "reason": "task already finished"}, "ignored")
        return Answer(200, {"status": "cancelled", "task_id": uuid, "detail": detail}, "cancelled")

    # -- shared with the task API ----------------------------------------------------------------

    def submit(self, request: dict[str, Any], uuid: str | None = None) -> Enqueued:
        """Enqueue ``tasuki.run_task`` unless the task key is active (the task key is remembered by UUID)."""
        return self._unless_finished(request, enqueue(self.celery_app, self.client, self.settings, request, uuid=uuid),
                                     uuid)

    def _unless_finished(self, request: dict[str, Any], enqueued: Enqueued, uuid: str | None = None) -> Enqueued:
        """``enqueued``, or when its active task finished a moment ago (its key not yet freed: it would never run
        or read its inbox again) the request enqueued anew."""
        if not (enqueued.already_active and self._finished(enqueued.uuid)):
            return enqueued
        release_active(self.client, request["task_key"], enqueued.uuid)
        return enqueue(self.celery_app, self.client, self.settings, request, uuid=uuid)

    def submit_within_budget(self, request: dict[str, Any], uuid: str | None = None) -> Enqueued | str:
        """:meth:`submit` held to the daily budgets of the request's repository and user (SPEC §16), for triggers and
        the task API alike: the submission, or why nothing was queued. A task key already active starts nothing,
        so no budget is checked or taken for it. A request's ``team`` (the API's and console's people, issue 40)
        is held to its team's budgets too."""
        user, now, active = request.get("user") or "", utc_now(), self._active(request)
        team = request.get("team") or ""
        why = None if active else over_budget(self.settings.limits, self.client, request["task_key"], user, now, team)
        if why is not None:
            log.info("over budget", task_key=task_key_id(request["task_key"]), user=user, team=team, reason=why)
            return why
        enqueued = self.submit(request, uuid)
        if enqueued.already_active and not active:  # became active since: the user's task taken is given back
            not_started(self.settings.limits, self.client, user, now, team)
        return enqueued

    def queued_task_key(self, uuid: str) -> dict[str, str] | None:
        """The task key of a task this intake enqueued, while Redis remembers it."""
        raw = _text(self.client.get(TASK_PREFIX + uuid))
        task_key: dict[str, str] | None = json.loads(raw) if raw else None
        return task_key

    def cancel(self, uuid: str) -> str:
        """Request the cancel (ContextCompletedError when it finished); a task revoked while queued frees its key."""
        detail = request_cancel(self.celery_app, self.client, self.store, uuid)
        try:
            self.store.locate(uuid)
        except ContextNotFoundError:
            # Revoked while queued, no worker will ever finish it and free the key. PENDING also guards a
            # task that started on a host whose contexts this process cannot see.
            task_key = self.queued_task_key(uuid)
            if task_key is not None and AsyncResult(uuid, app=self.celery_app).state == "PENDING":
                release_active(self.client, task_key, uuid)
        return detail
