"""What the beat runs and the ``tasuki reap / retention`` commands call: one function each, plus its printout.

The Celery tasks (:mod:`scheduler.tasks`) and the command line share these, so ``tasuki reap`` takes exactly
the actions the beat would (SPEC §10).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from functools import partial

import redis
import structlog

from contexts.clock import iso, utc_now
from contexts.retention import RetentionAction, apply_retention
from scheduler.monitor import Monitor, Outcome
from scheduler.plan import Policy
from scheduler.reconcile import Reconciled, reconcile
from worker.remembering import prune_memory
from worker.runtime import CLOCK, context_store, redis_client, settings
from worker.settings_models import Settings
from worker.submit import send_run_task

log = structlog.get_logger(__name__)



def monitor_for(s: Settings) -> Monitor:
    """A monitor on the configured store and Redis; it re-enqueues through the Celery app."""
    from worker.celery import app
    from worker.endings import Ending, announce

    def ended(uuid: str, task_key: dict[str, str], status: str) -> None:
        announce(Ending(uuid, task_key, status, by="monitor"))

    # No heartbeat hook: a monitor that takes a lock to fail a task must not put it back in the index.
    store = context_store(s, index=False)
    policy = Policy(
        stale_after_s=s.contexts.stale_after_s,
        max_attempts=s.monitor.max_attempts,
        resume=s.monitor.resume,
        hostname=store.hostname,
        hung_after_s=s.contexts.hung_after,
    )
    # A delivery not taken up within one stale_after_s (dropped, lost, never consumed) is sent again.
    dedupe_s = max(s.contexts.stale_after_s, s.monitor.interval_s)
    send = partial(send_run_task, app)
    # A task the monitor ends is one ending like any other (worker.endings): its key freed, counted, its episode
    # recorded, and its forge told, as no worker will. The subscribers live in modules the app includes.
    import worker.forges.reporter
    import worker.tasks  # noqa: F401 - registers the bookkeeping and memory subscribers

    return Monitor(store, redis_client(), policy, send=send, ended=ended, dedupe_s=dedupe_s)


def reap(dry_run: bool = False, *, deep: bool = True) -> list[Outcome]:
    """``tasuki reap``: resume or fail lost tasks and repair interrupted completions.

    ``deep`` (the command's default) also reads every completed context; the beat's frequent run does not.
    """
    s = settings()
    monitor = monitor_for(s)
    now = redis_now(monitor.client)
    outcomes = monitor.run(now, dry_run=dry_run, deep=deep)
    if not dry_run:
        reconcile_redis(monitor, s, now)
    return outcomes


def reconcile_redis(monitor: Monitor, s: Settings, now: datetime) -> list[Reconciled]:
    """Repair the Redis bookkeeping finished tasks' workers could not do (scheduler.reconcile); never fatal to the
    pass (Redis may still not answer: the next pass tries again)."""
    from worker.celery import app

    try:
        return reconcile(monitor.store, monitor.client, app.backend, now, s.contexts.stale_after_s)
    except redis.RedisError as exc:
        log.warning("monitor: Redis bookkeeping not reconciled", error=str(exc))
        return []


def redis_now(client: redis.Redis) -> datetime:
    """Now by Redis's clock (SPEC §4: one clock decides staleness); this host's own if Redis does not answer, so
    that repairs which need no Redis still run."""
    try:
        CLOCK.measure(client)
    except redis.RedisError as exc:
        # Quiet: whatever needs Redis next says it does not answer, once (`tasuki reap` in one line, SPEC §10).
        log.debug("clock offset to Redis not measured; the last one is used", error=str(exc)[:200])
    return CLOCK()


def summarize_outcomes(outcomes: list[Outcome]) -> dict[str, int]:
    """Counts of what was done, by action (``resume``, ``fail``, each repair), for a task's result."""
    done = Counter(o.action.repair or o.action.kind for o in outcomes if o.done)
    return dict(sorted(done.items()))


def format_reap(outcomes: list[Outcome], *, dry_run: bool = False) -> list[str]:
    """One line per action: ``UUID  ACTION  [not done: why]  reason``."""
    if not outcomes:
        return ["nothing to do"]
    lines = []
    for o in outcomes:
        name = o.action.repair or o.action.kind
        if dry_run:
            status = "would " + name if o.done else name
        else:
            status = name if o.done else f"{name} not done ({o.detail})"
        detail = f" -> {o.detail}" if o.done and not dry_run else ""
        lines.append(f"{o.action.uuid}  {status}: {o.action.reason}{detail}")
    return lines


def retention(dry_run: bool = False) -> list[RetentionAction]:
    """``tasuki retention``: gzip and delete old completed contexts (a full repair pass goes first), in fleet mode
    forget old finished contexts of every host from the fleet's store, and prune memory's episodes older than
    memory.prune_after_days."""
    s = settings()
    now = utc_now()
    if not dry_run:
        # The daily deep pass repairs interrupted completions that the heartbeat index no longer lists.
        monitor_for(s).run(now, deep=True)
    policy = s.contexts.retention
    actions = apply_retention(
        context_store(s, index=False), now, policy.gzip_after_days, policy.delete_after_days, dry_run=dry_run
    )
    for action in actions:
        log.info("retention " + action.action, uuid=action.uuid, completed_at=iso(action.completed_at), dry_run=dry_run)
    pruned = prune_memory(s, now, dry_run=dry_run)
    log.info("retention pruned memory", episodes=len(pruned), dry_run=dry_run)
    return actions


def format_retention(actions: list[RetentionAction], *, dry_run: bool = False) -> list[str]:
    """One line per context: ``UUID  gzip|delete|forget  (completed AT)``; forget: the fleet's durable copy and
    index row of a context whose directory is on another host."""
    if not actions:
        return ["nothing to do"]
    verb = "would " if dry_run else ""
    where = {"forget": "; its directory is not on this host"}
    return [f"{a.uuid}  {verb}{a.action}  (completed {iso(a.completed_at)}{where.get(a.action, '')})" for a in actions]
