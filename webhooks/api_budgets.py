"""The task API's budget routes (issue 40): a caller's own day — their tasks and their team's against the caps —
for any token (viewer), and every team's day for an admin. Budgets are read here, never changed: they are
configuration (``limits``), changed where the configuration is."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import redis
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from contexts.clock import utc_now
from webhooks.api_auth import ApiAuth
from webhooks.intake import Blocking
from worker.roles import Role
from worker.settings_models import Settings
from worker.spend import day_of, resets_at, team_spent, user_tasks_today


def team_day(settings: Settings, client: redis.Redis, team: str, now: datetime) -> dict[str, Any]:
    """One team's day against its caps."""
    tasks, cost = team_spent(client, team, now)
    return {"name": team, "tasks": tasks, "tasks_cap": settings.limits.team_tasks, "cost": round(cost, 6),
            "cost_cap": settings.limits.team_cost}


def budget_routes(settings: Settings, client: redis.Redis, blocking: Blocking, auth: ApiAuth) -> APIRouter:
    """``GET /budget`` (viewer: the caller's own day) and ``GET /budgets`` (admin: every team's)."""
    router = APIRouter()

    def day(now: datetime) -> dict[str, Any]:
        return {"day": day_of(now), "resets_at": resets_at(now).isoformat()}

    @router.get("/budget")
    async def own(request: Request) -> Response:
        caller = await auth.allowed(request, Role.VIEWER)
        if isinstance(caller, JSONResponse):
            return caller
        now = utc_now()

        def read() -> dict[str, Any]:
            user = {"name": caller.user, "tasks": user_tasks_today(client, caller.user, now),
                    "tasks_cap": settings.limits.user_tasks}
            team = team_day(settings, client, caller.team, now) if caller.team else None
            return {**day(now), "user": user, "team": team}

        return JSONResponse(await blocking(read))

    @router.get("/budgets")
    async def every(request: Request) -> Response:
        caller = await auth.allowed(request, Role.ADMIN)
        if isinstance(caller, JSONResponse):
            return caller
        now = utc_now()

        def read() -> dict[str, Any]:
            caps = settings.limits.model_dump(include={"repo_tokens", "repo_cost", "user_tasks", "team_tasks",
                                                       "team_cost"})
            return {**day(now), "limits": caps,
                    "teams": [team_day(settings, client, team, now) for team in settings.auth.teams]}

        return JSONResponse(await blocking(read))

    return router
