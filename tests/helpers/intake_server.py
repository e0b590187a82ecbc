"""The HTTP intake under a real uvicorn server on a free port, in a background thread of the test process."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import redis
import uvicorn
from celery import Celery
from fastapi import FastAPI

from webhooks import create_app
from worker.celery import celery_config
from worker.names import TASKS_QUEUE
from worker.settings_models import Settings

START_TIMEOUT_S = 20.0


@dataclass
class IntakeServer:
    """A running intake: its URL, the app, and the broker objects it enqueues with."""

    url: str
    app: FastAPI
    celery: Celery
    redis: redis.Redis

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kwargs)

    def queued(self) -> list[bytes]:
        """Messages waiting in the ``tasks`` queue (no worker consumes them in these tests)."""
        return list(self.redis.lrange(TASKS_QUEUE, 0, -1))


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 and a free port; yield its base URL."""
    # A long keep-alive: with uvicorn's 5 s, a busy machine let a client send on a connection the server had
    # just closed ("Server disconnected without sending a response"), a race of the test's client, not the app.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", timeout_keep_alive=300)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)  # polling a starting server
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextmanager
def intake_server(settings: Settings, redis_client: redis.Redis | None = None) -> Iterator[IntakeServer]:
    """The intake for ``settings`` (its broker URL is the test's Redis); the ``tasks`` queue is emptied after."""
    client = redis_client or redis.Redis.from_url(settings.broker.url, socket_timeout=5)
    celery = Celery("tasuki-intake-test")
    celery.conf.update(celery_config(settings))
    app = create_app(settings, client, celery)
    try:
        with serve_app(app) as url:
            yield IntakeServer(url, app, celery, client)
    finally:
        with contextlib.suppress(redis.RedisError):
            client.delete(TASKS_QUEUE)  # nothing consumes these messages: never hand them to a later worker
        celery.close()
