"""Retention and alerts on a real context store: back-dated completions, thresholds, structured events, and
the gauges published in Redis for ``/metrics`` — the CLI functions run as real processes on real settings."""

from __future__ import annotations

import gzip
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
import structlog

from contexts import ContextStore
from contexts.clock import iso
from contexts.summary import disk_usage
from scheduler.alerts import Measurements, check, evaluate
from tests.helpers.celery_worker import REPO_ROOT, worker_env
from tests.helpers.context_support import CONFIG, TASK_KEY
from worker.names import ALERTS_KEY
from worker.settings_models import AlertSettings

NOW = datetime.now(UTC)


def finished(store: ContextStore, status: str, days_ago: float) -> str:
    """A task that ended ``days_ago``: run by a store whose clock says so, as the index learns of it then."""
    then = ContextStore(store.base_dir, clock=lambda: NOW - timedelta(days=days_ago))
    ctx = then.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "the task")
    ctx.append_message("assistant", "done")
    ctx.finish(status, error="boom" if status == "failed" else None)
    return ctx.uuid


def job_env(base: Path, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """Real settings for a fresh process: this test's store and Redis, at most one running task."""
    (tmp_path / "config.yaml").write_text("")
    return worker_env({
        "TASUKI_CONFIG": str(tmp_path / "config.yaml"),
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__CONTEXTS__BASE_DIR": str(base),
        "TASUKI__ALERTS__MAX_RUNNING": "1",
    })


def run_job(code: str, base: Path, redis_url: str, tmp_path: Path) -> str:
    """Run ``code`` (importing from scheduler.jobs / scheduler.alerts) in a fresh process on real settings."""
    setup = "from worker.logging import configure_logging; configure_logging('WARNING'); "  # as the CLI does
    done = subprocess.run([sys.executable, "-c", setup + code], cwd=REPO_ROOT, env=job_env(base, redis_url, tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def tasuki_alerts(base: Path, redis_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real ``tasuki alerts`` command, from another working directory."""
    return subprocess.run([sys.executable, "-m", "cli.main", "alerts"], cwd=tmp_path,
                          env=job_env(base, redis_url, tmp_path), capture_output=True, text=True, timeout=120,
                          check=False)


RETENTION = (
    "from scheduler.jobs import retention, format_retention as f; "
    "print('\\n'.join(f(retention({dry}), dry_run={dry})))"
)


def test_retention_gzips_after_seven_days_and_deletes_after_thirty_counted_from_completed_at(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    base = tmp_path / "contexts"
    store = ContextStore(base)
    fresh, week, month = finished(store, "completed", 1), finished(store, "failed", 8), finished(store, "completed", 31)

    preview = run_job(RETENTION.format(dry=True), base, redis_url, tmp_path)
    assert sorted(preview.split()) == sorted(
        [week, "would", "gzip", "(completed", f"{iso(NOW - timedelta(days=8))})",
         month, "would", "delete", "(completed", f"{iso(NOW - timedelta(days=31))})"]
    )
    assert sorted(store.completed_uuids()) == sorted([fresh, week, month])  # a dry run changes nothing

    output = run_job(RETENTION.format(dry=False), base, redis_url, tmp_path)
    assert {line.split()[0]: line.split()[1] for line in output.splitlines()} == {week: "gzip", month: "delete"}
    assert sorted(store.completed_uuids()) == sorted([fresh, week])
    assert (base / "completed" / fresh / "messages.jsonl").exists()
    assert not (base / "completed" / week / "messages.jsonl").exists()
    with gzip.open(base / "completed" / week / "messages.jsonl.gz", "rt") as zipped:
        assert [line for line in zipped if line.strip()][-1].find('"done"') > 0


def test_alerts_cross_every_threshold_and_log_each_as_a_structured_event(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts")
    finished(store, "completed", 0.1)
    finished(store, "failed", 0.2)
    finished(store, "failed", 3)  # not recent: outside the 24 h window
    seven_hours_ago = ContextStore(tmp_path / "contexts", clock=lambda: NOW - timedelta(hours=7))
    old = seven_hours_ago.create(TASK_KEY, CONFIG, heartbeat=False)
    young = store.create(TASK_KEY, CONFIG, heartbeat=False)
    limits = AlertSettings(disk_warn_gb=1e-9, disk_critical_gb=1.0, failure_rate=0.1, max_running=1, max_runtime_h=6)

    with structlog.testing.capture_logs() as events:
        report = check(store, limits, NOW)

    m = report.measurements
    assert (m.running_count, m.recent_finished, m.recent_failed, m.long_running) == (2, 2, 1, (old.uuid,))
    assert m.running_bytes > 0
    assert m.completed_bytes > 0
    assert {(a.name, a.level) for a in report.alerts} == {
        ("disk", "warning"), ("failure_rate", "warning"), ("running", "warning"), ("runtime", "warning")
    }
    alerts = [e for e in events if e["event"] == "alert"]
    assert sorted(e["alert"] for e in alerts) == ["disk", "failure_rate", "running", "runtime"]
    assert all(e["log_level"] == "warning" for e in alerts)
    old.detach()
    young.detach()


def test_alerts_take_completed_contexts_from_the_index_without_reading_their_directories(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts")
    finished(store, "failed", 0.1)
    finished(store, "completed", 0.2)
    completed_bytes = disk_usage(store.base_dir / "completed")
    for uuid in store.completed_uuids():  # what a walk of completed/ would need is gone; the index still knows
        (store.completed_path(uuid) / "state.json").unlink()

    m = check(ContextStore(tmp_path / "contexts"), AlertSettings(), NOW).measurements

    assert (m.recent_finished, m.recent_failed, m.completed_bytes) == (2, 1, completed_bytes)


def test_no_alert_below_the_thresholds_and_critical_disk_above_the_critical_one() -> None:
    quiet = Measurements(running_bytes=10, completed_bytes=10, running_count=1, recent_finished=20, recent_failed=2)
    assert evaluate(quiet, AlertSettings()) == ()
    full = Measurements(running_bytes=60 * 1024**3, completed_bytes=0, running_count=0, recent_finished=0,
                        recent_failed=0)
    assert [(a.name, a.level) for a in evaluate(full, AlertSettings())] == [("disk", "critical")]


def test_alerts_command_prints_the_report_publishes_the_gauges_and_exits_1_while_an_alert_fires(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    base = tmp_path / "contexts"
    store = ContextStore(base)
    finished(store, "failed", 0.1)
    for _ in range(2):
        store.create(TASK_KEY, CONFIG, heartbeat=False).detach()

    done = tasuki_alerts(base, redis_url, tmp_path)
    output = done.stdout

    assert done.returncode == 1, done.stderr  # scripts and cron jobs rely on it: non-zero while an alert fires
    assert "running tasks: 2, longer than the limit: 0" in output
    assert "WARNING running: 2 tasks running (over 1)" in output
    assert "WARNING failure_rate: 1 of 1 recent tasks failed (100%)" in output
    gauges = redis_client.hgetall(ALERTS_KEY)
    assert float(gauges["running_tasks"]) == 2
    assert float(gauges["failure_rate"]) == 1.0
    assert float(gauges["alert_running"]) == 1  # warning
    assert float(gauges["alert_disk"]) == 0


def test_alerts_command_exits_0_when_all_is_clear(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    finished(ContextStore(tmp_path / "contexts"), "completed", 0.1)

    done = tasuki_alerts(tmp_path / "contexts", redis_url, tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: no alerts" in done.stdout
