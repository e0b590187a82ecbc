"""Celery tasks and helpers of follow-ups (SPEC §14): the running task's inbox, the thread a finished task
leaves behind, replies and commands that need the forge (the intake never waits on it)."""

from __future__ import annotations

from typing import Any

import redis
import structlog

from contexts.masking import mask
from contexts.names import FINAL_STATUSES
from worker.celery import app
from worker.forges import ItemRef, make_forge
from worker.forges.base import Forge
from worker.names import AUTOFIX, AUTOFIX_OFF_PREFIX, CI_FIXES_PREFIX, FORGE_REPLY, LAST_TASK_PREFIX
from worker.run import TaskRequest
from worker.runtime import redis_client, settings
from worker.submit import task_key_id
from worker.threads import THREAD_TTL_S, Thread, change_number, key_id, record_thread

log = structlog.get_logger(__name__)

@app.task(name=FORGE_REPLY)
def forge_reply(task_key: dict[str, str], body: str) -> None:
    """A short comment on an issue or pull/merge request (the intake's answer to an unknown command)."""
    ref = ItemRef.from_task_key(task_key)
    if ref is None or task_key.get("task_source") not in ("github", "gitlab"):
        return
    forge = make_forge(task_key["task_source"], settings())
    try:
        forge.comment(ref, mask(body))
    finally:
        forge.close()


def remember_thread(request: TaskRequest, uuid: str, result: dict[str, Any]) -> None:
    """A task that opened a pull/merge request, or continued one, becomes its thread's newest task."""
    if result["status"] not in FINAL_STATUSES:  # a delivery that left the task to another one
        return
    try:
        redis_client().set(LAST_TASK_PREFIX + task_key_id(request.task_key), uuid, ex=THREAD_TTL_S)
    except redis.RedisError as exc:
        log.warning("last task not recorded", error=str(exc))
    followup = request.followup
    if followup and not followup.get("pull"):
        return
    number = int(followup["pull"]) if followup else change_number(str(result.get("pull_request_url") or ""))
    if number is None or request.task_key.get("task_source") not in ("github", "gitlab"):
        return
    kind = str(followup["pull_kind"]) if followup else (
        "pull_request" if request.task_key["task_source"] == "github" else "merge_request")
    branch = str(followup["branch"]) if followup else str(result.get("branch") or "")
    if not branch:
        return
    try:
        record_thread(redis_client(), Thread(request.task_key, kind, number, branch, uuid))
    except redis.RedisError as exc:
        log.warning("thread not recorded", error=str(exc))


@app.task(name=AUTOFIX)
def set_autofix(pull_key: dict[str, str], on: bool, trigger: dict[str, Any]) -> bool:
    """``/tasuki autofix on|off`` from a GitLab note: applied once the author's access is checked."""
    forge = make_forge(pull_key["task_source"], settings())
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
