"""One clock for staleness: Redis's (SPEC §4).

A heartbeat's age is the reader's clock minus the writer's; with each host's own clock a worker two minutes
behind loses every task it starts, and one two minutes ahead that dies is resumed two minutes late.  Every
process that writes or judges a heartbeat reads the time as Redis's ``TIME`` would give it: its own clock
plus an offset it measures with ``TIME`` (at a task's start at most once a ``REFRESH_S``, and on every
heartbeat, in the heartbeat's own pipeline).  ``contexts/`` stays pure: the store is handed this clock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import redis
import structlog

from worker.names import CLOCK_SKEW_KEY

log = structlog.get_logger(__name__)

REFRESH_S = 60.0  # how old a measured offset may get before a task's start measures it again


def offset_s(redis_time: Sequence[int | float], sent: float, received: float) -> float:
    """Redis's clock minus this host's, from a ``TIME`` answer (seconds, microseconds) read between the local
    times ``sent`` and ``received`` (the answer is taken to be from the middle of the round trip)."""
    server = float(redis_time[0]) + float(redis_time[1]) / 1e6
    return server - (sent + received) / 2


def skew_note(offset: float, bound_s: float) -> str | None:
    """What to say about a clock ``offset`` seconds off Redis's, or ``None`` within ``bound_s``."""
    if abs(offset) <= bound_s:
        return None
    way = "behind" if offset > 0 else "ahead of"
    return f"this host's clock is {abs(offset):.1f}s {way} Redis's (more than {bound_s:g}s); heartbeats use Redis's"


class RedisClock:
    """A ``datetime`` clock that tells Redis's time: the local clock plus the last measured offset.  Calling it
    never talks to Redis (it runs for every record written)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._measured = float("-inf")  # time.monotonic() of the last measurement
        self._guard = threading.Lock()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset)

    def epoch(self) -> float:
        """Redis's time as seconds since the epoch."""
        return time.time() + self.offset

    def observe(self, redis_time: Sequence[int | float], sent: float, received: float) -> float:
        """Take a ``TIME`` answer read between ``sent`` and ``received`` (local ``time.time()``); returns the offset."""
        with self._guard:
            self.offset = offset_s(redis_time, sent, received)
            self._measured = time.monotonic()
        return self.offset

    def measure(self, client: redis.Redis) -> float:
        """Ask Redis for its time now; returns the offset (raises :class:`redis.RedisError`)."""
        sent = time.time()
        answer = client.time()
        return self.observe(answer, sent, time.time())

    def measure_if_due(self, client: redis.Redis, node: str, bound_s: float) -> None:
        """Measure when the offset is older than ``REFRESH_S`` (or was never measured); a skew past ``bound_s`` is
        logged and recorded for ``/healthz``.  A Redis that does not answer keeps the last offset."""
        if time.monotonic() - self._measured < REFRESH_S:
            return
        try:
            offset = self.measure(client)
            record_skew(client, node, offset, self.epoch())
        except redis.RedisError as exc:
            log.warning("clock offset to Redis not measured", error=str(exc)[:200])
            return
        note = skew_note(offset, bound_s)
        if note is not None:
            log.warning("clock skew", node=node, offset_s=round(offset, 3), detail=note)


def record_skew(client: redis.Redis, node: str, offset: float, at: float) -> None:
    """Record this process's offset to Redis's clock where ``/healthz`` reads it."""
    client.hset(CLOCK_SKEW_KEY, node, json.dumps({"offset_s": round(offset, 3), "at": round(at, 3)}))


def skewed_nodes(
    recorded: Mapping[bytes | str, bytes | str], now: float, bound_s: float, within_s: float = 86400.0
) -> dict[str, float]:
    """Of the offsets recorded under ``CLOCK_SKEW_KEY``, those measured in the last ``within_s`` (by Redis's
    ``now``) that are past ``bound_s``: node -> offset in seconds."""
    skewed = {}
    for node, raw in recorded.items():
        try:
            entry = json.loads(raw)
            offset, at = float(entry["offset_s"]), float(entry["at"])
        except (ValueError, KeyError, TypeError):
            continue
        if now - at <= within_s and abs(offset) > bound_s:
            skewed[node.decode() if isinstance(node, bytes) else str(node)] = offset
    return skewed
