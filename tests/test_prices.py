"""The built-in price table (issue 37): common models priced out of the box, dated snapshots matching their model,
cache writes at the vendor's price, the operator's ``pricing`` overriding entry by entry, and the default cost cap
applying only where a price is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from contexts.prices import BUILT_IN, PriceBook, Rate, base_name, built_in
from contexts.usage import Usage, cost_of
from worker.settings import ConfigError, load_settings
from worker.settings_models import DEFAULT_TASK_COST, ModelPrice


@pytest.mark.parametrize(
    ("reported", "model"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-opus-4-20250514", "claude-opus-4"),
        ("claude-opus-4-0", "claude-opus-4"),
        ("anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),  # a gateway's name
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5"),  # Bedrock's
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),  # Vertex's
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-5-nano", "gpt-5-nano"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("o3-2025-04-16", "o3"),
        ("o4-mini-2025-04-16", "o4-mini"),
        ("openai/gpt-5-mini", "gpt-5-mini"),
        ("GPT-4o", "gpt-4o"),
    ],
)
def test_dated_snapshots_and_decorated_names_find_their_model(reported: str, model: str) -> None:
    assert base_name(reported) == model
    assert built_in(reported) == BUILT_IN[model]


@pytest.mark.parametrize("name", ["qwen3:30b", "scripted", "gpt-4o-audio-preview", "gpt-5-pro", "o3-pro",
                                  "claude-3-opus-20240229", "llama3.1:8b", "gpt-oss-20b"])
def test_other_models_have_no_built_in_price(name: str) -> None:
    # A near name is not the model: gpt-5-pro costs 12x gpt-5, so a prefix match would under-count it.
    assert built_in(name) is None


def test_the_table_holds_the_vendors_published_prices() -> None:
    assert BUILT_IN["claude-sonnet-4-5"] == Rate(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)
    assert BUILT_IN["claude-opus-4-1"] == Rate(input=15.0, cached_input=1.5, cache_write=18.75, output=75.0)
    assert BUILT_IN["claude-haiku-4-5"] == Rate(input=1.0, cached_input=0.1, cache_write=1.25, output=5.0)
    assert BUILT_IN["gpt-5"] == Rate(input=1.25, cached_input=0.125, cache_write=1.25, output=10.0)
    assert BUILT_IN["gpt-4o-mini"] == Rate(input=0.15, cached_input=0.075, cache_write=0.15, output=0.60)
    for name, rate in BUILT_IN.items():
        assert rate.cached_input < rate.input < rate.output, name
        # Anthropic bills a cache write at 1.25x input; OpenAI bills none beyond input.
        assert rate.cache_write == pytest.approx(rate.input * (1.25 if name.startswith("claude-") else 1.0)), name


def test_a_claude_step_with_cache_reads_and_writes_costs_what_anthropic_bills() -> None:
    book = PriceBook({})
    usage = Usage("agent", "claude-sonnet-4-5-20250929", prompt_tokens=50_000, completion_tokens=800,
                  cached_tokens=40_000, cache_write_tokens=9_000)
    # 1,000 fresh x $3 + 40,000 read x $0.30 + 9,000 written x $3.75 + 800 out x $15, per million
    assert cost_of(usage, book) == pytest.approx((3_000 + 12_000 + 33_750 + 12_000) / 1e6)


def test_the_operators_pricing_overrides_the_table_entry_by_entry() -> None:
    book = PriceBook({
        "gpt-4o": ModelPrice(input=2.0, cached_input=1.0, output=8.0),  # a negotiated price, no cache_write given
        "claude-sonnet-4-5": ModelPrice(input=2.0, cached_input=0.2, output=10.0),
        "my-llama": ModelPrice(input=0.0, output=0.0),  # a local model the operator calls free
        "claude-haiku-4-5-20251001": ModelPrice(input=0.5, cached_input=0.05, cache_write=0.5, output=2.5),
    })
    assert book.get("gpt-4o-2024-08-06") == Rate(2.0, 1.0, 2.0, 8.0)  # snapshot -> the operator's gpt-4o
    assert book.get("claude-sonnet-4-5-20250929") == Rate(2.0, 0.2, 2.5, 10.0)  # Claude's write premium, kept
    assert book.get("claude-haiku-4-5-20251001") == Rate(0.5, 0.05, 0.5, 2.5)  # an explicit write price wins
    assert book.get("my-llama") == Rate(0.0, 0.0, 0.0, 0.0)
    assert cost_of(Usage("agent", "my-llama", 10_000, 1_000), book) == 0.0
    assert book.get("gpt-5-mini") == BUILT_IN["gpt-5-mini"]  # untouched entries keep the built-in price
    assert book.get("qwen3:30b") is None


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_cost_cap_applies_by_default_and_an_explicit_one_needs_a_priced_model(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, ""), env={})
    assert settings.limits.task_cost == DEFAULT_TASK_COST == 3.0
    assert settings.prices_known()  # gpt-4o, the default model, has a built-in price
    local = "llm: {provider: ollama}\n"
    assert not load_settings(write_config(tmp_path, local), env={}).prices_known()  # the default cap: no error
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, local + "limits: {task_cost: 5}\n"), env={})
    assert str(caught.value) == ("config: limits.task_cost = 5.0: a price for a configured model (qwen3:30b) in "
                                 "pricing (no cost can be counted)")
    free = local + "limits: {task_cost: 5}\npricing: {qwen3:30b: {input: 0, output: 0}}\n"
    assert load_settings(write_config(tmp_path, free), env={}).limits.task_cost == 5.0
    # One priced profile among local ones is enough: its tasks can be capped.
    profiles = "limits: {repo_cost: 5}\nllm:\n  provider: ollama\n  models: {big: {provider: openai, model: gpt-5}}\n"
    assert load_settings(write_config(tmp_path, profiles), env={}).limits.repo_cost == 5.0
