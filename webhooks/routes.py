"""``POST /webhooks/{source}`` for each forge of :data:`HOOKS`: github, gitlab, gitea (SPEC §8).

Each delivery: read the body (bounded) → verify → parse → classify → dedupe and enqueue (webhooks/intake.py).
Malformed input gets a 4xx or an "ignored" 2xx, never a 5xx; only Redis or the broker being away does.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import structlog
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from pydantic import SecretStr
from starlette.datastructures import Headers

from webhooks import gitea_events as gitea
from webhooks.body import BodyTooLarge, Unparsable, parse_payload, read_body
from webhooks.events import Action, github_action, gitlab_action
from webhooks.intake import Answer, Intake
from webhooks.metrics import Metrics
from webhooks.signatures import verify_github, verify_gitlab_token, verify_standard
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

# Failures of the infrastructure, not of the input: the sender may redeliver later.
UNAVAILABLE = (redis.RedisError, OperationalError, ConnectionError, TimeoutError)


def _json(status_code: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status_code)


def _body_hash(body: bytes) -> str:
    """The delivery id of a sender that sent none: identical bodies are one delivery."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class Hook:
    """One forge's webhook route, ``POST /webhooks/{source}``: how a delivery is verified, classified and
    named for dedupe. A forge's webhook is one entry of :data:`HOOKS`."""

    secret: Callable[[Settings], SecretStr | None]
    verify: Callable[[str | None, Headers, bytes, float], bool]
    """``(secret, headers, raw body, now)``: whether the delivery is authentic."""
    classify: Callable[[Headers, dict[str, Any], Settings], Action | Answer]
    delivery: Callable[[Headers, bytes], str]
    """The delivery id (identical bodies are one delivery when the sender names none)."""


def _github_classify(headers: Headers, payload: dict[str, Any], settings: Settings) -> Action | Answer:
    event = headers.get("x-github-event", "")
    if event == "ping":
        return Answer(200, {"status": "pong"}, "ping")
    return github_action(event, payload, settings.github)


def _gitlab_verify(secret: str | None, headers: Headers, body: bytes, now: float) -> bool:
    if verify_gitlab_token(secret, headers.get("x-gitlab-token")):
        return True
    return verify_standard(secret, body, headers.get("webhook-id"), headers.get("webhook-timestamp"),
                           headers.get("webhook-signature"), now)


HOOKS: dict[str, Hook] = {
    "github": Hook(
        lambda s: s.secrets.github_webhook_secret,
        lambda secret, headers, body, _: verify_github(secret, body, headers.get("x-hub-signature-256")),
        _github_classify,
        lambda headers, body: f"{headers.get('x-github-hook-id', '')}:"
                              f"{headers.get('x-github-delivery') or _body_hash(body)}",
    ),
    "gitlab": Hook(
        lambda s: s.secrets.gitlab_webhook_secret,
        _gitlab_verify,
        lambda _, payload, settings: gitlab_action(payload, settings.gitlab),
        lambda headers, body: headers.get("idempotency-key") or headers.get("x-gitlab-event-uuid") or _body_hash(body),
    ),
    "gitea": Hook(
        lambda s: s.secrets.gitea_webhook_secret,
        lambda secret, headers, body, _: gitea.verify_delivery(secret, headers, body),
        lambda headers, payload, settings: gitea.gitea_action(gitea.event_name(headers), payload, settings.gitea),
        lambda headers, body: gitea.delivery_id(headers) or _body_hash(body),
    ),
}


def webhook_router(settings: Settings, intake: Intake, metrics: Metrics, clock: Callable[[], float]) -> APIRouter:
    """One route per forge of :data:`HOOKS`."""
    router = APIRouter()
    limit = settings.webhook.max_body_bytes

    async def answer(source: str, hook: Hook, secret: str | None, request: Request) -> Response:
        headers = request.headers
        try:
            body = await read_body(request, limit)
        except BodyTooLarge:
            metrics.count(source, "too_large")
            return _json(413, {"detail": f"body over {limit} bytes"})
        if not hook.verify(secret, headers, body, clock()):
            metrics.count(source, "unauthorized")
            return _json(401, {"detail": "bad or missing signature"})
        try:
            action = hook.classify(headers, parse_payload(body, headers.get("content-type", "")), settings)
        except Unparsable:
            metrics.count(source, "unparsable")
            return _json(400, {"detail": "body is not a JSON object"})
        if isinstance(action, Answer):
            result = action
        else:
            try:
                result = await intake.deliver(source, hook.delivery(headers, body), action)
            except UNAVAILABLE as exc:
                log.warning("webhook not processed: broker unavailable", source=source, error=str(exc))
                metrics.count(source, "unavailable")
                return _json(503, {"detail": "queue unavailable; redeliver later"})
        metrics.count(source, result.outcome)
        return _json(result.status_code, result.body)

    for source, hook in HOOKS.items():
        secret = hook.secret(settings)
        endpoint = functools.partial(answer, source, hook, secret.get_secret_value() if secret else None)
        router.add_api_route(f"/webhooks/{source}", _endpoint(endpoint), methods=["POST"], name=source)
    return router


def _endpoint(answer: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """A route function FastAPI can read the signature of (it takes the request, nothing else)."""

    async def endpoint(request: Request) -> Response:
        return await answer(request)

    return endpoint
