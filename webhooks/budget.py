"""The intake's side of the daily budgets (SPEC §16): a repository, a user or a team (issue 40) over its cap starts
nothing; the issue hears it once a day, with the time the budget resets."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import redis

from contexts.usage import repo_of
from worker.settings_models import LimitSettings
from worker.spend import (
    first_reply,
    give_back_team_task,
    give_back_user_task,
    repo_spent,
    resets_at,
    take_team_task,
    take_user_task,
    team_cost,
)
from worker.submit import task_key_id


def over_budget(
    limits: LimitSettings, client: redis.Redis, task_key: Mapping[str, Any], user: str, now: datetime,
    team: str = "",
) -> str | None:
    """Why a trigger must start nothing (the figures against the cap), or ``None``; a trigger let through has
    taken one of its user's and its team's tasks of the day (give them back with :func:`not_started` if nothing
    starts); an empty ``user`` (a CI run) is held to the repository's caps only, an empty ``team`` (a forge
    trigger, a person in no team) to no team's."""
    if not limits.per_day:
        return None
    repo = repo_of(task_key)
    if limits.repo_tokens is not None or limits.repo_cost is not None:
        tokens, cost = repo_spent(client, repo, now)
        if limits.repo_tokens is not None and tokens >= limits.repo_tokens:
            return f"{repo} used {tokens} tokens today; limits.repo_tokens is {limits.repo_tokens}"
        if limits.repo_cost is not None and cost >= limits.repo_cost:
            return f"{repo} cost ${cost:.4f} today; limits.repo_cost is ${limits.repo_cost:.4f}"
    if team and limits.team_cost is not None and (spent := team_cost(client, team, now)) >= limits.team_cost:
        return f"team {team} cost ${spent:.4f} today; limits.team_cost is ${limits.team_cost:.4f}"
    if limits.user_tasks is not None and user and not take_user_task(client, user, limits.user_tasks, now):
        return f"{user} started {limits.user_tasks} tasks today; limits.user_tasks is {limits.user_tasks}"
    return _over_team_tasks(limits, client, user, team, now)


def _over_team_tasks(limits: LimitSettings, client: redis.Redis, user: str, team: str, now: datetime) -> str | None:
    """Take one of the team's tasks of the day, or say why not (then the user's task just taken is given back)."""
    if limits.team_tasks is None or not team or take_team_task(client, team, limits.team_tasks, now):
        return None
    if limits.user_tasks is not None and user:
        give_back_user_task(client, user, now)
    return f"team {team} started {limits.team_tasks} tasks today; limits.team_tasks is {limits.team_tasks}"


def not_started(limits: LimitSettings, client: redis.Redis, user: str, now: datetime, team: str = "") -> None:
    """A trigger let through started no task (one was already active): its user's and team's tasks are given
    back."""
    if limits.user_tasks is not None and user:
        give_back_user_task(client, user, now)
    if limits.team_tasks is not None and team:
        give_back_team_task(client, team, now)


def reply_text(why: str, now: datetime) -> str:
    """The comment the issue gets for its first over-budget trigger of the day."""
    reset = resets_at(now).strftime("%Y-%m-%d %H:%M UTC")
    return f"Tasuki did not start this task: the daily budget is used up ({why}). It resets at {reset}."


def should_reply(client: redis.Redis, task_key: Mapping[str, Any], now: datetime) -> bool:
    """True for the first over-budget trigger of this issue today: one reply per issue and day."""
    return first_reply(client, task_key_id(dict(task_key)), now)
