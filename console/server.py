"""``tasuki console``: the console alone with uvicorn, against the configured contexts root. Redis is optional:
without it the pages still show every context, and the fleet page says "no broker"."""

from __future__ import annotations

import redis
import uvicorn
from redis.backoff import NoBackoff
from redis.retry import Retry

from contexts.errors import TasukiError
from worker.settings_models import Settings

# Short: a fleet page must not hang for the default five seconds on every refresh while Redis is down.
REDIS_TIMEOUT_S = 0.5


class NoConsoleToken(TasukiError):
    """Nobody could sign in: no OpenID Connect provider, and no break-glass token."""


def broker_client(url: str) -> redis.Redis:
    """A Redis client that gives up at once when Redis is down (one attempt, short timeouts)."""
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S,
                                retry=Retry(NoBackoff(), 0))


def serve(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    """Serve the console until interrupted on ``console.host``:``console.port`` (or the given ones)."""
    from console.wiring import standalone
    from worker.celery import app as celery_app
    from worker.logging import configure_logging

    if not settings.auth.oidc.configured and not (settings.auth.break_glass and settings.console_token()):
        from console.app import NOT_CONFIGURED

        raise NoConsoleToken(NOT_CONFIGURED)
    configure_logging()
    client = broker_client(settings.broker.url)
    app = standalone(settings, client, celery_app)
    uvicorn.run(app, host=host or settings.console.host, port=port or settings.console.port, log_config=None,
                server_header=False, timeout_graceful_shutdown=5)
