"""The beat: Tasuki's schedule on the maintenance queue, sent by exactly one of several beat processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from scheduler.beat import BeatLock, beat_schedule
from tests.helpers.beat_process import BeatProcess
from tests.helpers.celery_worker import worker_env
from worker.names import ALERTS, BEAT_LOCK_KEY, MAINTENANCE_QUEUE, REAP_STALE, RETENTION, SWEEP_ATTEMPTS
from worker.settings import Settings

pytestmark = pytest.mark.integration

POLL_S = 60.0


@pytest.fixture
def beat_env(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> dict[str, str]:
    (tmp_path / "config.yaml").write_text("")
    return worker_env({
        "TASUKI_CONFIG": str(tmp_path / "config.yaml"),
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__CONTEXTS__BASE_DIR": str(tmp_path / "contexts"),
        "TASUKI__MONITOR__INTERVAL_S": "1",
        "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2",
    })


@pytest.fixture
def beats(tmp_path: Path, beat_env: dict[str, str]) -> Iterator[list[BeatProcess]]:
    started = [BeatProcess(name, beat_env, tmp_path).start() for name in ("beat-a", "beat-b")]
    try:
        yield started
    finally:
        for beat in started:
            beat.stop()


def wait_until(predicate: Callable[[], bool], what: str, beats: list[BeatProcess]) -> None:
    deadline = time.monotonic() + POLL_S
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {b.name}\n{b.log_path.read_text(errors='replace')[-3000:]}" for b in beats)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.1)  # polling the beats' logs, bounded by the deadline


def test_schedule_has_the_monitor_alerts_and_retention_on_the_maintenance_queue() -> None:
    schedule = beat_schedule(Settings())
    assert {entry["task"] for entry in schedule.values()} == {REAP_STALE, ALERTS, RETENTION, SWEEP_ATTEMPTS}
    assert {entry["options"]["queue"] for entry in schedule.values()} == {MAINTENANCE_QUEUE}
    assert schedule["reap-stale"]["schedule"].total_seconds() == 30
    assert schedule["retention"]["schedule"].days == 1
    assert schedule["attempts"]["schedule"].total_seconds() == 300  # ten monitor intervals


def test_two_beats_send_one_schedule_and_the_standby_takes_over_when_the_holder_dies(
    beats: list[BeatProcess], redis_client: redis.Redis
) -> None:
    wait_until(lambda: sum(b.sends(REAP_STALE) for b in beats) >= 3, "three monitor runs sent", beats)
    holder, standby = sorted(beats, key=lambda b: -b.sends(REAP_STALE))
    assert standby.sends() == 0
    assert holder.process is not None
    assert f":{holder.process.pid}:" in str(redis_client.get(BEAT_LOCK_KEY))  # the lock names its holder

    holder.kill()  # no release: the standby waits out the lock's TTL
    wait_until(lambda: standby.sends(REAP_STALE) >= 2, "the standby sending", beats)
    sent_by_holder = holder.sends()
    wait_until(lambda: standby.sends(REAP_STALE) >= 4, "the standby sending on", beats)
    assert holder.sends() == sent_by_holder


def test_lock_is_held_by_one_of_two_contenders_and_released_for_the_other(redis_client: redis.Redis) -> None:
    first = BeatLock(redis_client, BEAT_LOCK_KEY, ttl_s=30, token="first")
    second = BeatLock(redis_client, BEAT_LOCK_KEY, ttl_s=30, token="second")
    assert first.hold()
    assert not second.hold()
    assert first.hold()  # the holder renews
    first.release()
    assert second.hold()
    assert not first.hold()
    second.release()
    assert redis_client.get(BEAT_LOCK_KEY) is None
