"""The Redis bookkeeping of a task's end (SPEC §5, §7, §14), every write idempotent: the worker does it as the task
ends, and the monitor (:mod:`scheduler.reconcile`) does it again, from the context files, for whatever Redis could
not take then (a cut over the finish). Doing it twice changes nothing; a task's finish is counted once.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from contexts.names import ACTIVE_STATUSES
from worker.names import (
    ACTIVE_PREFIX,
    COUNTED_PREFIX,
    HEARTBEATS_KEY,
    RUNNING_STATUS_PREFIX,
    STATS_KEY,
    STOPPED_PREFIX,
)
from worker.threads import key_id

COUNTED_TTL_S = 8 * 24 * 3600  # longer than any Redis outage the monitor repairs after

# KEYS: active key, stats hash, counted key, stopped key. ARGV: uuid, final status ('' counts nothing), ttl of the
# counted key. The active key goes only if it still names this task (a later trigger's task keeps its own); the
# finish is counted once per task, whoever (worker or monitor) gets here first; a stop recorded for it is done with.
RELEASE_LUA = """
redis.call('DEL', KEYS[4])
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
if ARGV[2] ~= '' and redis.call('SET', KEYS[3], ARGV[2], 'NX', 'EX', ARGV[3]) then
  redis.call('HINCRBY', KEYS[2], 'finished:' .. ARGV[2], 1)
end
return released
"""


# /metrics' histogram of environment setups (SPEC §17), in seconds; STATS_KEY fields environment_seconds:{outcome}:{le}
ENVIRONMENT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, float("inf"))
ENVIRONMENT_OUTCOMES = {"built": "builds", "restored": "restores", "reused": "reuses", "failed": "failures"}


def count_environment(client: redis.Redis, outcome: str, duration_s: float) -> None:
    """Count one task's environment (built, restored, reused or failed; kept and none are not counted) and its
    duration."""
    if outcome not in ENVIRONMENT_OUTCOMES:
        return
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(STATS_KEY, f"environments:{outcome}", 1)
    pipe.hincrby(STATS_KEY, f"environment_ms:{outcome}", int(duration_s * 1000))
    for bound in ENVIRONMENT_BUCKETS:
        if duration_s <= bound:
            pipe.hincrby(STATS_KEY, f"environment_seconds:{outcome}:{bound}", 1)
    pipe.execute()


def unindex(client: redis.Redis, uuid: str) -> None:
    """Out of the heartbeat index and every running-status set (``/metrics`` counts those)."""
    pipe = client.pipeline(transaction=True)
    pipe.zrem(HEARTBEATS_KEY, uuid)
    for status in ACTIVE_STATUSES:
        pipe.zrem(RUNNING_STATUS_PREFIX + status, uuid)
    pipe.execute()


def release(client: redis.Redis, task_key: dict[str, str], uuid: str, status: str | None = None) -> bool:
    """Free the task key if it is still this task's, and count the finish (``status``) once; True when the key was
    this task's (no later task of the key can have been admitted while it was held)."""
    keys = [ACTIVE_PREFIX + key_id(task_key), STATS_KEY, COUNTED_PREFIX + uuid, STOPPED_PREFIX + uuid]
    released = client.register_script(RELEASE_LUA)(keys=keys, args=[uuid, status or "", COUNTED_TTL_S])
    return bool(released)


def record_stop(client: redis.Redis, uuid: str, outcome: dict[str, Any]) -> None:
    """A worker ended the task but could not finish its context (a full disk): how it ended (``status``,
    ``error``, ``result``), for whoever waits on it and for the next holder, which finishes it so."""
    client.set(STOPPED_PREFIX + uuid, json.dumps(outcome), ex=COUNTED_TTL_S)


def stopped(client: redis.Redis, uuid: str) -> dict[str, Any] | None:
    """How a worker ended the task whose context it could not finish, if one did (and it is not finished yet)."""
    raw = client.get(STOPPED_PREFIX + uuid)
    try:
        outcome = json.loads(raw) if raw else None
    except ValueError:
        return None
    return outcome if isinstance(outcome, dict) and isinstance(outcome.get("status"), str) else None
