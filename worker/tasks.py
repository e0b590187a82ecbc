"""Celery tasks of the worker: ``tasuki.run_task`` and ``tasuki.compress_context`` (SPEC §5, §6); memory's are in
:mod:`worker.memory_tasks`, which this module loads so that its ending subscriber is registered wherever this is."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace
from datetime import timedelta
from itertools import takewhile
from typing import Any, cast

import redis
import structlog
from celery import Task
from celery.exceptions import Ignore
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from agent.llm import Provider
from agent.prompts import summarizer_messages
from agent.recorded import request_as_json, request_from_json, sent_request
from agent.seams import usage_of
from contexts import Context, TasukiError, jsonl
from contexts.atomic import read_json
from contexts.compression import Summarized
from contexts.masking import mask, mask_value
from contexts.names import MESSAGES_FILE, METADATA_FILE, SUMMARIES_FILE
from contexts.requests import SentRequest
from contexts.usage import Usage, repo_of
from worker import (  # noqa: F401 - their ending subscribers
    attempt_tasks,
    bookkeeping,
    compressors,
    lifecycle,
    memory_tasks,
    outcome_tasks,
)
from worker.celery import app
from worker.endings import Ending, announce, on_ending
from worker.environment import EnvironmentReport
from worker.followup_tasks import comments_left, remember_thread, start_followup
from worker.forges.reporter import reporter_for
from worker.inbox import read_inbox, trim_inbox
from worker.metering import Meter
from worker.names import (
    COMPRESS_CONTEXT,
    COMPRESSION_QUEUE,
    RUN_TASK,
    STATS_KEY,
)
from worker.profiles import PROFILE_KEY, choose_profile, previous_profile
from worker.remembering import first_prompt_memory, task_recall
from worker.run import LocalReporter, TaskRequest, TaskRun, cannot_start
from worker.runtime import CLOCK, context_store, llm_config, provider_for, redis_client, settings, unindex
from worker.settings_models import Settings
from worker.submit import send_run_task
from worker.user_config import resolve_llm_config

log = structlog.get_logger(__name__)


RESULT_CHECK_S = 0.5  # how often a waiting task re-checks a compression job's time limits
SUMMARIZER_OVERHEAD_TOKENS = 400  # the summarizer's instructions and the per-message role prefixes
SPAN_SHARE = 0.6  # of what is left: the rest is room for the summary the model writes


class CompressionError(TasukiError):
    """Summarizing a span failed (the task goes on; the prompt builder's emergency rule applies)."""


class TaskEnded(TasukiError):
    """The task ended failed, timed out or cancelled: raised after its context is finished, so that Celery
    (and Flower) record FAILURE with the masked error instead of SUCCESS. Not retried: it is acknowledged."""


NOT_FINAL = ("dropped", "deferred", "handed_back", "fenced", "unfinished")
UNSUCCESSFUL = ("failed", "timeout", "cancelled")
"""Outcomes of a delivery that leave the task's fate to another delivery: acknowledged, no result stored."""


@app.task(name=RUN_TASK, bind=True, throws=(TaskEnded,))
def run_task(self: Task, uuid: str, request: dict[str, Any]) -> dict[str, Any]:
    """Create or resume the context ``uuid`` and run the agent until it finishes."""
    structlog.contextvars.bind_contextvars(uuid=uuid)
    try:
        s = settings()
        parsed = TaskRequest.from_json(request)
        config = task_config(s, parsed)
        reporter = reporter_for(s, parsed, uuid)  # GitHub/GitLab: labels, progress comment, PR/MR
        fanned = attempt_tasks.run_as_parent(s, uuid, request, parsed, reporter)  # N attempts run, the pick delivers
        if fanned is not None:
            raise TaskEnded(mask(f"failed: {fanned['error']}")) if fanned["status"] == "failed" else Ignore("fan-out")
        reporter = attempt_tasks.attempt_reporter(s, parsed) if parsed.attempt else reporter  # type: ignore[assignment]
        on_finish = lambda u, status: task_ended(u, parsed.task_key, status, request)  # noqa: E731 - passed twice
        try:
            store = context_store(s)
        except OSError as exc:  # the contexts root cannot even be made: no context, but a visible failure
            result = cannot_start(uuid, reporter or LocalReporter(parsed), on_finish, s.contexts.base_dir, exc)
            raise TaskEnded(mask(f"failed: {result['error']}")) from None
        meter = Meter(s, repo_of(parsed.task_key), redis_client, profile=str(config.get(PROFILE_KEY) or ""),
                      team=parsed.team or "")
        try:
            result = TaskRun(
                uuid=uuid,
                request=parsed,
                settings=s,
                store=store,
                provider_for=provider_for,
                compressor=compress_through_queue,
                should_stop=lifecycle.shutting_down,
                cancel_flagged=lambda: lifecycle.cancel_flagged(uuid),
                on_finish=on_finish,
                reporter=reporter,
                # An eval task (its request holds the held-back tests) must not learn the answers: no memory.
                recollect=None if parsed.grading else lambda ctx, checkout, task: first_prompt_memory(
                    s, ctx, checkout, request, task, int(ctx.metadata["config"]["context_length"]),
                    meter.embeddings_into(ctx),
                ),
                recall=None if parsed.grading else lambda ctx, query, in_prompt: task_recall(
                    s, ctx, request, query, in_prompt, meter.embeddings_into(ctx)),
                inbox=lambda: read_inbox(redis_client(), uuid),
                inbox_trim=lambda count: trim_inbox(redis_client(), uuid, count),
                meter=meter,
                stopped=lambda: stop_recorded(uuid),
                record_stop=lambda outcome: bookkeeping.record_stop(redis_client(), uuid, outcome),
                on_environment=count_environment,
            ).execute(config)
            left = comments_left(uuid, result["status"], store.completed_path(uuid) / MESSAGES_FILE,
                                 reporter.heard if reporter is not None else None)
        finally:
            if reporter is not None:
                reporter.close()
        remember_thread(parsed, uuid, result)
        try:
            start_followup(parsed, left)
        except redis.RedisError as exc:
            log.warning("comments that arrived as the task ended were not handed on", count=len(left), error=str(exc))
        if result["status"] in ("handed_back", "deferred"):
            requeue(uuid, request, float(result.get("retry_in_s", 0)))
        if result["status"] in NOT_FINAL:
            # Every delivery shares the task id (the UUID): a SUCCESS stored for one that did not finish the task
            # would make Celery treat the holder's later worker loss as success (no requeue) and mislead waiters.
            raise Ignore(f"delivery {result['status']}")
        if result["status"] in UNSUCCESSFUL:
            raise TaskEnded(mask(f"{result['status']}: {result.get('error') or 'no error recorded'}"))
        return cast(dict[str, Any], mask_value(result))
    finally:
        structlog.contextvars.unbind_contextvars("uuid")


def task_config(s: Settings, request: TaskRequest) -> dict[str, Any]:
    """The LLM config a new task records in ``metadata.json.config``: its model profile (the request's, the task it
    follows, its repository's, else the default: :mod:`worker.profiles`), with the per-user settings on top, then
    whatever else the request's ``config`` sets."""
    named = request.config.get(PROFILE_KEY)
    previous = None if named else previous_profile(lambda: context_store(s), request.followup.get("previous"))
    profile = choose_profile(s, named, previous, request.task_key)
    extra = {key: value for key, value in request.config.items() if key != PROFILE_KEY}
    return {**resolve_llm_config(s, redis_client(), request.user, profile=profile), **extra}


def count_environment(report: EnvironmentReport) -> None:
    """The task's environment is ready: counted for ``/metrics`` (a Redis that does not answer loses the count)."""
    try:
        bookkeeping.count_environment(redis_client(), report.outcome, report.duration_s)
    except redis.RedisError as exc:
        log.warning("environment not counted for /metrics", error=str(exc))


def stop_recorded(uuid: str) -> dict[str, Any] | None:
    """How the task's last holder ended it without room to finish its context, if it did (a Redis that does not
    answer: as if none did, the task resumes)."""
    try:
        return bookkeeping.stopped(redis_client(), uuid)
    except redis.RedisError as exc:
        log.warning("recorded stop not read", error=str(exc))
        return None


def requeue(uuid: str, request: dict[str, Any], countdown_s: float) -> None:
    """Send the task again under its UUID: the baton goes to the next free worker (this one is stopping, or
    the lock of a killed holder must go stale first).  A duplicate is harmless: the lock drops it.

    Not before ``countdown_s`` from now by Redis's clock: Celery would stamp a ``countdown`` with this host's clock,
    and every worker judges the stamp by its own, so a retry sent from a host minutes ahead waited minutes on a host
    that keeps time."""
    eta = CLOCK() + timedelta(seconds=countdown_s) if countdown_s > 0 else None
    send_run_task(app, uuid, request, eta=eta)
    log.info("task requeued", countdown_s=countdown_s)


@app.task(name=COMPRESS_CONTEXT, bind=True)
def compress_context(self: Task, uuid: str, start_seq: int, end_seq: int) -> dict[str, Any]:
    """Summarize messages ``start_seq..end_seq`` of a running context, incrementally over its latest summary.

    Stateless and read-only: the context's holder records the summary, so there is never a second writer.
    """
    structlog.contextvars.bind_contextvars(uuid=uuid)
    started_at, started = time.time(), time.monotonic()
    try:
        store = context_store(index=False)
        directory = store.running_path(uuid)
        span = list(takewhile(lambda r: int(r["seq"]) <= end_seq, jsonl.iter_from_id(directory / MESSAGES_FILE,
                                                                                     start_seq)))
        previous = jsonl.last_record(directory / SUMMARIES_FILE)
        config = summary_config(settings(), jsonl_metadata_config(directory))
        text, usage, sent = summarize(provider_for(config), previous["summary"] if previous else None, span,
                                      str(config.get(PROFILE_KEY) or ""))
        run_ms = int((time.monotonic() - started) * 1000)
        return {"summary": text, "start_seq": start_seq, "end_seq": end_seq, "started_at": started_at, "run_ms": run_ms,
                "usage": asdict(usage), "request": request_as_json(sent)}
    finally:
        structlog.contextvars.unbind_contextvars("uuid")


def task_ended(uuid: str, task_key: dict[str, str], status: str, request: dict[str, Any] | None = None) -> None:
    """The worker ended a task (its forge already told, with the state the worker holds): the ending event."""
    announce(Ending(uuid, task_key, status, by="worker", request=request, reported=True))


@on_ending("bookkeeping")
def _forget(ending: Ending) -> None:
    """Out of the heartbeat index, the task key free for the next trigger, counted for /metrics."""
    forget(ending.uuid, ending.task_key, ending.status)


def forget(uuid: str, task_key: dict[str, str], status: str | None = None) -> None:
    """A finished task leaves the heartbeat index, frees its task key for the next trigger and is counted for
    ``/metrics`` (once); what Redis does not take now, the monitor repairs from the context (scheduler.reconcile)."""
    unindex(uuid)
    try:
        bookkeeping.release(redis_client(), task_key, uuid, status)
    except redis.RedisError as exc:
        log.warning("active-task key not released; the monitor releases it once Redis answers", error=str(exc))


def jsonl_metadata_config(directory: Any) -> dict[str, Any]:
    """The task's recorded LLM config (so the summary uses the task's model)."""
    config: dict[str, Any] = read_json(directory / METADATA_FILE)["config"]
    return config


def summary_config(s: Settings, config: dict[str, Any]) -> dict[str, Any]:
    """The LLM config summaries of a task whose config is ``config`` are written with: ``llm.summarizer``'s profile
    when one is set (a cheaper model), else the task's own."""
    if s.llm.summarizer is None or s.llm.summarizer == config.get(PROFILE_KEY):
        return config
    return llm_config(s, s.llm.summarizer)


def summarize(
    provider: Provider, previous_summary: str | None, span: list[dict[str, Any]], profile: str = ""
) -> tuple[str, Usage, SentRequest]:
    """One stateless summarization request (the prompt never enters the task's own messages), its usage (under the
    model profile ``profile``), and the request for ``requests.jsonl`` (its step left 0: the holder numbers it)."""
    messages = summarizer_messages(previous_summary, span)
    reply = provider.chat(messages, None)
    if not reply.content or not reply.content.strip():
        raise CompressionError("the model returned an empty summary")
    sent = sent_request(provider, 0, "summary", messages, None, reply)
    return reply.content, usage_of(reply, "summary", profile=profile), sent


def compress_through_queue(ctx: Context) -> None:
    """Hand the span to ``tasuki.compress_context`` and record its summary; summarize here if no worker
    takes the job in time (a single busy worker must never wait on itself)."""
    s = settings()
    policy = s.compression.policy()
    meter = Meter(s, repo_of(ctx.metadata["task_key"]), redis_client,
                  profile=str(ctx.metadata["config"].get(PROFILE_KEY) or ""),
                  team=str((ctx.metadata.get("request") or {}).get("team") or ""))
    used: list[Usage] = []  # the summary request's usage, recorded once its summary is on disk

    def inline(previous: str | None, span: list[dict[str, Any]], waited_ms: int) -> Summarized:
        started = time.monotonic()
        config = summary_config(s, ctx.metadata["config"])
        text, usage, sent = summarize(provider_for(config), previous, span, str(config.get(PROFILE_KEY) or ""))
        used.append(usage)
        return Summarized(text, {"via": "inline", "queue_wait_ms": waited_ms, "usage": meter.figures(usage),
                                 "run_ms": int((time.monotonic() - started) * 1000)},
                          request=replace(sent, step=ctx.next_step))

    def summarizer(previous: str | None, span: list[dict[str, Any]]) -> Summarized:
        if not compressor_alive():
            log.info("no compression worker is alive; summarizing in this worker")
            return inline(previous, span, 0)
        sent = time.time()
        result = compress_context.apply_async(
            args=[ctx.uuid, span[0]["seq"], span[-1]["seq"]], queue=COMPRESSION_QUEUE
        )
        done = wait_for_summary(result, s.compression.start_timeout_s, s.compression.timeout_s)
        if done is None:
            log.info("no worker took the compression job in time; summarizing in this worker")
            return inline(previous, span, int((time.time() - sent) * 1000))
        waited = max(int((float(done.get("started_at", sent)) - sent) * 1000), 0)
        facts: dict[str, Any] = {"via": "queue", "queue_wait_ms": waited, "run_ms": int(done.get("run_ms", 0))}
        if isinstance(done.get("usage"), dict):  # a worker of an earlier version during a rolling upgrade sends none
            used.append(Usage(**done["usage"]))
            facts["usage"] = meter.figures(used[-1])
        return Summarized(str(done["summary"]), facts, request=request_from_json(done.get("request"), ctx.next_step))

    try:
        summary = ctx.compress(summarizer, policy, summary_span_budget(ctx))
    finally:  # a summary the context refused (too long, empty) was still spent
        for usage in used:
            with contextlib.suppress(TasukiError):  # a fenced holder writes nothing more
                meter.record(ctx, usage)
    if summary is not None:
        count_compression(summary)


def count_compression(summary: dict[str, Any]) -> None:
    """Add one compression to the counters ``/metrics`` exports: how it ran, its queue wait and run time."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.hincrby(STATS_KEY, f"compressions_via:{summary.get('via', 'inline')}", 1)
        pipe.hincrby(STATS_KEY, "compression_queue_wait_ms", int(summary.get("queue_wait_ms", 0)))
        pipe.hincrby(STATS_KEY, "compression_run_ms", int(summary.get("run_ms", 0)))
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("compression not counted", error=str(exc))


def compressor_alive() -> bool:
    """True while a compression worker beats in Redis (a Redis that does not answer counts as none)."""
    try:
        return compressors.alive(redis_client(), time.time()) > 0
    except redis.RedisError:
        return False


def summary_span_budget(ctx: Context) -> int:
    """Tokens of messages one summarization request may carry: the summarizer's window, less the instructions, the
    previous summary and room for the answer, in stored (uncalibrated) estimates."""
    context_length = int(summary_config(settings(), ctx.metadata["config"])["context_length"])
    previous = int(ctx.latest_summary.get("summary_tokens", 0)) if ctx.latest_summary else 0
    room = context_length - SUMMARIZER_OVERHEAD_TOKENS - previous
    return max(int(room * SPAN_SHARE / max(ctx.token_factor, 0.25)), 1)


def wait_for_summary(result: AsyncResult, start_timeout_s: float, timeout_s: float) -> dict[str, Any] | None:
    """Wait for a compression job's result; ``None`` when no worker started it within ``start_timeout_s``.

    The result backend tells the waiter the moment the job is done (Redis pub/sub), so a summary costs the
    task the summary request itself, not a polling interval; the loop only checks the two time limits.
    """
    started = time.monotonic()
    while True:
        try:
            # A compression job is not a subtask of the running task: waiting on it cannot deadlock a pool.
            value = result.get(timeout=RESULT_CHECK_S, propagate=False, disable_sync_subtasks=False)
        except CeleryTimeoutError:
            value = None
        state = result.state
        if state == "SUCCESS":
            return cast(dict[str, Any], value if value is not None else result.result)
        if state in ("FAILURE", "REVOKED"):
            raise CompressionError(f"compression job {state.lower()}: {str(result.result)[:200]}")
        waited = time.monotonic() - started
        if state == "PENDING" and waited > start_timeout_s:
            result.revoke()
            return None
        if waited > timeout_s:
            result.revoke()
            raise CompressionError(f"compression job did not finish within {timeout_s}s")
