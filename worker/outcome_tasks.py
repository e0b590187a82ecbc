"""Outcomes on the worker's side (issue 28): the ending subscriber that records a pull/merge request a task opened
and each follow-up task's spend on it, and ``tasuki.remember_rejection``, which carries a request closed unmerged
into the repository memory as what its reviewers rejected (SPEC §13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
import structlog
from celery import Task

from contexts import TasukiError
from contexts.atomic import read_json
from contexts.clock import parse_iso, utc_now
from contexts.masking import mask
from contexts.names import METADATA_FILE
from contexts.outcomes import OutcomeStore, PullOutcome
from contexts.state import read_state
from contexts.summary import summarize
from contexts.usage import repo_of
from memory import MemoryUnavailable, repository_key
from memory.rejections import with_rejection
from worker.celery import app
from worker.endings import Ending, on_ending
from worker.forges import FORGES
from worker.merging import RETRY_S, release_merge
from worker.names import MERGE_RUNNING_PREFIX, REMEMBER_REJECTION, STATS_KEY
from worker.runtime import context_store, redis_client, settings
from worker.stores import find_outcomes, open_memory, open_outcomes
from worker.threads import change_number, key_id

log = structlog.get_logger(__name__)

OPENED_FIELD = "pull_requests:opened"  # STATS_KEY fields /metrics reads: pull_requests:{opened,merged,closed}


def finished_context(uuid: str) -> Path | None:
    """The finished context of ``uuid``, None when there is none."""
    try:
        directory = context_store(settings(), index=False).completed_path(uuid)
    except (OSError, TasukiError):
        return None
    return directory if directory.is_dir() else None


def respend(directory: Path) -> None:
    """A finished task's spend grew (its memory jobs' calls are metered in its context after it ended): its
    request's outcome counts it again. Nothing when no request was ever recorded."""
    store = find_outcomes(settings())
    if store is None:
        return
    try:
        record_task(store, directory)
    except (OSError, KeyError, ValueError, TasukiError) as exc:
        log.warning("outcome spend not updated", error=mask(str(exc))[:300])
    finally:
        store.close()


@on_ending("outcomes")
def _record_outcome(ending: Ending) -> None:
    """A task that opened a pull/merge request records it; a follow-up adds itself and its spend to its request's."""
    directory = finished_context(ending.uuid)
    if directory is None:
        return
    store = open_outcomes(settings())
    try:
        opened = record_task(store, directory)
    finally:
        store.close()
    if opened:
        try:
            redis_client().hincrby(STATS_KEY, OPENED_FIELD, 1)
        except redis.RedisError as exc:
            log.warning("opened pull request not counted", error=str(exc))


def record_task(store: OutcomeStore, directory: Path) -> bool:
    """Record the finished task in ``directory`` on its request's outcome; True when it opened a new request."""
    metadata = read_json(directory / METADATA_FILE)
    task_key = dict(metadata["task_key"])
    forge = FORGES.get(task_key.get("task_source", ""))
    if forge is None:
        return False
    kind = forge.change_kind
    request = metadata.get("request") or {}
    followup = request.get("followup") or {}
    summary = summarize(directory)
    tokens, cost = summary.total_tokens_used, summary.cost_usd
    if followup.get("pull"):
        pull_key = {**task_key, "task_type": str(followup.get("pull_kind") or kind), "task_id": str(followup["pull"])}
        store.add_task(key_id(pull_key), summary.uuid, followup=True, tokens=tokens, cost_usd=cost)
        return False
    result = read_state(directory).get("result") or {}
    url = str(result.get("pull_request_url") or "") if isinstance(result, dict) else ""
    number = change_number(url)
    if number is None:
        return False
    pull = key_id({**task_key, "task_type": kind, "task_id": str(number)})
    config = metadata.get("config") or {}
    new = store.opened(PullOutcome(
        pull=pull, thread=key_id(task_key), repository=repo_of(task_key), number=number, url=mask(url),
        branch=str(result.get("branch") or ""), model=str(config.get("model") or "?"), first_uuid=summary.uuid,
        started_at=parse_iso(metadata["created_at"]), opened_at=summary.completed_at or utc_now(),
    ))
    store.add_task(pull, summary.uuid, followup=False, tokens=tokens, cost_usd=cost)
    return new


@app.task(name=REMEMBER_REJECTION, bind=True, max_retries=None)
def remember_rejection(self: Task, pull: str) -> dict[str, Any]:
    """The last review of a request closed unmerged reaches its repository memory (on ``maintenance``), under the
    repository's merge lock so that no merge job's write is lost to this one or this one to it."""
    s = settings()
    store = find_outcomes(s)
    outcome = store.get(pull) if store is not None else None
    if store is not None:
        store.close()
    if outcome is None or outcome.state != "closed":
        return {"pull": pull, "status": "not closed unmerged"}
    source, owner, repo = pull.split("/")[:3]
    repository = repository_key({"task_source": source, "owner": owner, "repo": repo})
    client, token = redis_client(), f"rejection:{self.request.id or pull}"
    if not client.set(MERGE_RUNNING_PREFIX + repository, token, nx=True, ex=900):
        raise self.retry(countdown=RETRY_S)  # a merge of this repository's memory runs: after it
    try:
        memory = open_memory(s)
        try:
            existing = memory.memory("repository", repository)
            updated = with_rejection(existing, outcome, repository, s.memory.repo_max_tokens, utc_now())
            if updated is None:
                return {"pull": pull, "status": "no review to remember"}
            memory.put_memory(updated, repository)
        finally:
            memory.close()
    except (MemoryUnavailable, TasukiError) as exc:
        log.warning("rejection not remembered", pull=pull, error=mask(str(exc))[:300])
        return {"pull": pull, "status": "memory unavailable"}
    finally:
        release_merge(client, repository, token)
    log.info("rejection remembered", pull=pull, repository=repository)
    return {"pull": pull, "status": "remembered"}

