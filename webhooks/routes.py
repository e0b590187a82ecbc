"""``POST /webhooks/github`` and ``POST /webhooks/gitlab`` (SPEC §8).

Each delivery: read the body (bounded) → verify → parse → classify → dedupe and enqueue (webhooks/intake.py).
Malformed input gets a 4xx or an "ignored" 2xx, never a 5xx; only Redis or the broker being away does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import redis
import structlog
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError

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


def webhook_router(settings: Settings, intake: Intake, metrics: Metrics, clock: Callable[[], float]) -> APIRouter:
    """The two webhook routes."""
    router = APIRouter()
    limit = settings.webhook.max_body_bytes
    github_secret = settings.secrets.github_webhook_secret
    gitlab_secret = settings.secrets.gitlab_webhook_secret

    async def answer(
        source: str,
        request: Request,
        verify: Callable[[bytes], bool],
        classify: Callable[[dict[str, Any]], Action | Answer],
        delivery: Callable[[bytes], str],
    ) -> Response:
        try:
            body = await read_body(request, limit)
        except BodyTooLarge:
            metrics.count(source, "too_large")
            return _json(413, {"detail": f"body over {limit} bytes"})
        if not verify(body):
            metrics.count(source, "unauthorized")
            return _json(401, {"detail": "bad or missing signature"})
        try:
            action = classify(parse_payload(body, request.headers.get("content-type", "")))
        except Unparsable:
            metrics.count(source, "unparsable")
            return _json(400, {"detail": "body is not a JSON object"})
        if isinstance(action, Answer):
            result = action
        else:
            try:
                result = await intake.deliver(source, delivery(body), action)
            except UNAVAILABLE as exc:
                log.warning("webhook not processed: broker unavailable", source=source, error=str(exc))
                metrics.count(source, "unavailable")
                return _json(503, {"detail": "queue unavailable; redeliver later"})
        metrics.count(source, result.outcome)
        return _json(result.status_code, result.body)

    @router.post("/webhooks/github")
    async def github(request: Request) -> Response:
        headers = request.headers
        event = headers.get("x-github-event", "")
        secret = github_secret.get_secret_value() if github_secret else None

        def classify(payload: dict[str, Any]) -> Action | Answer:
            if event == "ping":
                return Answer(200, {"status": "pong"}, "ping")
            return github_action(event, payload, settings.github)

        def delivery(body: bytes) -> str:
            return f"{headers.get('x-github-hook-id', '')}:{headers.get('x-github-delivery') or _body_hash(body)}"

        return await answer(
            "github", request, lambda body: verify_github(secret, body, headers.get("x-hub-signature-256")),
            classify, delivery,
        )

    @router.post("/webhooks/gitlab")
    async def gitlab(request: Request) -> Response:
        headers = request.headers
        secret = gitlab_secret.get_secret_value() if gitlab_secret else None

        def verify(body: bytes) -> bool:
            if verify_gitlab_token(secret, headers.get("x-gitlab-token")):
                return True
            return verify_standard(
                secret, body, headers.get("webhook-id"), headers.get("webhook-timestamp"),
                headers.get("webhook-signature"), clock(),
            )

        def delivery(body: bytes) -> str:
            return headers.get("idempotency-key") or headers.get("x-gitlab-event-uuid") or _body_hash(body)

        return await answer("gitlab", request, verify, lambda payload: gitlab_action(payload, settings.gitlab),
                            delivery)

    return router
