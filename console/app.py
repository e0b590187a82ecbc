"""The console's ASGI application (SPEC §15): sign-in, the fleet, tasks and task pages, a running task's event
stream, and Cancel. Mounted under ``/console/`` by the intake's app, or served alone by ``tasuki console``.

Every page and stream needs a session, and every action its role (issue 40: viewing needs viewer, cancelling
operator, the admin pages admin); people sign in through the OpenID Connect provider (console/oidc.py), the shared
token only when ``auth.break_glass``. Everything shown is escaped by Jinja2's autoescape and comes from the
masked context files. The pages load their scripts and styles from ``/console/static/`` only (the CSP).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import redis
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from console import views
from console.audit import NEEDED_ROLE as AUDIT_ROLE
from console.audit import AuditPage
from console.evals import read_run, read_runs
from console.fleet import RecentEndings, read_fleet
from console.live import POLL_S, Seen, follow
from console.oidc import SIGNIN_COOKIE, SIGNIN_MAX_AGE_S, OIDCSignIn, SignInRefused
from console.outcomes import OutcomesReader
from console.sessions import (
    BREAK_GLASS,
    COOKIE,
    Session,
    Sessions,
    SignInLimiter,
    csrf_matches,
    session_key,
    token_matches,
)
from console.tasklist import Filters, read_page
from console.tokens import TokenPages
from contexts.errors import ContextNotFoundError, InvalidUUIDError, TasukiError
from contexts.store import ContextStore
from evals.rundir import EvalError
from worker.audit import record_audit
from worker.roles import Role
from worker.settings_models import Settings

HERE = Path(__file__).parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
Canceller = Callable[[str], str]
NOT_CONFIGURED = ("Sign-in is not configured: set auth.oidc.issuer and auth.oidc.client_id for your OpenID Connect "
                  "provider, or auth.break_glass: true with console.token.")


class SecurityHeaders:
    """Every answer of the console — pages, streams, refusals and the vendored static files — carries the
    security headers (static files may be cached: they change only with the package)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith(f"{scope.get('root_path', '')}/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if not (static and name == "Cache-Control"):
                        headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def templates() -> Jinja2Templates:
    """The page templates; autoescape on for every one of them (they are all HTML)."""
    env = Jinja2Templates(directory=str(HERE / "templates"))
    env.env.autoescape = True
    env.env.filters.update(views.FILTERS)
    return env


class Console:
    """The console's handlers over one store (its index too) and one optional Redis client."""

    def __init__(self, settings: Settings, store: ContextStore, client: redis.Redis | None,
                 cancel: Canceller | None, workers: Callable[[], int | None], clock: Callable[[], float]) -> None:
        self.settings = settings
        self.store = store
        self.client = client
        self.cancel_task = cancel
        self.workers = workers
        self.clock = clock
        self.token = settings.console_token() if settings.auth.break_glass else None
        secret = settings.secrets.tasuki_console_session_secret
        self.key = session_key(secret.get_secret_value() if secret else None, self.token)
        self.sessions = Sessions(self.key, settings.console.session_lifetime_s, clock, break_glass=self.token)
        self.oidc = OIDCSignIn(settings) if settings.auth.oidc.configured else None
        self.https = (settings.console.public_url or "").startswith("https://")
        self.limiter = SignInLimiter(settings.console.signin_attempts_per_minute)
        self.templates = templates()
        self.endings = RecentEndings()
        self.outcomes = OutcomesReader(settings)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    # -- pages ------------------------------------------------------------------------------------

    def page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        base = {"prefix": request.scope.get("root_path", ""), "now": self.now(), "Role": Role}
        return self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)

    def session(self, request: Request) -> Session | None:
        return self.sessions.read(request.cookies.get(COOKIE))

    async def audit(self, actor: str, action: str, *, outcome: str = "ok", reason: str = "",
                    detail: dict[str, Any] | None = None) -> None:
        """One audit event of the console's (record_audit never raises; it may touch the disk: off the loop)."""
        await run_in_threadpool(lambda: record_audit(self.settings, actor=actor, action=action, target="console",
                                                     outcome=outcome, reason=reason, source="console",
                                                     detail=detail))

    def signin_page(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        configured = self.oidc is not None or self.token is not None
        return self.page(request, "signin.html", {
            "error": error, "oidc": self.oidc is not None, "break_glass": self.token is not None,
            "unconfigured": None if configured else NOT_CONFIGURED}, status=status)

    def signed_in(self, request: Request, cookie: str) -> Response:
        """The redirect to the fleet that sets the session cookie (HttpOnly, SameSite=Lax, Secure behind HTTPS)."""
        prefix = request.scope.get("root_path", "")
        response = RedirectResponse(f"{prefix}/", status_code=303)
        # Lax, not Strict: the provider's redirect back is a top-level navigation from another site.
        response.set_cookie(COOKIE, cookie, max_age=self.sessions.lifetime_s, path=f"{prefix}/", httponly=True,
                            samesite="lax", secure=self.https or request.url.scheme == "https")
        return response

    def limited(self, request: Request) -> Response | None:
        """A 429 page when this client tried to sign in too often in the last minute."""
        client = request.client.host if request.client else "?"
        if self.limiter.allow(client, self.clock()):
            return None
        response = self.signin_page(request, "Too many attempts; wait a minute.", status=429)
        response.headers["Retry-After"] = "60"
        return response

    async def signin_form(self, request: Request) -> Response:
        return self.signin_page(request)

    async def signin(self, request: Request) -> Response:
        """The shared token's sign-in: only with ``auth.break_glass`` (as "break-glass", with the admin role)."""
        if self.token is None:
            return PlainTextResponse(NOT_CONFIGURED if self.oidc is None else
                                     "The shared console token is off (auth.break_glass: false); sign in through "
                                     "the provider.", status_code=403)
        refused = self.limited(request)
        if refused is not None:
            return refused
        form = await request.form()
        given = form.get("token")
        if not isinstance(given, str) or not token_matches(given, self.token):
            await self.audit(BREAK_GLASS, "signin.refused", outcome="refused", reason="not the console token")
            return self.signin_page(request, "That is not the console token.", status=401)
        await self.audit(BREAK_GLASS, "signin", detail={"role": Role.ADMIN.label, "method": "break-glass token"})
        return self.signed_in(request, self.sessions.new()[1])

    async def oidc_start(self, request: Request) -> Response:
        if self.oidc is None:
            return PlainTextResponse(NOT_CONFIGURED, status_code=404)
        refused = self.limited(request)
        if refused is not None:
            return refused
        redirect_uri = str(request.url_for("oidc_callback"))
        if self.settings.console.public_url:  # behind a proxy: the address the provider has registered
            redirect_uri = f"{self.settings.console.public_url.rstrip('/')}/oidc/callback"
        try:
            return await self.oidc.start(request, redirect_uri)
        except SignInRefused as exc:
            return self.signin_page(request, str(exc), status=502)

    async def oidc_callback(self, request: Request) -> Response:
        if self.oidc is None:
            return PlainTextResponse(NOT_CONFIGURED, status_code=404)
        try:
            person = await self.oidc.finish(request)
        except SignInRefused as exc:
            await self.audit(exc.actor, "signin.refused", outcome="refused", reason=exc.reason)
            return self.signin_page(request, f"Sign-in refused: {exc.reason}.", status=403)
        if person.role is None:
            reason = "not in an admitted group or e-mail domain"
            await self.audit(person.actor, "signin.refused", outcome="refused", reason=reason,
                             detail={"groups": list(person.groups)})
            return self.signin_page(request, f"Sign-in refused: {person.name} is {reason}.", status=403)
        await self.audit(person.actor, "signin", detail={"role": person.role.label, "groups": list(person.groups)})
        _, cookie = self.sessions.new(person.actor, person.role, person.name, person.groups)
        return self.signed_in(request, cookie)

    async def signout(self, request: Request) -> Response:
        session = self.session(request)
        if session is not None:
            await self.audit(session.actor, "signout")
        prefix = request.scope.get("root_path", "")
        response = RedirectResponse(f"{prefix}/signin", status_code=303)
        response.delete_cookie(COOKIE, path=f"{prefix}/", httponly=True, samesite="lax")
        return response

    async def fleet(self, request: Request, session: Session) -> Response:
        fleet = await run_in_threadpool(read_fleet, self.store, self.store.index, self.client, self.now(),
                                        self.workers, self.endings)
        if request.url.path.endswith("/fleet/live"):
            return self.page(request, "fleet_live.html", {"fleet": fleet, "session": session})
        outcomes = await run_in_threadpool(self.outcomes, self.now())  # the whole page only: weekly figures
        return self.page(request, "fleet.html", {"fleet": fleet, "session": session, "outcomes": outcomes})

    async def tasks(self, request: Request, session: Session) -> Response:
        query = request.query_params
        filters = Filters(**{name: (query.get(name) or "").strip() or None
                             for name in ("status", "repository", "user", "uuid_prefix")})
        try:
            number = int(query.get("page") or 1)
        except ValueError:
            number = 1
        page = await run_in_threadpool(read_page, self.store.index, filters, number)
        kept = {k: v for k, v in filters.as_kwargs().items() if v}
        return self.page(request, "tasks.html", {
            "page": page, "filters": filters, "session": session, "statuses": views.STATUSES,
            "query": lambda n: urlencode({**kept, "page": n}),
        })

    async def task(self, request: Request, session: Session) -> Response:
        uuid = request.path_params["uuid"]
        view = await run_in_threadpool(views.task_view, self.settings, self.store, uuid)
        return self.page(request, "task.html", {"view": view, "session": session})

    async def evals(self, request: Request, session: Session) -> Response:
        runs = await run_in_threadpool(read_runs, self.settings.local.var_dir)
        return self.page(request, "evals.html", {"runs": runs, "session": session})

    async def eval_run(self, request: Request, session: Session) -> Response:
        try:
            report = await run_in_threadpool(read_run, self.settings.local.var_dir, request.path_params["run"])
        except EvalError as exc:  # no such run, or a name that is none
            return self.page(request, "error.html", {"message": str(exc), "session": session}, status=404)
        return self.page(request, "eval.html", {"report": report, "session": session})

    async def events(self, request: Request, session: Session) -> Response:
        uuid = request.path_params["uuid"]
        self.store.locate_inside(uuid)
        try:
            seen = Seen(int(request.query_params.get("after", 0)), int(request.query_params.get("summaries", 0)))
            last_id = request.headers.get("last-event-id")
            if last_id:  # a reconnect: go on from what the browser already has
                messages, summaries = (int(part) for part in last_id.split(".", 1))
                seen = Seen(messages, summaries)
        except ValueError:
            return PlainTextResponse("bad position", status_code=400)
        return EventSourceResponse(self._stream(request, uuid, seen), ping=15)

    async def _stream(self, request: Request, uuid: str, seen: Seen) -> AsyncIterator[dict[str, str]]:
        tally = await run_in_threadpool(views.tally_until, self.store, uuid, seen)
        polls = follow(self.store, uuid, seen)
        while True:
            step = await run_in_threadpool(next, polls, None)
            if step is None:
                return
            seen, found = step
            if found is not None:
                position = f"{seen.messages}.{seen.summaries}"
                if found.messages or found.summaries:
                    html = self.templates.get_template("timeline_entries.html").render(
                        entries=views.news_entries(found), prefix=request.scope.get("root_path", ""))
                    yield {"event": "step", "data": html, "id": position}
                tally.add_summaries(found.summaries)
                points = tally.add_messages(found.messages)
                if points:  # the chart's new model calls (JSON the page's script reads, never markup)
                    yield {"event": "chart", "data": json.dumps({"prompt_tokens": points}), "id": position}
                if found.ended:
                    yield {"event": "ended", "data": f"The task ended: {found.status}.", "id": position}
                    return
            await asyncio.sleep(POLL_S)

    async def cancel(self, request: Request, session: Session) -> Response:
        uuid = request.path_params["uuid"]
        form = await request.form()
        token = form.get("csrf")
        if not csrf_matches(session, token if isinstance(token, str) else None):
            return PlainTextResponse("CSRF token missing or wrong", status_code=403)
        self.store.locate_inside(uuid)
        if self.cancel_task is None:
            return PlainTextResponse("no broker: cancelling needs Redis", status_code=503)
        answer = await run_in_threadpool(self.cancel_task, uuid)
        await run_in_threadpool(lambda: record_audit(self.settings, actor=session.actor, action="task.cancel",
                                                     target=uuid, source="console", detail={"answer": answer}))
        prefix = request.scope.get("root_path", "")
        return RedirectResponse(f"{prefix}/tasks/{uuid}", status_code=303)


Handler = Callable[[Request, Session], Awaitable[Response]]


def refusal(console: Console, request: Request, session: Session, needs: Role, *, page: bool) -> Response:
    """403 with one line: what the action needs and what the person holds (a page as the error page)."""
    reason = f"Refused: this needs the {needs.label} role; {session.name or session.actor} is {session.role.label}."
    if page:
        return console.page(request, "error.html", {"message": reason, "session": session}, status=403)
    return PlainTextResponse(reason, status_code=403)


def guarded(console: Console, handler: Handler, *, page: bool,
            needs: Role = Role.VIEWER) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` for signed-in browsers whose role allows ``needs`` only: a page sends others to the sign-in
    page, a stream, fragment or form answers 401; a role too low answers 403 with one line. A UUID that is not a
    context's is a 404 page, never a traceback."""

    async def endpoint(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            if page:
                return RedirectResponse(f"{request.scope.get('root_path', '')}/signin", status_code=303)
            return PlainTextResponse("sign in first", status_code=401)
        if not session.may(needs):
            return refusal(console, request, session, needs, page=page)
        try:
            return await handler(request, session)
        except (ContextNotFoundError, InvalidUUIDError) as exc:
            return console.page(request, "error.html", {"message": str(exc), "session": session}, status=404)
        except TasukiError as exc:
            return console.page(request, "error.html", {"message": str(exc), "session": session}, status=409)

    return endpoint


def create_console(
    settings: Settings,
    store: ContextStore,
    *,
    client: redis.Redis | None = None,
    cancel: Canceller | None = None,
    workers: Callable[[], int | None] = lambda: None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The console app; mount it under ``/console``. ``client`` None: no broker (the fleet says so)."""
    c = Console(settings, store, client, cancel, workers, clock)
    tokens = TokenPages(c)  # personal API tokens (console/tokens.py)
    routes = [
        Route("/signin", c.signin_form, methods=["GET"]),
        Route("/signin", c.signin, methods=["POST"]),
        Route("/signin/oidc", c.oidc_start, methods=["GET"]),
        Route("/oidc/callback", c.oidc_callback, methods=["GET"], name="oidc_callback"),
        Route("/signout", c.signout, methods=["POST"]),
        Route("/", guarded(c, c.fleet, page=True)),
        Route("/fleet/live", guarded(c, c.fleet, page=False)),
        Route("/tasks", guarded(c, c.tasks, page=True)),
        Route("/tasks/{uuid}", guarded(c, c.task, page=True)),
        Route("/tasks/{uuid}/events", guarded(c, c.events, page=False)),
        Route("/tasks/{uuid}/cancel", guarded(c, c.cancel, page=False, needs=Role.OPERATOR), methods=["POST"]),
        Route("/evals", guarded(c, c.evals, page=True)),
        Route("/evals/{run}", guarded(c, c.eval_run, page=True)),
        Route("/audit", guarded(c, AuditPage(c).list, page=True, needs=AUDIT_ROLE)),
        Route("/tokens", guarded(c, tokens.list, page=True, needs=Role.OPERATOR), methods=["GET"]),
        Route("/tokens", guarded(c, tokens.create, page=True, needs=Role.OPERATOR), methods=["POST"]),
        Route("/tokens/{token_id}/revoke", guarded(c, tokens.revoke, page=False, needs=Role.OPERATOR),
              methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if c.oidc is not None:  # Authlib keeps a sign-in's state, nonce and code verifier here until the callback
        middleware.append(Middleware(SessionMiddleware, secret_key=f"signin\0{c.key}", session_cookie=SIGNIN_COOKIE,
                                     max_age=SIGNIN_MAX_AGE_S, same_site="lax", https_only=c.https))
    return Starlette(routes=routes, middleware=middleware)
