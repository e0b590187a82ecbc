"""The beat (SPEC §7): Tasuki's schedule, sent by exactly one of any number of beat processes.

Each beat runs :class:`LockedScheduler` (``beat_scheduler`` in the Celery config, so plain
``celery -A worker beat`` uses it too).  It sends nothing unless it holds a Redis lock, taken with
``SET NX PX`` and renewed every third of its TTL; a standby beat takes over within one TTL of the holder's
death, and at once when the holder shuts down cleanly (it releases the lock).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import redis
import structlog
from celery.beat import PersistentScheduler

from worker.names import ALERTS, BEAT_LOCK_KEY, MAINTENANCE_QUEUE, REAP_STALE, RETENTION, SWEEP_ATTEMPTS
from worker.runtime import redis_client, settings
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

RETENTION_EVERY = timedelta(days=1)
ATTEMPTS_SWEEP_INTERVALS = 10  # the attempts' sweep runs every ten monitor intervals: repairs are rare, deletions slow
EXPIRY_INTERVALS = 10  # a maintenance message not started within this many of its intervals is dropped
# ...but never sooner than this: Celery stamps the expiry with the beat's clock and judges it with the worker's,
# so a short expiry dropped every monitor run on a worker whose clock was a few minutes ahead (issue 26).
MIN_EXPIRY_S = 900.0

# Extend or delete the lock only while it still holds our token (another beat may have taken it over).
_EXTEND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def beat_schedule(s: Settings) -> dict[str, dict[str, Any]]:
    """The entries: the monitor every ``monitor.interval_s``, alerts every ``alerts.interval_s``, retention daily."""

    def entry(task: str, every: timedelta) -> dict[str, Any]:
        expires = max(every.total_seconds() * EXPIRY_INTERVALS, MIN_EXPIRY_S)
        return {"task": task, "schedule": every, "options": {"queue": MAINTENANCE_QUEUE, "expires": expires}}

    return {
        "reap-stale": entry(REAP_STALE, timedelta(seconds=s.monitor.interval_s)),
        "alerts": entry(ALERTS, timedelta(seconds=s.alerts.interval_s)),
        "retention": entry(RETENTION, RETENTION_EVERY),
        "attempts": entry(SWEEP_ATTEMPTS, timedelta(seconds=s.monitor.interval_s * ATTEMPTS_SWEEP_INTERVALS)),
    }


class BeatLock:
    """The lock that makes one beat the sender: ``SET NX PX`` to take it, a token-checked ``PEXPIRE`` to keep it."""

    def __init__(self, client: redis.Redis, key: str, ttl_s: float, token: str | None = None) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        self.held = False

    @property
    def renew_every_s(self) -> float:
        """How often the holder renews (and a standby retries): a third of the TTL."""
        return self.ttl_ms / 3000

    def hold(self) -> bool:
        """Take or extend the lock; True while this beat holds it.  Redis errors count as not holding."""
        was_held = self.held
        try:
            if self.held and self.client.eval(_EXTEND, 1, self.key, self.token, self.ttl_ms):
                return True
            self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        except redis.RedisError as exc:
            self.held = False
            log.warning("beat lock unreachable; sending nothing", error=str(exc))
        if self.held != was_held:
            log.info("beat lock taken; this beat sends the schedule" if self.held else "beat lock lost; standing by")
        return self.held

    def release(self) -> None:
        """Give the lock up if it is still ours, so a standby beat takes over at once."""
        if not self.held:
            return
        self.held = False
        try:
            self.client.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError as exc:
            log.warning("beat lock not released; it lapses after its TTL", error=str(exc))


class LockedScheduler(PersistentScheduler):  # type: ignore[misc]  # celery ships no type hints
    """Celery's persistent scheduler with Tasuki's entries, sending only while it holds the beat lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        s = settings()
        self.lock = BeatLock(redis_client(), BEAT_LOCK_KEY, s.monitor.beat_lock_ttl_s)
        self.tasuki_schedule = beat_schedule(s)
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        """Merge Tasuki's entries under the app's own ``beat_schedule`` (an operator's entry of the same name wins)."""
        self.app.conf.beat_schedule = {**self.tasuki_schedule, **(self.app.conf.beat_schedule or {})}
        super().setup_schedule()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: a standby only retries the lock; the holder sends what is due and renews in time."""
        if not self.lock.hold():
            return self.lock.renew_every_s
        return min(float(super().tick(*args, **kwargs)), self.lock.renew_every_s)

    def close(self) -> None:
        """Sync the schedule file and release the lock."""
        try:
            super().close()
        finally:
            self.lock.release()


def run_beat(argv: Sequence[str] = ()) -> int:
    """``tasuki beat [celery beat options]``: the beat in this process (``-s FILE`` sets the schedule file)."""
    from worker.celery import app

    code = app.start(["beat", *argv])
    return int(code or 0)
