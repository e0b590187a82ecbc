"""Alerts (SPEC §7, 001 §8.3): disk use, failure rate, running count, long-running tasks.

``measure`` reads the store; ``evaluate`` is pure.  :func:`alerts` logs each alert as a structured event,
sets the gauges of :data:`REGISTRY` (this process's ``tasuki alerts`` prints them) and publishes the same
values in Redis (``ALERTS_KEY``), which the HTTP intake's ``/metrics`` serves as ``tasuki_alert{name=…}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import redis
import structlog
from prometheus_client import CollectorRegistry, Gauge

from contexts import ContextStore
from contexts.clock import iso, parse_iso, utc_now
from contexts.errors import ContextError
from contexts.names import COMPLETED_DIR, RUNNING_DIR
from contexts.queries import disk_usage
from contexts.state import read_state
from worker.names import ALERTS_KEY
from worker.runtime import context_store, redis_client, settings
from worker.settings_models import AlertSettings

log = structlog.get_logger(__name__)

GB = 1024**3
FAILURES = ("failed", "timeout")
FINISHED = ("completed", *FAILURES)  # cancelled tasks are an operator's choice, neither success nor failure
LEVELS = {"ok": 0, "warning": 1, "critical": 2}
Level = Literal["warning", "critical"]

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's alert gauges; ``/metrics`` serves the values published in Redis instead."""
_GAUGE = Gauge("tasuki_alert", "Latest value of each scheduler alert gauge", ["name"], registry=REGISTRY)


@dataclass(frozen=True)
class Measurements:
    """What the alerts look at, read from the context store."""

    running_bytes: int
    completed_bytes: int
    running_count: int
    recent_finished: int
    recent_failed: int
    long_running: tuple[str, ...] = ()

    @property
    def failure_rate(self) -> float:
        """Failed or timed-out share of the recently finished tasks (0 when none finished)."""
        return self.recent_failed / self.recent_finished if self.recent_finished else 0.0


@dataclass(frozen=True)
class Alert:
    """One threshold crossed."""

    name: Literal["disk", "failure_rate", "running", "runtime"]
    level: Level
    message: str
    value: float
    threshold: float


@dataclass(frozen=True)
class AlertReport:
    """The measurements, the alerts they raise, and when."""

    checked_at: datetime
    measurements: Measurements
    alerts: tuple[Alert, ...] = field(default=())

    def gauges(self) -> dict[str, float]:
        """Every gauge by name: the measurements, and each alert's level (0 ok, 1 warning, 2 critical)."""
        m = self.measurements
        values = {
            "disk_running_bytes": float(m.running_bytes),
            "disk_completed_bytes": float(m.completed_bytes),
            "running_tasks": float(m.running_count),
            "recent_finished_tasks": float(m.recent_finished),
            "recent_failed_tasks": float(m.recent_failed),
            "failure_rate": m.failure_rate,
            "long_running_tasks": float(len(m.long_running)),
            "checked_at_seconds": self.checked_at.timestamp(),
        }
        for name in ("disk", "failure_rate", "running", "runtime"):
            levels = [LEVELS[a.level] for a in self.alerts if a.name == name]
            values[f"alert_{name}"] = float(max(levels, default=0))
        return values


def evaluate(m: Measurements, limits: AlertSettings) -> tuple[Alert, ...]:
    """The alerts ``m`` raises under ``limits`` (pure)."""
    found: list[Alert] = []
    disk = m.running_bytes + m.completed_bytes
    disk_limits: tuple[tuple[Level, float], ...] = (
        ("critical", limits.disk_critical_gb),
        ("warning", limits.disk_warn_gb),
    )
    for level, limit_gb in disk_limits:
        if disk > limit_gb * GB:
            message = f"contexts use {disk / GB:.1f} GB (over {limit_gb:g} GB)"
            found.append(Alert("disk", level, message, disk, limit_gb * GB))
            break
    if m.failure_rate > limits.failure_rate:
        message = f"{m.recent_failed} of {m.recent_finished} recent tasks failed ({m.failure_rate:.0%})"
        found.append(Alert("failure_rate", "warning", message, m.failure_rate, limits.failure_rate))
    if m.running_count > limits.max_running:
        message = f"{m.running_count} tasks running (over {limits.max_running})"
        found.append(Alert("running", "warning", message, m.running_count, limits.max_running))
    if m.long_running:
        message = f"{len(m.long_running)} tasks running longer than {limits.max_runtime_h:g} h: " + ", ".join(
            m.long_running[:10]
        )
        found.append(Alert("runtime", "warning", message, len(m.long_running), limits.max_runtime_h))
    return tuple(found)


