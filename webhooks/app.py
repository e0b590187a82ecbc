"""The ASGI app of the HTTP intake (SPEC §8): webhooks, the task API, ``/healthz``, ``/metrics``, and the
console under ``/console/`` when ``console.enabled`` (SPEC §15)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import redis
import redis.asyncio
import structlog
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from webhooks.api import task_api
from webhooks.intake import Intake
from webhooks.metrics import CONTENT_TYPE, Metrics
from webhooks.routes import UNAVAILABLE, webhook_router
from worker.names import CLOCK_SKEW_KEY
from worker.redis_clock import offset_s, skew_note, skewed_nodes
from worker.runtime import async_redis_client
from worker.settings_models import Settings

# Blocking Redis, broker and disk calls (everything but a new task's trigger and /healthz) run on a few threads
# of their own, off the event loop: a handful keeps the GIL from thrashing under many concurrent deliveries
# (Starlette's default pool of 40 threads more than doubled p99 in bench/bench_webhook.py), and the loop stays
# free to refuse bad requests while Redis is slow.
BLOCKING_THREADS = 4

T = TypeVar("T")
log = structlog.get_logger(__name__)


def warn_about_missing_secrets(settings: Settings) -> None:
    """Fail closed, but say so: without its secret a route refuses everything."""
    secrets = settings.secrets
    for variable, secret, consequence in (
        ("GITHUB_WEBHOOK_SECRET", secrets.github_webhook_secret, "every GitHub delivery is refused (401)"),
        ("GITLAB_WEBHOOK_SECRET", secrets.gitlab_webhook_secret, "every GitLab delivery is refused (401)"),
        ("GITEA_WEBHOOK_SECRET", secrets.gitea_webhook_secret, "every Gitea delivery is refused (401)"),
    ):  # TASUKI_API_TOKEN is missed by nobody: the task API takes personal tokens (break-glass only needs it)
        if secret is None:
            log.warning("secret not set", variable=variable, consequence=consequence)


def create_app(
    settings: Settings,
    redis_client: redis.Redis,
    celery_app: Any,
    *,
    async_client: redis.asyncio.Redis | None = None,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The intake app; ``redis_client`` (and ``async_client``, made from the broker URL when not given) and
    ``celery_app`` are the broker's (enqueue, dedupe, active keys)."""
    warn_about_missing_secrets(settings)
    executor = ThreadPoolExecutor(max_workers=BLOCKING_THREADS, thread_name_prefix="tasuki-intake")
    loop_client = async_client or async_redis_client(settings.broker.url)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        executor.shutdown(wait=False)
        if async_client is None:  # made here: closed here
            await loop_client.aclose()

    async def blocking(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))

    app = FastAPI(title="Tasuki", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    intake = Intake(settings, redis_client, loop_client, celery_app, blocking)
    metrics = Metrics(settings, redis_client)
    app.include_router(webhook_router(settings, intake, metrics, clock))
    app.include_router(task_api(settings, intake, blocking))

    if settings.console.enabled:
        from console.wiring import mount_console

        mount_console(app, settings, redis_client, celery_app)

    @app.get("/healthz")
    async def healthz() -> Response:
        try:
            sent = time.time()
            redis_time = await loop_client.time()
            offset = offset_s(redis_time, sent, time.time())
            recorded = await loop_client.hgetall(CLOCK_SKEW_KEY)
        except UNAVAILABLE:
            return JSONResponse({"status": "redis unavailable"}, status_code=503)
        # Clocks off Redis's do not stop the intake (heartbeats are judged by Redis's clock), but are shown.
        bound = settings.contexts.max_clock_skew_s
        skewed = skewed_nodes(recorded, time.time() + offset, bound)
        body: dict[str, Any] = {"status": "ok"}
        if skewed or skew_note(offset, bound):
            body["clock_skew"] = {"max_clock_skew_s": bound, "intake_offset_s": round(offset, 3), "workers": skewed}
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(await blocking(metrics.render), media_type=CONTENT_TYPE)

    return app
