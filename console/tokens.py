"""The console's API-token page (issue 40): an operator or admin makes personal tokens for themselves — the
secret shown once, on the answer to the form, never again — and sees and revokes their own; an admin sees and
revokes everyone's. Each making and revoking goes to the audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from console.sessions import Session, csrf_matches
from contexts.api_tokens import ApiToken, TokenError
from worker.api_tokens import issue_token, role_named, token_store
from worker.audit import record_audit
from worker.roles import Role

if TYPE_CHECKING:
    from console.app import Console

OIDC_PREFIX = "oidc:"


def owner_of(session: Session) -> str | None:
    """The name a person's tokens are owned under (their e-mail or subject: a task's user); None for the shared
    break-glass session, which is nobody in particular and so owns no token."""
    if session.break_glass:
        return None
    return session.actor.removeprefix(OIDC_PREFIX)


def visible(tokens: list[ApiToken], session: Session) -> list[ApiToken]:
    """An admin sees every token; anyone else only their own."""
    if session.may(Role.ADMIN):
        return tokens
    return [t for t in tokens if t.owner == owner_of(session)]


class TokenPages:
    """Handlers of ``/tokens``; they run behind ``guarded(..., needs=Role.OPERATOR)``."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.settings = console.settings

    def _page(self, request: Request, session: Session, *, secret: str | None = None, made: ApiToken | None = None,
              error: str | None = None, status: int = 200) -> Response:
        tokens = visible(token_store(self.settings).list(), session)
        roles = [role for role in Role if role <= session.role]
        return self.console.page(request, "tokens.html", {
            "session": session, "tokens": tokens, "roles": roles, "secret": secret, "made": made, "error": error,
            "owner": owner_of(session), "max_days": self.settings.auth.token_max_days,
            "default_days": min(30, self.settings.auth.token_max_days)}, status=status)

    async def list(self, request: Request, session: Session) -> Response:
        return await run_in_threadpool(lambda: self._page(request, session))

    async def create(self, request: Request, session: Session) -> Response:
        form = await request.form()
        if not csrf_matches(session, _text(form, "csrf")):
            return PlainTextResponse("CSRF token missing or wrong", status_code=403)
        owner = owner_of(session)
        if owner is None:
            return await run_in_threadpool(lambda: self._page(
                request, session, error="The break-glass session owns no token: sign in as yourself.", status=403))
        try:
            days = int(_text(form, "days") or "0")
            role = role_named(_text(form, "role") or "")
            token, secret = await run_in_threadpool(lambda: issue_token(
                self.settings, token_store(self.settings), owner=owner, owner_role=session.role,
                groups=session.groups, role=role, expires_days=days, name=_text(form, "name") or "",
                now=self.console.now()))
        except (TokenError, ValueError) as exc:
            message = str(exc) if isinstance(exc, TokenError) else "days must be a whole number"
            await self._audit(session, "token.create", "", "refused", message, {})
            return await run_in_threadpool(lambda: self._page(request, session, error=message, status=422))
        await self._audit(session, "token.create", token.id, "ok", "", _described(token))
        return await run_in_threadpool(lambda: self._page(request, session, secret=secret, made=token))

    async def revoke(self, request: Request, session: Session) -> Response:
        form = await request.form()
        if not csrf_matches(session, _text(form, "csrf")):
            return PlainTextResponse("CSRF token missing or wrong", status_code=403)
        token_id = request.path_params["token_id"]
        store = token_store(self.settings)
        token = await run_in_threadpool(store.get, token_id)
        if token is None or token not in visible([token], session):  # another's token is none of theirs to see
            return PlainTextResponse(f"no token {token_id}", status_code=404)
        revoked = await run_in_threadpool(store.revoke, token_id, self.console.now())
        await self._audit(session, "token.revoke", token_id, "ok", "", _described(revoked))
        return RedirectResponse(f"{request.scope.get('root_path', '')}/tokens", status_code=303)

    async def _audit(self, session: Session, action: str, target: str, outcome: str, reason: str,
                     detail: dict[str, Any]) -> None:
        await run_in_threadpool(lambda: record_audit(self.settings, actor=session.actor, action=action, target=target,
                                                     outcome=outcome, reason=reason, source="console",
                                                     detail=detail))


def _text(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _described(token: ApiToken) -> dict[str, Any]:
    """What the audit log keeps of a token: never its secret (which it never had) nor its hash."""
    return {"owner": token.owner, "name": token.name, "role": token.role, "expires_at": token.expires_at.isoformat()}
