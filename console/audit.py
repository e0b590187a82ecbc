"""The console's audit page (issue 40): the audit log's newest events, filtered by actor, action and time, read-only.

It shows what ``tasuki audit`` prints, from the same backend (the file beside the contexts or the fleet's
PostgreSQL), and says whether the hash chain is intact only when asked (``?verify=1``): verifying reads every line.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from console.sessions import Session
from contexts.audit import AuditQuery, Problem
from worker.audit import audit_log
from worker.roles import Role

if TYPE_CHECKING:
    from console.app import Console

NEEDED_ROLE = Role.ADMIN
"""The role ``/audit`` needs (issue 40: the admin's): the route's guard reads it."""
PAGE_SIZE = 200
SINCE_CHOICES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
                 "30d": timedelta(days=30)}


def query_of(params: Any, now: datetime) -> tuple[AuditQuery, dict[str, str]]:
    """The query for the page's filters, and the filters as given (to refill the form); unknown values ignored."""
    actor = (params.get("actor") or "").strip() or None
    action = (params.get("action") or "").strip() or None
    since = params.get("since") or ""
    window = SINCE_CHOICES.get(since)
    filters = {"actor": actor or "", "action": action or "", "since": since if window else ""}
    return AuditQuery(since=now - window if window else None, actor=actor, action=action, limit=PAGE_SIZE), filters


class AuditPage:
    """The handler of ``/audit``; it runs behind ``guarded(..., needs=NEEDED_ROLE)``."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def _read(self, query: AuditQuery, verify: bool) -> tuple[list[dict[str, Any]], list[Problem] | None]:
        backend = audit_log(self.console.settings)
        events = list(backend.select(query))
        events.reverse()  # newest first on the page, as the task list is
        return events, backend.verify() if verify else None

    async def list(self, request: Request, session: Session) -> Response:
        query, filters = query_of(request.query_params, datetime.fromtimestamp(self.console.clock(), UTC))
        verify = request.query_params.get("verify") == "1"
        events, problems = await run_in_threadpool(self._read, query, verify)
        return self.console.page(request, "audit.html", {
            "session": session, "events": events, "filters": filters, "since_choices": list(SINCE_CHOICES),
            "limit": PAGE_SIZE, "problems": problems, "verify_query": urlencode({**filters, "verify": "1"})})
