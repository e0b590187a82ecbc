"""Celery tasks and helpers of follow-ups (SPEC §14): the running task's inbox, the thread a finished task
leaves behind, replies and commands that need the forge (the intake never waits on it)."""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
import structlog

from contexts.masking import mask
from contexts.names import FINAL_STATUSES
from worker.celery import app
from worker.forges import FORGES, ItemRef, is_forge, make_forge
from worker.forges.base import Forge
from worker.inbox import INBOX_TTL_S, deliver, heard_ids, take_leftovers
from worker.names import AUTOFIX, AUTOFIX_OFF_PREFIX, CI_FIXES_PREFIX, FORGE_REPLY, INBOX_PREFIX, LAST_TASK_PREFIX
from worker.run import TaskRequest
from worker.runtime import redis_client, settings
from worker.submit import enqueue, task_key_id
from worker.threads import (
    THREAD_TTL_S,
    Thread,
    change_number,
    find_issue_thread,
    followup_of,
    key_id,
    record_thread,
)

log = structlog.get_logger(__name__)

Heard = Callable[[dict[str, Any]], dict[str, Any] | None]  # a reporter's filter of a comment for its task


@app.task(name=FORGE_REPLY)
def forge_reply(task_key: dict[str, str], body: str) -> None:
    """A short comment on an issue or pull/merge request (the intake's answer to an unknown command)."""
    ref = ItemRef.from_task_key(task_key)
    if ref is None or not is_forge(task_key.get("task_source")):
        return
    forge = make_forge(task_key["task_source"], settings(), task_key)
    try:
        forge.comment(ref, mask(body))
    finally:
        forge.close()


def remember_thread(request: TaskRequest, uuid: str, result: dict[str, Any]) -> None:
    """A task that opened a pull/merge request, or continued one, becomes its thread's newest task; a finished task
    becomes its task key's last task (``/tasuki retry``). What Redis does not take now, the monitor records later
    from the context (scheduler.reconcile)."""
    if result["status"] not in FINAL_STATUSES:  # a delivery that left the task to another one
        return
    try:
        record_last_task(redis_client(), request, uuid)
    except redis.RedisError as exc:
        log.warning("last task not recorded", error=str(exc))
    thread = thread_of(request, uuid, result)
    if thread is None:
        return
    try:
        record_thread(redis_client(), thread)
    except redis.RedisError as exc:
        log.warning("thread not recorded", error=str(exc))


def record_last_task(client: redis.Redis, request: TaskRequest, uuid: str, *, only_if_absent: bool = False) -> None:
    """The task key's newest finished task; ``only_if_absent`` never replaces one (a later task may have set it)."""
    client.set(LAST_TASK_PREFIX + task_key_id(request.task_key), uuid, ex=THREAD_TTL_S, nx=only_if_absent)


def thread_of(request: TaskRequest, uuid: str, result: dict[str, Any]) -> Thread | None:
    """The thread a finished task leaves (``result``: its status and the fields its reporter returned), if any."""
    followup = request.followup
    if followup and not followup.get("pull"):
        return None
    number = int(followup["pull"]) if followup else change_number(str(result.get("pull_request_url") or ""))
    source = request.task_key.get("task_source")
    if number is None or source is None or not is_forge(source):
        return None
    kind = str(followup["pull_kind"]) if followup else FORGES[source].change_kind
    branch = str(followup["branch"]) if followup else str(result.get("branch") or "")
    return Thread(request.task_key, kind, number, branch, uuid) if branch else None


def comments_left(uuid: str, status: str, messages: Path, passes: Heard | None) -> list[dict[str, Any]]:
    """The comments delivered to a task that ended before it read them, taken from its inbox, that its reporter
    lets through (the filter a running task applies). The task has let its key go: nothing more arrives. Nothing
    for a delivery that left the task to another one, which reads them, nor for a cancelled task (the cancel
    stands: whoever wants more work asks for it with the mention)."""
    if status not in FINAL_STATUSES or status == "cancelled":
        return []
    try:
        entries = take_leftovers(redis_client(), uuid)
    except redis.RedisError as exc:
        log.warning("inbox not read at the end of the task", error=str(exc))
        return []
    held = heard_ids(messages) if entries and messages.is_file() else set()
    left = []
    for entry in entries:
        if entry.get("id") and str(entry["id"]) in held:
            continue  # heard, but its trim failed
        try:
            if passes is None or passes(entry) is not None:
                left.append(entry)
        except Exception as exc:  # the forge could not say: not let through unchecked
            log.warning("comment left at the end not taken", error=mask(str(exc))[:300])
    return left


def start_followup(request: TaskRequest, comments: list[dict[str, Any]]) -> str | None:
    """Comments delivered as the task ended start the next task of its thread, as they would have a moment
    later: the first one's text is its prompt, the others wait in its inbox. Returns the task they went to."""
    if not comments:
        return None
    client, (first, *rest) = redis_client(), comments
    kind = "review" if first.get("review_id") else "comment"
    trigger = {"kind": kind, "user": first.get("author"),
               **({"user_id": first["user_id"]} if first.get("user_id") is not None else {})}
    followup: dict[str, Any] = {**asdict(request), "user": str(first.get("author") or request.user or ""),
                                "prompt": str(first.get("body") or ""), "trigger": trigger, "followup": {}}
    thread = find_issue_thread(client, request.task_key)
    if thread is not None:
        details = {k: first[k] for k in ("review_id", "comments") if first.get(k)}
        followup.update(task_key=thread.task_key, followup=followup_of(thread, kind, details))
    uuid = str(uuid_module.uuid4())
    if rest:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(INBOX_PREFIX + uuid, *(json.dumps(entry) for entry in rest))
        pipe.expire(INBOX_PREFIX + uuid, INBOX_TTL_S)
        pipe.execute()
    enqueued = enqueue(app, client, settings(), followup, uuid=uuid)
    if enqueued.already_active:  # a trigger started one meanwhile: the comments go to it
        lost = [e for e in comments if not deliver(client, followup["task_key"], enqueued.uuid, e)]
        if lost:
            log.warning("comments that arrived as the task ended could not be delivered", count=len(lost))
    log.info("comments that arrived as the task ended go to the next task", next_uuid=enqueued.uuid,
             comments=len(comments), started=not enqueued.already_active)
    return enqueued.uuid


@app.task(name=AUTOFIX)
def set_autofix(pull_key: dict[str, str], on: bool, trigger: dict[str, Any]) -> bool:
    """``/tasuki autofix on|off`` from a comment whose author's access the intake could not check (GitLab, Gitea):
    applied once it is checked."""
    forge = make_forge(pull_key["task_source"], settings(), pull_key, trigger)
    try:
        return apply_autofix(forge, redis_client(), pull_key, on, trigger)
    finally:
        forge.close()


def apply_autofix(forge: Forge, client: redis.Redis, pull_key: dict[str, str], on: bool,
                  trigger: dict[str, Any]) -> bool:
    """Turn CI fixes of a pull/merge request on (and reset their count) or off, if the author may."""
    ref = ItemRef.from_task_key(pull_key)
    if ref is None or not forge.allows(ref, {**trigger, "kind": "comment"}):
        log.info("autofix command refused", pull=key_id(pull_key))
        return False
    pull = key_id(pull_key)
    if on:
        client.delete(AUTOFIX_OFF_PREFIX + pull, CI_FIXES_PREFIX + pull)
    else:
        client.set(AUTOFIX_OFF_PREFIX + pull, "1", ex=THREAD_TTL_S)
    return True
