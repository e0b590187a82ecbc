"""Spend counters in Redis (SPEC §16): per repository, per user and per team (issue 40) per UTC day, and the
fleet's totals by kind and model for ``/metrics``. One figure for every worker and the intake; the daily keys
expire on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, time, timedelta
from typing import Any

import redis

from contexts.usage import Usage
from worker.names import SPEND_PREFIX, SPEND_TOTALS_KEY

DAY_KEY_TTL_S = 3 * 24 * 3600  # a day's keys outlive the day (rebuild, usage of yesterday), then go

# Check and take one task of a user's daily cap in one step: two intakes racing never both take the last one.
_TAKE_TASK = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# The same for a team's day, whose tasks are one field of the team's hash (its cost is the other).
_TAKE_TEAM_TASK = """
local used = tonumber(redis.call('HGET', KEYS[1], 'tasks') or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'tasks', 1)
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


def day_of(now: datetime) -> str:
    """The UTC day ``now`` falls on, as the counters' keys name it."""
    return now.date().isoformat()


def resets_at(now: datetime) -> datetime:
    """When the daily budgets of ``now``'s day start again: the next UTC midnight."""
    return datetime.combine(now.date() + timedelta(days=1), time(0), tzinfo=now.tzinfo)


def repo_key(day: str, repo: str) -> str:
    """Hash of one repository's day: ``tokens`` and ``cost``."""
    return f"{SPEND_PREFIX}{day}:repo:{repo}"


def user_key(day: str, user: str) -> str:
    """Tasks one user started on ``day``."""
    return f"{SPEND_PREFIX}{day}:user:{user}"


def team_key(day: str, team: str) -> str:
    """Hash of one team's day: ``tasks`` started, ``cost`` of its tasks' model calls."""
    return f"{SPEND_PREFIX}{day}:team:{team}"


def replied_key(day: str, thread: str) -> str:
    """Set once the issue ``thread`` was told it is over budget on ``day``: one reply per issue and day."""
    return f"{SPEND_PREFIX}{day}:replied:{thread}"


def count_usage(client: redis.Redis, repo: str, usage: Usage, cost: float | None, now: datetime,
                team: str = "") -> None:
    """Add one model call to its repository's day (and its team's, when the task has one) and to the fleet's totals
    (one round trip)."""
    key = repo_key(day_of(now), repo)
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(key, "tokens", usage.tokens)
    pipe.hincrby(SPEND_TOTALS_KEY, f"tokens:{usage.kind}:{usage.model}", usage.tokens)
    if cost is not None:
        pipe.hincrbyfloat(key, "cost", cost)
        pipe.hincrbyfloat(SPEND_TOTALS_KEY, f"cost:{usage.model}", cost)
        if team:
            pipe.hincrbyfloat(team_key(day_of(now), team), "cost", cost)
            pipe.expire(team_key(day_of(now), team), DAY_KEY_TTL_S)
    pipe.expire(key, DAY_KEY_TTL_S)
    pipe.execute()


def repo_spent(client: redis.Redis, repo: str, now: datetime) -> tuple[int, float]:
    """Tokens and USD of ``repo``'s tasks so far today."""
    values = client.hmget(repo_key(day_of(now), repo), ["tokens", "cost"])
    return int(values[0] or 0), float(values[1] or 0.0)


def take_user_task(client: redis.Redis, user: str, cap: int, now: datetime) -> bool:
    """Count one more task of ``user`` today unless the cap is reached; atomic across intake processes."""
    return bool(client.eval(_TAKE_TASK, 1, user_key(day_of(now), user), cap, DAY_KEY_TTL_S))


def user_tasks_today(client: redis.Redis, user: str, now: datetime) -> int:
    """Tasks ``user`` started so far today."""
    return int(client.get(user_key(day_of(now), user)) or 0)


def team_spent(client: redis.Redis, team: str, now: datetime) -> tuple[int, float]:
    """Tasks started and USD spent by ``team`` so far today."""
    values = client.hmget(team_key(day_of(now), team), ["tasks", "cost"])
    return int(values[0] or 0), float(values[1] or 0.0)


def team_cost(client: redis.Redis, team: str, now: datetime) -> float:
    """USD of ``team``'s tasks so far today."""
    return float(client.hget(team_key(day_of(now), team), "cost") or 0.0)


def take_team_task(client: redis.Redis, team: str, cap: int, now: datetime) -> bool:
    """Count one more task of ``team`` today unless its cap is reached; atomic across intake processes."""
    return bool(client.eval(_TAKE_TEAM_TASK, 1, team_key(day_of(now), team), cap, DAY_KEY_TTL_S))


def give_back_team_task(client: redis.Redis, team: str, now: datetime) -> None:
    """Undo :func:`take_team_task` for a trigger that started nothing."""
    client.hincrby(team_key(day_of(now), team), "tasks", -1)


def give_back_user_task(client: redis.Redis, user: str, now: datetime) -> None:
    """Undo :func:`take_user_task` for a trigger that started nothing (its task was already active)."""
    client.decr(user_key(day_of(now), user))


def first_reply(client: redis.Redis, thread: str, now: datetime) -> bool:
    """True for the first over-budget trigger of an issue today (the one that gets a reply)."""
    return bool(client.set(replied_key(day_of(now), thread), "1", nx=True, ex=DAY_KEY_TTL_S))


def fleet_totals(raw: Mapping[Any, Any]) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
    """Tokens by (kind, model) and USD by model since the counters began, from the ``SPEND_TOTALS_KEY`` hash."""
    tokens: dict[tuple[str, str], int] = {}
    costs: dict[str, float] = {}
    for raw_field, raw_value in raw.items():
        field = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
        name, _, rest = field.partition(":")
        if name == "tokens":
            kind, _, model = rest.partition(":")
            tokens[(kind, model)] = int(raw_value)
        elif name == "cost":
            costs[rest] = float(raw_value)
    return tokens, costs


def rebuild_day(
    client: redis.Redis, day: str, repos: Mapping[str, tuple[int, float]], users: Mapping[str, int]
) -> None:
    """Replace the counters of ``day`` with figures recounted from the contexts (after a Redis loss)."""
    pipe = client.pipeline(transaction=True)
    for repo, (tokens, cost) in repos.items():
        key = repo_key(day, repo)
        pipe.delete(key)
        pipe.hset(key, mapping={"tokens": tokens, "cost": cost})
        pipe.expire(key, DAY_KEY_TTL_S)
    for user, tasks in users.items():
        pipe.set(user_key(day, user), tasks, ex=DAY_KEY_TTL_S)
    pipe.execute()

