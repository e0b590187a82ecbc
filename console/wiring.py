"""One way to build the console from settings: the store, its index, Redis, Cancel and the workers' count,
for the intake's app (mounted under ``/console``) and for ``tasuki console`` (the console alone)."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route

from console.app import create_console
from worker.settings_models import Settings
from worker.stores import open_store
from worker.submit import request_cancel

MOUNT = "/console"
WORKERS_TTL_S = 10.0
PING_TIMEOUT_S = 0.5


class WorkerCount:
    """Celery workers answering a ping, asked at most every ``ttl_s`` (a ping waits ``PING_TIMEOUT_S``)."""

    def __init__(self, celery_app: Any, ttl_s: float = WORKERS_TTL_S) -> None:
        self.celery_app = celery_app
        self.ttl_s = ttl_s
        self.lock = threading.Lock()
        self.value: int | None = None
        self.asked_at = float("-inf")

    def __call__(self) -> int | None:
        with self.lock:
            if time.monotonic() - self.asked_at >= self.ttl_s:
                self.asked_at = time.monotonic()
                try:
                    self.value = len(self.celery_app.control.ping(timeout=PING_TIMEOUT_S) or [])
                except Exception:  # the broker went away meanwhile: unknown, not an error page
                    self.value = None
            return self.value


def console_app(settings: Settings, client: redis.Redis | None, celery_app: Any | None) -> Starlette:
    """The console over the configured store; Cancel and the workers' count need ``celery_app``."""
    store = open_store(settings, must_exist=False)
    if celery_app is None or client is None:
        return create_console(settings, store, client=client)

    def cancel(uuid: str) -> str:
        return request_cancel(celery_app, client, store, uuid)

    return create_console(settings, store, client=client, cancel=cancel,
                          workers=WorkerCount(celery_app))


def mount_console(parent: Starlette, settings: Settings, client: redis.Redis | None, celery_app: Any | None) -> None:
    """Serve the console under ``/console/`` of ``parent`` (``/console`` itself redirects there)."""
    parent.router.routes.append(Route(MOUNT, lambda _: RedirectResponse(f"{MOUNT}/", status_code=307)))
    parent.router.routes.append(Mount(MOUNT, console_app(settings, client, celery_app)))


def standalone(settings: Settings, client: redis.Redis | None, celery_app: Any | None) -> Starlette:
    """``tasuki console``: the console alone, under the same ``/console/`` path; ``/`` leads there."""
    app = Starlette(routes=[Route("/", lambda _: RedirectResponse(f"{MOUNT}/", status_code=307))])
    mount_console(app, settings, client, celery_app)
    return app
