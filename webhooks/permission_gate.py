"""Every trigger's person checked against the forge's real permission before anything is queued (issue 40).

The person behind a delivery (a label's sender, a comment's or review's author, a ``/tasuki`` command's, a failed
CI run's pusher) must hold at least ``permissions.minimum`` (or the repository's own) on the repository, as the
forge says it: GitHub's collaborator permission, GitLab's member access level, Gitea's collaborator permission
(worker/permissions.py). A warm cache costs the event loop one Redis GET; a cold one asks the forge on a worker
thread and keeps the answer for ``permissions.cache_s``.

- Refused: nothing is queued, nothing reaches a running task's inbox; the issue is told once per person (a Redis
  SET NX per repository, item and person), and the refusal is in the audit log.
- The forge cannot say (5xx, timeout, a suspended installation): refused for now (fail closed) and *held*: the
  delivery waits in a Redis sorted set and this intake (any intake of the deployment) checks it again after
  ``permissions.retry_s``, doubling, ``permissions.retries`` times; then it is refused for good. Forges do not
  redeliver a failed webhook by themselves (GitHub never does, GitLab disables a hook that keeps failing), so the
  answer is a 202 ``held`` and the retry is Tasuki's own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

import httpx
import redis
import redis.asyncio
import structlog

from webhooks.ci_events import CIFailure
from webhooks.events import Cancel, Command, Note, Trigger
from worker.audit import record_audit
from worker.forges import ForgeError, forge_section, make_forge
from worker.names import HELD_TRIGGERS_KEY, REFUSED_PREFIX
from worker.permissions import Level, PermissionCache, PermissionUnknown, Person, minimum
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

REFUSAL_TTL_S = 30 * 24 * 3600  # one answer per person and item for a month: a refused person is not told twice
HELD_TTL_S = 8 * 24 * 3600
Outcome = tuple[int, dict[str, Any], str]  # HTTP status, body, metrics outcome
Checked = Trigger | Cancel | Note | Command | CIFailure
ACTION_TYPES: dict[str, type[Checked]] = {cls.__name__: cls for cls in (Trigger, Cancel, Note, Command, CIFailure)}
Redeliver = Callable[[str, str, Any, int], Awaitable[Any]]
Blocking = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Subject:
    """Whose permission on which repository a delivery rests on; ``item`` is the issue or request (CI: none)."""

    source: str
    owner: str
    repo: str
    item: str
    person: Person
    kind: str
    installation: int | None = None


@dataclass(frozen=True)
class Verdict:
    """What the forge said of the subject; ``level`` None: nothing to check (the bot itself, checks turned off)."""

    subject: Subject | None
    level: Level | None
    least: Level

    @property
    def admitted(self) -> bool:
        """Whether the delivery may go on."""
        return self.level is None or self.level >= self.least


def subject_of(action: Checked) -> Subject | None:
    """The person and repository a checked action rests on; None for what no person asks (a request's ending)."""
    if isinstance(action, CIFailure):
        return Subject(action.source, action.owner, action.repo, "", Person(action.actor, action.actor_id), "ci")
    key = action.task_key
    trigger = getattr(action, "trigger", {}) or {}
    user_id = trigger.get("user_id")
    installation = trigger.get("installation")
    kind = "cancel" if isinstance(action, Cancel) else "command" if isinstance(action, Command) else \
        str(trigger.get("kind") or "comment")
    return Subject(key["task_source"], key["owner"], key["repo"], key.get("task_id", ""),
                   Person(action.user, user_id if isinstance(user_id, int) and user_id > 0 else None), kind,
                   installation if isinstance(installation, int) else None)


def refusal_text(subject: Subject, verdict: Verdict | None, why: str = "") -> str:
    """What the issue is told (once): who, what is needed, what the forge said, that nothing went on."""
    repository = f"{subject.owner}/{subject.repo}"
    if verdict is None:
        return (f"@{subject.person.login}: Tasuki could not learn your permission on {repository} from the forge "
                f"({why}), so it did not act on this. Please try again later.")
    return (f"@{subject.person.login}: Tasuki acts only for people with at least {verdict.least} permission on "
            f"{repository}; the forge says you have {verdict.level}. Nothing was started and your words were not "
            "passed on to a running task.")


class PermissionGate:
    """The intake's check of each delivery's person; one per intake."""

    def __init__(self, settings: Settings, client: redis.Redis, async_client: redis.asyncio.Redis,
                 blocking: Blocking, reply: Callable[[dict[str, str], str], None]) -> None:
        self.settings = settings
        self.client = client
        self.blocking = blocking
        self.reply = reply
        self.cache = PermissionCache(client, async_client, settings.permissions.cache_s)
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # -- judging -------------------------------------------------------------------------------------

    async def judge(self, action: Checked) -> Verdict:
        """The verdict on ``action``'s person; raises :class:`PermissionUnknown` when the forge cannot say."""
        subject = subject_of(action)
        if subject is None or not self.settings.permissions.check:
            return Verdict(subject, None, Level.NONE)
        least = minimum(self.settings.permissions, subject.owner, subject.repo)
        login = subject.person.login
        if login and login.lower() == forge_section(subject.source, self.settings).bot_login.lower():
            return Verdict(subject, None, least)  # the bot's own push or label: its tasks are bounded elsewhere
        if not login:
            return Verdict(subject, Level.NONE, least)
        level = await self.cache.get_async(subject.source, subject.owner, subject.repo, login)
        if level is None:
            level = await self.blocking(self.lookup, subject)
        return Verdict(subject, level, least)

    def lookup(self, subject: Subject) -> Level:
        """Ask the forge (blocking) and keep its answer; :class:`PermissionUnknown` when it cannot say."""
        task_key = {"task_source": subject.source, "owner": subject.owner, "repo": subject.repo}
        trigger = {"installation": subject.installation} if subject.installation is not None else {}
        try:
            forge = make_forge(subject.source, self.settings, task_key, trigger)
        except ForgeError as exc:  # no credential at all (a GitHub App without its key): nobody is admitted
            raise PermissionUnknown(str(exc)) from None
        http = getattr(forge, "http", None)
        if http is not None:
            http.client.timeout = httpx.Timeout(self.settings.permissions.timeout_s)
        try:
            level = forge.permission(subject.owner, subject.repo, subject.person)
        except ForgeError as exc:  # an installation token that cannot be had (suspended, removed)
            raise PermissionUnknown(str(exc)) from None
        finally:
            forge.close()
        self.cache.put(subject.source, subject.owner, subject.repo, subject.person.login, level)
        log.info("permission looked up", source=subject.source, repository=f"{subject.owner}/{subject.repo}",
                 person=subject.person.login, permission=str(level))
        return level

    # -- answering -----------------------------------------------------------------------------------

    def refuse(self, delivery: str, action: Checked, verdict: Verdict | None, why: str = "") -> Outcome:
        """Refuse (once per delivery): the issue is told once per person, the audit log each time."""
        if not self.client.set(delivery, "1", nx=True, ex=HELD_TTL_S):
            return 200, {"status": "duplicate"}, "duplicate"
        subject = (verdict.subject if verdict is not None else None) or subject_of(action)
        if subject is None:  # never: every checked action has a person
            return 200, {"status": "refused", "reason": why}, "refused"
        reason = why or f"{subject.person.login} has {verdict.level if verdict else 'unknown'} permission on " \
                        f"{subject.owner}/{subject.repo}, {verdict.least if verdict else 'write'} needed"
        log.info("trigger refused", source=subject.source, repository=f"{subject.owner}/{subject.repo}",
                 person=subject.person.login, kind=subject.kind, reason=reason)
        self._audit("trigger.refused", subject, verdict, "refused", reason)
        # A comment not addressed to Tasuki (a Note) is dropped without a word: its author asked nothing of it.
        if subject.item and isinstance(action, Trigger | Cancel | Command):
            once = (f"{REFUSED_PREFIX}{subject.source}:{subject.owner}/{subject.repo}:{subject.item}:"
                    f"{subject.person.login}").lower()
            if self.client.set(once, "1", nx=True, ex=REFUSAL_TTL_S):
                self.reply(action.task_key, refusal_text(subject, verdict, why))
        return 200, {"status": "refused", "reason": reason}, "refused"

    def admitted(self, verdict: Verdict) -> None:
        """Record an admitted delivery in the audit log, off the answer's path (the delivery is already queued)."""
        if verdict.subject is None or verdict.level is None:
            return
        task = asyncio.ensure_future(self.blocking(self._audit, "trigger.admitted", verdict.subject, verdict,
                                                   "ok", ""))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _audit(self, action: str, subject: Subject, verdict: Verdict | None, outcome: str, reason: str) -> None:
        where = f"{subject.source}:{subject.owner}/{subject.repo}" + (f"#{subject.item}" if subject.item else "")
        detail = {"kind": subject.kind, "minimum": str(verdict.least) if verdict else "",
                  "permission": str(verdict.level) if verdict and verdict.level is not None else "unknown"}
        record_audit(self.settings, actor=f"{subject.source}:{subject.person.login}", action=action, target=where,
                     outcome=outcome, reason=reason, source="webhook", detail=detail)

    # -- holding for a retry -------------------------------------------------------------------------

    def hold(self, delivery: str, source: str, delivery_id: str, action: Checked, tries: int, why: str) -> Outcome:
        """Keep a delivery the forge could not judge for a later check (its dedupe key ``delivery`` is not taken, so
        a redelivery may try too); after the last check, refuse it for good."""
        settings = self.settings.permissions
        if tries >= settings.retries:
            return self.refuse(delivery, action, None, f"the forge did not answer: {why}")
        due = time.time() + settings.retry_s * 2 ** tries
        self.client.zadd(HELD_TRIGGERS_KEY, {_member(source, delivery_id, action, tries): due})
        log.warning("trigger held: the forge could not say the person's permission", source=source,
                    delivery=delivery_id, tries=tries, reason=why[:200])
        return 202, {"status": "held", "reason": f"permission unknown, checked again later: {why[:200]}"}, "held"

    def take_due(self, now: float) -> list[tuple[str, str, Checked, int]]:
        """The held deliveries due by ``now``, each taken by one intake only (ZREM decides)."""
        taken = []
        found = cast(list[bytes], self.client.zrangebyscore(HELD_TRIGGERS_KEY, "-inf", now, start=0, num=50))
        for raw in found:
            if self.client.zrem(HELD_TRIGGERS_KEY, raw):
                try:
                    taken.append(_parse(raw))
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("held trigger unreadable, dropped", error=str(exc)[:200])
        return taken

    def start_retries(self, redeliver: Redeliver) -> None:
        """Check held deliveries again while this intake runs (started with its first delivery)."""
        running = self._sweeper is not None and not self._sweeper.done() and \
            self._sweeper.get_loop() is asyncio.get_running_loop()  # a test client may run each request on a loop
        if not running:
            self._sweeper = asyncio.ensure_future(self._sweep(redeliver))

    async def _sweep(self, redeliver: Redeliver) -> None:
        poll = min(self.settings.permissions.retry_s, 5.0)
        while True:
            await asyncio.sleep(poll)
            try:
                due = await self.blocking(self.take_due, time.time())
            except redis.RedisError as exc:
                log.warning("held triggers not read", error=str(exc)[:200])
                continue
            for source, delivery_id, action, tries in due:
                try:
                    await redeliver(source, delivery_id, action, tries + 1)
                except Exception as exc:  # one held delivery must not stop the others' retries
                    log.error("held trigger not retried", delivery=delivery_id, error=str(exc)[:200])

    def membership(self, source: str, owner: str, login: str) -> int:
        """Drop cached permissions a membership event changed; how many."""
        dropped = self.cache.drop(source, login, owner)
        log.info("permissions dropped on a membership change", source=source, owner=owner, person=login or "*",
                 dropped=dropped)
        return dropped


def _member(source: str, delivery_id: str, action: Checked, tries: int) -> str:
    return json.dumps({"source": source, "delivery": delivery_id, "tries": tries, "type": type(action).__name__,
                       "action": asdict(action)}, sort_keys=True)


def _parse(raw: bytes | str) -> tuple[str, str, Checked, int]:
    data = json.loads(raw)
    action = ACTION_TYPES[data["type"]](**data["action"])
    return str(data["source"]), str(data["delivery"]), action, int(data["tries"])
