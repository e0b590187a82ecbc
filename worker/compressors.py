"""Which compression workers are alive (SPEC §6: the compression queue has capacity of its own).

Every Celery worker that consumes the ``compression`` queue scores its node name in a Redis sorted set every
:data:`BEAT_S` seconds and removes it when it stops. A task about to compress sends the job only while one
is alive, and otherwise summarizes in its own process at once — it never waits out a timer for a consumer
that does not exist (``compression.start_timeout_s`` stays as the backstop for one that died just now).
"""

from __future__ import annotations

import threading
import time

import redis
import structlog

from worker.names import COMPRESSORS_KEY

BEAT_S = 5.0
ALIVE_S = 3 * BEAT_S  # three missed beats: that consumer is gone
log = structlog.get_logger(__name__)


def alive(client: redis.Redis, now: float) -> int:
    """How many compression workers beat within the last :data:`ALIVE_S` seconds."""
    return int(client.zcount(COMPRESSORS_KEY, now - ALIVE_S, "+inf"))


def beat(client: redis.Redis, node: str, now: float) -> None:
    """``node`` consumes the compression queue as of ``now``; long-gone nodes are dropped on the way."""
    pipe = client.pipeline(transaction=False)
    pipe.zadd(COMPRESSORS_KEY, {node: now})
    pipe.zremrangebyscore(COMPRESSORS_KEY, "-inf", now - 100 * ALIVE_S)
    pipe.execute()


def withdraw(client: redis.Redis, node: str) -> None:
    """``node`` stops consuming the compression queue."""
    client.zrem(COMPRESSORS_KEY, node)


class Announcer:
    """A daemon thread that beats for one compression worker until :meth:`stop`."""

    def __init__(self, client: redis.Redis, node: str) -> None:
        self.client = client
        self.node = node
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compressor-beat", daemon=True)

    def start(self) -> Announcer:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                beat(self.client, self.node, time.time())
            except redis.RedisError as exc:  # a Redis blip: tasks summarize inline meanwhile
                log.warning("compression worker beat not recorded", error=str(exc))
            if self._stopped.wait(BEAT_S):
                return

    def stop(self) -> None:
        self._stopped.set()
        try:
            withdraw(self.client, self.node)
        except redis.RedisError as exc:
            log.warning("compression worker not withdrawn; it drops out in seconds", error=str(exc))
