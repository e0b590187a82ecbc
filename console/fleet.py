"""The fleet page's figures (SPEC §15): running tasks, queue depths, workers alive, alerts firing, endings of
the last 24 h. Counts come from Redis and the index; only the shown running tasks' contexts are read, so the
page costs the same with ten running tasks and with a thousand. Without Redis the page says "no broker" and
lists the newest running contexts from the index."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from contexts.atomic import read_json
from contexts.errors import BAD_DATA_ERRORS, ContextError
from contexts.index import Index
from contexts.index_schema import repository_name
from contexts.names import METADATA_FILE, RUNNING_DIR
from contexts.state import read_state
from contexts.store import ContextStore
from worker.names import ALERTS_KEY, HEARTBEATS_KEY, QUEUES

ENDINGS_TTL_S = 30.0
SHOWN_RUNNING = 20  # the freshest heartbeats; the tasks page lists every running task
LEVEL_NAMES = {1: "warning", 2: "critical"}


@dataclass(frozen=True)
class RunningTask:
    """One running task's row."""

    uuid: str
    repository: str
    source: str
    task: str
    status: str
    step: int
    attempt: int
    heartbeat_age_s: float | None
    prompt_tokens: int
    window: int


@dataclass(frozen=True)
class Alert:
    """An alert gauge the scheduler published above 0."""

    name: str
    level: str


@dataclass(frozen=True)
class Fleet:
    """Everything the fleet page shows; ``broker`` False: the Redis figures are unknown."""

    broker: bool
    running: list[RunningTask]
    running_total: int
    queues: dict[str, int] = field(default_factory=dict)
    workers: int | None = None
    alerts: list[Alert] = field(default_factory=list)
    ended_24h: dict[str, int] = field(default_factory=dict)


def running_task(store: ContextStore, uuid: str, heartbeat: float | None, now: datetime) -> RunningTask | None:
    """The row of one running context (None when it finished or vanished meanwhile)."""
    directory = store.running_path(uuid)
    try:
        metadata = read_json(directory / METADATA_FILE)
        state = read_state(directory)
        key = metadata["task_key"]
        return RunningTask(
            uuid=uuid,
            repository=repository_name(key),
            source=str(key.get("task_source")),
            task=f"{key.get('task_type')} #{key.get('task_id')}",
            status=str(state.get("status")),
            step=int(state.get("llm_call_count") or 0),
            attempt=int(state.get("attempt") or 1),
            heartbeat_age_s=None if heartbeat is None else max(now.timestamp() - heartbeat, 0.0),
            prompt_tokens=int(state.get("current_context_tokens") or 0),
            window=int((metadata.get("config") or {}).get("context_length") or 0),
        )
    except (OSError, ContextError):
        return None
    except BAD_DATA_ERRORS:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def alerts_firing(published: dict[Any, Any]) -> list[Alert]:
    """The ``alert_*`` gauges above 0 of the hash ``tasuki.alerts`` publishes."""
    firing = []
    for name, value in sorted((_text(k), _text(v)) for k, v in published.items()):
        if not name.startswith("alert_"):
            continue
        try:
            level = int(float(value))
        except ValueError:
            continue
        if level > 0:
            firing.append(Alert(name.removeprefix("alert_"), LEVEL_NAMES.get(level, "critical")))
    return firing


class RecentEndings:
    """Tasks ended in the last 24 h by status, counted at most every ``ttl_s``: the count reads every ending of
    the day from the index (10,000 endings: 9 ms), and the page refreshes every few seconds."""

    def __init__(self, ttl_s: float = ENDINGS_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.lock = threading.Lock()
        self.counted_at: datetime | None = None
        self.counts: dict[str, int] = {}

    def __call__(self, index: Index, now: datetime) -> dict[str, int]:
        with self.lock:
            if self.counted_at is None or not 0 <= (now - self.counted_at).total_seconds() < self.ttl_s:
                self.counts = index.ended_since(now - timedelta(hours=24))
                self.counted_at = now
            return self.counts


def read_fleet(
    store: ContextStore,
    index: Index,
    client: redis.Redis | None,
    now: datetime,
    workers: Callable[[], int | None] = lambda: None,
    endings: RecentEndings | None = None,
) -> Fleet:
    """The fleet now: from Redis when it answers, else from the index alone ("no broker")."""
    ended = (endings or RecentEndings(0))(index, now)
    if client is not None:
        try:
            pipe = client.pipeline(transaction=False)
            pipe.zrevrange(HEARTBEATS_KEY, 0, SHOWN_RUNNING - 1, withscores=True)
            pipe.zcard(HEARTBEATS_KEY)
            for queue in QUEUES:
                pipe.llen(queue)
            pipe.hgetall(ALERTS_KEY)
            pipe.time()  # heartbeats are written by Redis's clock: their ages are judged by it too (SPEC §4)
            shown, total, *depths, published, (seconds, micros) = pipe.execute()
        except redis.RedisError:
            pass
        else:
            by_redis = datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, UTC)
            rows = [running_task(store, _text(uuid), float(score), by_redis) for uuid, score in shown]
            return Fleet(True, [r for r in rows if r is not None], int(total),
                         dict(zip(QUEUES, (int(d) for d in depths), strict=True)), workers(),
                         alerts_firing(published), ended)
    newest = index.page(location=RUNNING_DIR, limit=SHOWN_RUNNING)
    rows = [running_task(store, entry.uuid, None, now) for entry in newest]
    return Fleet(False, [r for r in rows if r is not None], index.count(location=RUNNING_DIR), ended_24h=ended)
