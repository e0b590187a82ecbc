"""Spend arithmetic (SPEC §16): prices per million tokens with cached input, a task's totals, its cap."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contexts.prices import Rate
from contexts.usage import (
    Usage,
    add_usage,
    call_record,
    cost_of,
    format_cost,
    format_tokens,
    over_task_limit,
    usage_from_record,
)


@dataclass(frozen=True)
class Price:
    input: float
    cached_input: float
    output: float


PRICES = {"gpt-4o": Price(input=2.5, cached_input=1.25, output=10.0)}


def test_cached_prompt_tokens_are_priced_at_the_cached_rate() -> None:
    usage = Usage("agent", "gpt-4o", prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=400_000)
    assert cost_of(usage, PRICES) == pytest.approx(0.6 * 2.5 + 0.4 * 1.25 + 0.1 * 10.0)


def test_cache_writes_are_priced_at_the_write_price_and_fresh_tokens_are_what_is_left() -> None:
    # Anthropic's usage: 1,000 fresh + 6,000 read + 3,000 written (prompt_tokens is the whole prompt).
    usage = Usage("agent", "claude", prompt_tokens=10_000, completion_tokens=500, cached_tokens=6_000,
                  cache_write_tokens=3_000)
    claude = {"claude": Rate(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)}
    assert cost_of(usage, claude) == pytest.approx((1_000 * 3.0 + 6_000 * 0.3 + 3_000 * 3.75 + 500 * 15.0) / 1e6)
    # A price without cache_write (an older table) charges writes as input: never cheaper than before writes counted.
    assert cost_of(usage, {"claude": Price(3.0, 0.3, 15.0)}) == pytest.approx(
        (4_000 * 3.0 + 6_000 * 0.3 + 500 * 15.0) / 1e6)
    # A provider that reports more cached and written than prompt tokens is never priced below zero fresh tokens.
    odd = Usage("agent", "claude", prompt_tokens=100, cached_tokens=80, cache_write_tokens=80)
    assert cost_of(odd, claude) == pytest.approx((80 * 0.3 + 20 * 3.75) / 1e6)


def test_cache_writes_and_the_profile_are_counted_in_the_totals_and_the_call_record() -> None:
    usage = Usage("agent", "claude-sonnet-4-5", 10_000, 500, 6_000, 3_000, profile="sonnet")
    totals = add_usage(add_usage(None, usage, 0.1, "2026-12-06"), Usage("agent", "claude-sonnet-4-5", 100), None,
                       "2026-12-06")
    assert totals["cache_write_tokens"] == 3_000
    bucket = totals["by_call"]["agent claude-sonnet-4-5"]
    assert (bucket["profile"], bucket["cache_write_tokens"], bucket["calls"]) == ("sonnet", 3_000, 2)
    record = call_record(usage, 0.1)
    assert (record["cache_write_tokens"], record["profile"]) == (3_000, "sonnet")
    assert usage_from_record(record) == (usage, 0.1)
    assert "written to the cache 3,000" in format_tokens({"usage": totals})


def test_a_model_without_a_price_has_no_cost_and_says_why() -> None:
    assert cost_of(Usage("agent", "local-llama", 1000, 10), PRICES) is None
    assert format_cost(None, priced=False) == "no prices configured"
    assert format_cost(None) == "no price for this model"


def test_totals_add_up_per_kind_and_model_and_per_utc_day() -> None:
    totals = add_usage(None, Usage("agent", "gpt-4o", 100, 10, 50), 0.5, "2026-11-24")
    totals = add_usage(totals, Usage("summary", "gpt-4o", 200, 20), 0.25, "2026-11-25")
    totals = add_usage(totals, Usage("agent", "gpt-4o", 300, 30), None, "2026-11-25")  # unpriced: tokens only
    assert (totals["calls"], totals["tokens"], totals["cached_tokens"], totals["cost_usd"]) == (3, 660, 50, 0.75)
    assert totals["by_call"]["agent gpt-4o"]["calls"] == 2
    assert totals["by_call"]["summary gpt-4o"]["tokens"] == 220
    assert totals["by_day"] == {"2026-11-24": {"tokens": 110, "cost_usd": 0.5},
                                "2026-11-25": {"tokens": 550, "cost_usd": 0.25}}


def test_a_task_stops_once_it_reaches_either_cap() -> None:
    totals = add_usage(None, Usage("agent", "gpt-4o", 900, 100), 0.02, "2026-11-25")
    assert over_task_limit(totals, 1001, None) is None
    assert over_task_limit(totals, 1000, None) == "budget: the task used 1000 tokens, limits.task_tokens is 1000"
    assert over_task_limit(totals, None, 0.02) == "budget: the task cost $0.0200, limits.task_cost is $0.0200"
    assert over_task_limit(None, 1, 0.01) is None