def measure(store: ContextStore, now: datetime, recent: timedelta, max_runtime: timedelta) -> Measurements:
    """Read disk use, recently finished tasks and running tasks' ages: the running contexts from their directories
    (few), the completed ones from the index's running totals (the same cost at any number of them)."""
    running = store.running_uuids()
    long_running = []
    for uuid in running:
        started = _state_time(store.running_path(uuid), "started_at")
        if started is not None and now - started > max_runtime:
            long_running.append(uuid)
    endings = store.index.ended_since(now - recent)
    return Measurements(
        running_bytes=disk_usage(store.base_dir / RUNNING_DIR),
        completed_bytes=store.index.totals(location=COMPLETED_DIR).disk_bytes,
        running_count=len(running),
        recent_finished=sum(endings.get(status, 0) for status in FINISHED),
        recent_failed=sum(endings.get(status, 0) for status in FAILURES),
        long_running=tuple(sorted(long_running)),
    )


def _state(directory: Path) -> dict[str, object]:
    try:
        return read_state(directory)
    except (OSError, ValueError, ContextError):
        return {}  # moved or being written meanwhile


def _state_time(directory: Path, name: str) -> datetime | None:
    value = _state(directory).get(name)
    return parse_iso(value) if isinstance(value, str) else None


def publish(report: AlertReport, client: redis.Redis | None) -> None:
    """Set this process's gauges and the Redis hash ``/metrics`` reads (a Redis error is logged, not raised)."""
    values = report.gauges()
    for name, value in values.items():
        _GAUGE.labels(name=name).set(value)
    if client is None:
        return
    try:
        client.hset(ALERTS_KEY, mapping={name: repr(value) for name, value in values.items()})
    except redis.RedisError as exc:
        log.warning("alert gauges not published", error=str(exc))


def check(store: ContextStore, limits: AlertSettings, now: datetime) -> AlertReport:
    """Measure and evaluate; log every alert as a structured event."""
    m = measure(store, now, timedelta(hours=limits.recent_h), timedelta(hours=limits.max_runtime_h))
    report = AlertReport(now, m, evaluate(m, limits))
    for a in report.alerts:
        emit = log.error if a.level == "critical" else log.warning
        emit("alert", alert=a.name, level=a.level, message=a.message, value=a.value, threshold=a.threshold)
    log.info("alerts checked", alerts=len(report.alerts), **report.gauges())
    return report


def alerts() -> AlertReport:
    """``tasuki alerts`` and ``tasuki.alerts``: check, log, and publish the gauges."""
    s = settings()
    report = check(context_store(s, index=False), s.alerts, utc_now())
    publish(report, redis_client())
    return report


def format_alerts(report: AlertReport) -> list[str]:
    """The measurements, then one line per alert (``ok`` when there is none)."""
    m = report.measurements
    lines = [
        f"checked at {iso(report.checked_at)}",
        f"disk: running/ {m.running_bytes / GB:.3f} GB, completed/ {m.completed_bytes / GB:.3f} GB",
        f"running tasks: {m.running_count}, longer than the limit: {len(m.long_running)}",
        f"recently finished: {m.recent_finished}, failed: {m.recent_failed} ({m.failure_rate:.0%})",
    ]
    lines += [f"{a.level.upper()} {a.name}: {a.message}" for a in report.alerts] or ["ok: no alerts"]
    return lines
