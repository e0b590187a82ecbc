"""``tasuki webhook``: serve the intake with uvicorn on ``webhook.host``:``webhook.port``."""

from __future__ import annotations

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
    # log_config=None: uvicorn's loggers go through Tasuki's structlog processors (one line shape, masking).
    uvicorn.run(app, host=host or s.webhook.host, port=port or s.webhook.port, log_config=None,
                server_header=False, timeout_graceful_shutdown=10)
