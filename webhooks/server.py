"""``tasuki webhook``: serve the intake with uvicorn on ``webhook.host``:``webhook.port``."""

from __future__ import annotations

import gc

import uvicorn

from webhooks.app import create_app


def serve(host: str | None = None, port: int | None = None) -> None:
    """Run the HTTP intake until interrupted; host and port default to the ``webhook`` settings."""
    from worker.celery import app as celery_app
    from worker.logging import configure_logging
    from worker.runtime import redis_client, settings

    configure_logging()
    s = settings()
    app = create_app(s, redis_client(), celery_app)
    freeze_startup_objects()
    # log_config=None: uvicorn's loggers go through Tasuki's structlog processors (one line shape, masking).
    uvicorn.run(app, host=host or s.webhook.host, port=port or s.webhook.port, log_config=None,
                server_header=False, timeout_graceful_shutdown=10)


def freeze_startup_objects() -> None:
    """Keep what start-up made (Celery, kombu, FastAPI, pydantic, the settings, the app) out of the cyclic
    collector's full passes: they live as long as the process, and walking them took 77 ms every few thousand
    deliveries, about 60 µs a delivery and the intake's worst latencies (bench/bench_webhook.py)."""
    gc.collect()
    gc.freeze()
