"""Who calls the task API (issue 40): a person's API token names them and their role; a route refuses a caller
without a live token (401) or with too low a role (403). The legacy shared ``TASUKI_API_TOKEN`` is accepted only
while ``auth.break_glass`` is on, as the ``break-glass`` admin."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from contexts.api_tokens import PREFIX as TOKEN_PREFIX
from contexts.clock import utc_now
from webhooks.intake import Blocking
from worker.api_tokens import BREAK_GLASS, Caller, caller_of, token_store
from worker.audit import record_audit
from worker.roles import Role
from worker.settings_models import Settings
from worker.submit import Enqueued


class ApiAuth:
    """The API's check of bearers and roles, and its audit events (source ``api``)."""

    def __init__(self, settings: Settings, blocking: Blocking) -> None:
        self.settings = settings
        self.blocking = blocking
        secret = settings.secrets.tasuki_api_token
        self.legacy = secret.get_secret_value().encode() if secret and settings.auth.break_glass else None

    def identify(self, given: str) -> Caller | None:
        """The caller a bearer stands for: a live personal token's owner, or break-glass; None: nobody."""
        if given.startswith(TOKEN_PREFIX):
            token = token_store(self.settings).lookup(given, utc_now())
            return caller_of(self.settings, token) if token is not None else None
        if self.legacy and hmac.compare_digest(given.encode("utf-8", "replace"), self.legacy):
            return BREAK_GLASS
        return None

    async def allowed(self, request: Request, needed: Role) -> Caller | JSONResponse:
        """The caller, or the refusal: 401 without a live token, 403 when its role is below ``needed``."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        given = given.strip()
        caller = await self.blocking(self.identify, given) if scheme.lower() == "bearer" and given else None
        if caller is None:
            return JSONResponse({"detail": "bad, expired, revoked or missing bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        if caller.role < needed:
            return JSONResponse({"detail": f"this token's role is {caller.role.label}; this needs {needed.label}"},
                                status_code=403)
        return caller

    async def audit(self, caller: Caller, action: str, target: str, outcome: str = "ok", reason: str = "",
                    detail: dict[str, Any] | None = None) -> None:
        """One audit event of this caller (on a worker thread: the log is a file or PostgreSQL)."""
        await self.blocking(self._record, caller, action, target, outcome, reason, detail)

    async def submitted(self, caller: Caller, body_user: str | None, task: dict[str, Any],
                        enqueued: Enqueued | str) -> None:
        """The audit event of a submission: queued (its UUID), or refused (why). A body's ``user`` that a personal
        token overrode is kept in the event: who tried to speak for whom."""
        detail = {"task_key": task["task_key"], "user": task.get("user"), "team": task.get("team")}
        if caller is not BREAK_GLASS and body_user not in (None, caller.user):
            detail["body_user_ignored"] = body_user
        if isinstance(enqueued, str):
            await self.audit(caller, "task.submit", "", "refused", enqueued, detail)
        else:
            await self.audit(caller, "task.submit", enqueued.uuid, detail=detail)

    def _record(self, caller: Caller, action: str, target: str, outcome: str, reason: str,
                detail: dict[str, Any] | None) -> None:
        record_audit(self.settings, actor=caller.actor, action=action, target=target, outcome=outcome,
                     reason=reason, source="api", detail=detail)
