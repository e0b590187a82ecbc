"""``GET /metrics``: the fleet as Prometheus sees it, read from Redis at scrape time (never from the contexts:
a scrape costs the same with ten running tasks and with ten thousand).

Tasks by status, queue depth, stale heartbeats, compressions, webhook outcomes, and the alert gauges the
scheduler's ``tasuki.alerts`` publishes in Redis (``ALERTS_KEY``: one field per gauge).
"""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from contexts.names import ACTIVE_STATUSES
from worker.bookkeeping import ENVIRONMENT_BUCKETS, ENVIRONMENT_OUTCOMES
from worker.names import ALERTS_KEY, HEARTBEATS_KEY, QUEUES, RUNNING_STATUS_PREFIX, SPEND_TOTALS_KEY, STATS_KEY
from worker.settings_models import Settings
from worker.spend import fleet_totals

PULL_OUTCOMES = ("opened", "merged", "closed")  # STATS_KEY fields pull_requests:{outcome}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FleetCollector(Collector):
    """Collects at scrape time; a Redis outage drops the Redis-backed families and sets ``tasuki_redis_up`` 0."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client

    def collect(self) -> Iterator[Metric]:
        """Every family, fresh; nothing here grows with the number of tasks (no context is read)."""
        up = GaugeMetricFamily("tasuki_redis_up", "1 when Redis answered this scrape")
        try:
            yield from self._from_redis()
            up.add_metric([], 1)
        except redis.RedisError:
            up.add_metric([], 0)
        yield up

    def _from_redis(self) -> Iterator[Metric]:
        pipe = self.client.pipeline(transaction=False)
        for status in ACTIVE_STATUSES:
            pipe.zcard(RUNNING_STATUS_PREFIX + status)
        for queue in QUEUES:
            pipe.llen(queue)
        seconds, micros = self.client.time()  # heartbeat scores are Redis's time: judged by Redis's clock too
        stale_before = seconds + micros / 1e6 - self.settings.contexts.stale_after_s
        pipe.zcount(HEARTBEATS_KEY, "-inf", stale_before)
        pipe.hgetall(STATS_KEY)
        pipe.hgetall(ALERTS_KEY)
        pipe.hgetall(SPEND_TOTALS_KEY)
        *counts, stale, stats, alerts, spend = pipe.execute()
        running, depths = counts[: len(ACTIVE_STATUSES)], counts[len(ACTIVE_STATUSES):]
        family = GaugeMetricFamily("tasuki_tasks_running", "Running tasks by status (the Redis index the holders "
                                   "keep)", labels=["status"])
        for status, count in zip(ACTIVE_STATUSES, running, strict=True):
            family.add_metric([status], int(count))
        yield family
        depth_family = GaugeMetricFamily("tasuki_queue_depth", "Messages waiting per Celery queue", labels=["queue"])
        for queue, depth in zip(QUEUES, depths, strict=True):
            depth_family.add_metric([queue], int(depth))
        yield depth_family
        yield GaugeMetricFamily(
            "tasuki_stale_heartbeats", "Tasks whose heartbeat is older than contexts.stale_after_s", value=int(stale)
        )
        stats = {_text(k): int(v) for k, v in stats.items()}
        finished = CounterMetricFamily("tasuki_tasks_finished", "Tasks finished, by final status", labels=["status"])
        for field, count in sorted(stats.items()):
            if field.startswith("finished:"):
                finished.add_metric([field.removeprefix("finished:")], count)
        yield finished
        yield CounterMetricFamily(
            "tasuki_compressions", "Context compressions (finished and running tasks), counted as each one is made",
            value=sum(count for field, count in stats.items() if field.startswith("compressions_via:")),
        )
        by_way = CounterMetricFamily("tasuki_compressions_by_way", "Compressions by where they ran: the "
                                     "compression queue, or inline in the task's own process", labels=["via"])
        for field, count in sorted(stats.items()):
            if field.startswith("compressions_via:"):
                by_way.add_metric([field.removeprefix("compressions_via:")], count)
        yield by_way
        yield CounterMetricFamily("tasuki_compression_queue_wait_seconds", "Time compressions waited to start",
                                  value=stats.get("compression_queue_wait_ms", 0) / 1000)
        yield CounterMetricFamily("tasuki_compression_run_seconds", "Time compressions took to run",
                                  value=stats.get("compression_run_ms", 0) / 1000)
        pulls = CounterMetricFamily("tasuki_pull_requests", "Pull/merge requests tasks opened, and endings the forges "
                                    "announced for them: merged, or closed unmerged", labels=["outcome"])
        for outcome in PULL_OUTCOMES:
            pulls.add_metric([outcome], stats.get(f"pull_requests:{outcome}", 0))
        yield pulls
        yield from environment_families(stats)
        alert = GaugeMetricFamily("tasuki_alert", "Latest value of each scheduler alert gauge", labels=["name"])
        for name, value in sorted((_text(k), v) for k, v in alerts.items()):
            try:
                alert.add_metric([name], float(value))
            except ValueError:
                continue
        yield alert
        yield from spend_families(spend)


def environment_families(stats: dict[str, int]) -> Iterator[Metric]:
    """Repository environments (SPEC §17): builds, restores and failures, and how long each took."""
    for outcome, noun in ENVIRONMENT_OUTCOMES.items():
        yield CounterMetricFamily(
            f"tasuki_environment_{noun}",
            f"Task environments {outcome} (setups run or snapshots restored before a task's first step)",
            value=stats.get(f"environments:{outcome}", 0),
        )
    seconds = HistogramMetricFamily("tasuki_environment_seconds", "Time a task's environment took to be ready, by "
                                    "outcome (built, restored, failed)", labels=["outcome"])
    for outcome in ENVIRONMENT_OUTCOMES:
        buckets = [
            ("+Inf" if bound == float("inf") else str(bound), stats.get(f"environment_seconds:{outcome}:{bound}", 0))
            for bound in ENVIRONMENT_BUCKETS
        ]
        seconds.add_metric([outcome], buckets, sum_value=stats.get(f"environment_ms:{outcome}", 0) / 1000)
    yield seconds


def spend_families(raw: dict[bytes | str, bytes | str]) -> Iterator[Metric]:
    """Tokens by kind and model, USD by model (no repository or user labels: their number has no bound)."""
    tokens, costs = fleet_totals(raw)
    token_family = CounterMetricFamily("tasuki_tokens", "Model tokens used (prompt plus completion), by kind of "
                                       "call (agent, summary, memory, embedding) and model", labels=["kind", "model"])
    for (kind, model), count in sorted(tokens.items()):
        token_family.add_metric([kind, model], count)
    yield token_family
    cost_family = CounterMetricFamily("tasuki_cost", "USD spent on models with a configured price, by model",
                                      labels=["model"])
    for model, cost in sorted(costs.items()):
        cost_family.add_metric([model], cost)
    yield cost_family


class Metrics:
    """The app's registry: the fleet collector and the webhook outcome counter."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(settings, client))
        self.deliveries = Counter(
            "tasuki_webhook_deliveries", "Webhook deliveries by source and outcome", ["source", "outcome"],
            registry=self.registry,
        )

    def count(self, source: str, outcome: str) -> None:
        """Count one delivery's outcome."""
        self.deliveries.labels(source=source, outcome=outcome).inc()

    def render(self) -> bytes:
        """The exposition text: this app's registry plus the process-wide default one."""
        return generate_latest(self.registry) + generate_latest(REGISTRY)
