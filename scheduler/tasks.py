"""The scheduler's Celery tasks, on the ``maintenance`` queue (SPEC §5, §7); the beat sends them.

``worker/celery.py`` names this module in its ``include`` list, so every ``celery -A worker`` process knows them.
"""

from __future__ import annotations

from typing import Any

from scheduler import jobs
from scheduler.alerts import alerts as check_alerts
from worker.celery import app
from worker.names import ALERTS, REAP_STALE, RETENTION


@app.task(name=REAP_STALE, ignore_result=True)
def reap_stale() -> dict[str, int]:
    """The monitor's frequent pass: candidates from the heartbeat index and the listing of ``running/``."""
    return jobs.summarize_outcomes(jobs.reap(deep=False))


@app.task(name=RETENTION, ignore_result=True)
def retention() -> dict[str, int]:
    """Daily: a deep repair pass, then gzip and delete old completed contexts (fleet mode: forget every host's)."""
    actions = jobs.retention()
    return {kind: sum(a.action == kind for a in actions) for kind in ("gzip", "delete", "forget")}


@app.task(name=ALERTS, ignore_result=True)
def alerts() -> dict[str, Any]:
    """Check the alert thresholds; log and publish the gauges."""
    report = check_alerts()
    return {"alerts": [a.name for a in report.alerts]}
