"""One clock for staleness: the offset to Redis's ``TIME``, what is said about a skew, what /healthz lists."""

from __future__ import annotations

import json
import time

import pytest
import redis

from worker.names import CLOCK_SKEW_KEY
from worker.redis_clock import RedisClock, offset_s, record_skew, skew_note, skewed_nodes


def test_the_offset_is_redis_time_minus_the_middle_of_the_round_trip() -> None:
    assert offset_s((1_000_120, 500_000), sent=1_000_000.0, received=1_000_001.0) == pytest.approx(120.0)
    assert offset_s((999_880, 0), sent=1_000_000.0, received=1_000_000.0) == pytest.approx(-120.0)


@pytest.mark.parametrize(
    ("offset", "said"),
    [
        pytest.param(1.5, None, id="within the bound: nothing to say"),
        pytest.param(-2.0, None, id="exactly the bound"),
        pytest.param(120.0, "120.0s behind", id="two minutes behind"),
        pytest.param(-120.0, "120.0s ahead of", id="two minutes ahead"),
    ],
)
def test_a_skew_is_told_only_past_the_bound(offset: float, said: str | None) -> None:
    note = skew_note(offset, 2.0)
    assert (note is None) if said is None else (note is not None and said in note)


def test_only_recent_offsets_past_the_bound_are_listed() -> None:
    now = 1_000_000.0
    recorded: dict[bytes | str, bytes | str] = {
        b"slow": json.dumps({"offset_s": 120.0, "at": now - 10}).encode(),
        "fast": json.dumps({"offset_s": -90.5, "at": now - 10}),
        "fine": json.dumps({"offset_s": 0.3, "at": now - 10}),
        "long-gone": json.dumps({"offset_s": 300.0, "at": now - 3 * 86400}),
        "garbled": "not json",
    }
    assert skewed_nodes(recorded, now, 2.0) == {"slow": 120.0, "fast": -90.5}


def test_the_clock_tells_redis_time_after_measuring(redis_client: redis.Redis) -> None:
    clock = RedisClock()
    clock.observe((int(time.time()) + 3600, 0), time.time(), time.time())  # as if this host were an hour behind
    assert clock.epoch() - time.time() == pytest.approx(3600, abs=2)
    clock.measure(redis_client)  # the real Redis on this machine shares this host's clock
    assert abs(clock.offset) < 1.0
    assert abs(clock().timestamp() - time.time()) < 1.0
    record_skew(redis_client, "node-a", 42.0, clock.epoch())
    assert skewed_nodes(redis_client.hgetall(CLOCK_SKEW_KEY), clock.epoch(), 2.0) == {"node-a": 42.0}
