"""Spend (SPEC §16): what one model call used, what it cost, and a task's running totals in ``state.json``.

Pure: no clock, no Redis. The worker meters each call from the provider's answer and hands the figures here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

KINDS = ("agent", "summary", "memory", "embedding")
NO_PRICES = "no prices configured"
PER_MILLION = 1_000_000
_COUNTS = ("calls", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "tokens")


class Price(Protocol):
    """USD per million tokens of one model (``pricing.MODEL`` in the configuration)."""

    @property
    def input(self) -> float:
        """Prompt tokens not served from the provider's cache."""
        ...

    @property
    def cached_input(self) -> float:
        """Prompt tokens served from the provider's cache."""
        ...

    @property
    def output(self) -> float:
        """Completion tokens."""
        ...


class Prices(Protocol):
    """A price table: ``pricing`` itself, or :class:`contexts.prices.PriceBook` (the built-in table under it)."""

    def get(self, model: str) -> Price | None:
        """The price of ``model``, None when it has none."""
        ...


@dataclass(frozen=True)
class Usage:
    """One model call's usage as its provider reported it, and what the call was for.

    ``prompt_tokens`` is the whole prompt: fresh tokens, those read from the provider's cache (``cached_tokens``)
    and those written to it (``cache_write_tokens``)."""

    kind: str
    model: str
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    profile: str = ""
    """The model profile (``llm.models``) the call was made with; empty when unknown (records before profiles)."""

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens (cached prompt tokens are part of the prompt)."""
        return self.prompt_tokens + self.completion_tokens


def cost_of(usage: Usage, prices: Prices | Mapping[str, Price]) -> float | None:
    """USD of one call: fresh prompt tokens, cache reads, cache writes and output each at their price (a price
    without ``cache_write`` charges writes as input); ``None`` when the table has no price for its model."""
    price = prices.get(usage.model)
    if price is None:
        return None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    written = min(usage.cache_write_tokens, usage.prompt_tokens - cached)
    fresh = usage.prompt_tokens - cached - written
    write_price = getattr(price, "cache_write", None)
    write_price = price.input if write_price is None else write_price
    return (fresh * price.input + cached * price.cached_input + written * write_price
            + usage.completion_tokens * price.output) / PER_MILLION


def call_record(usage: Usage, cost: float | None) -> dict[str, Any]:
    """The per-call figures kept beside the step (the assistant message) or the summary that used them."""
    record: dict[str, Any] = {
        "kind": usage.kind,
        "model": usage.model,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "cost_usd": cost,
    }
    if usage.profile:
        record["profile"] = usage.profile
    return record


def usage_from_record(record: Mapping[str, Any]) -> tuple[Usage, float | None]:
    """A call's ``(usage, cost)`` back from its :func:`call_record` (a resume counts what a crash left uncounted)."""
    usage = Usage(str(record.get("kind", "agent")), str(record.get("model", "")), int(record.get("prompt_tokens", 0)),
                  int(record.get("completion_tokens", 0)), int(record.get("cached_tokens", 0)),
                  int(record.get("cache_write_tokens", 0)), str(record.get("profile") or ""))
    cost = record.get("cost_usd")
    return usage, float(cost) if cost is not None else None


def _add_cost(total: float | None, cost: float | None) -> float | None:
    if cost is None:
        return total
    return round((total or 0.0) + cost, 9)


def _add(bucket: Mapping[str, Any] | None, usage: Usage, cost: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {name: int((bucket or {}).get(name, 0)) for name in _COUNTS}
    out["calls"] += 1
    out["prompt_tokens"] += usage.prompt_tokens
    out["completion_tokens"] += usage.completion_tokens
    out["cached_tokens"] += usage.cached_tokens
    out["cache_write_tokens"] += usage.cache_write_tokens
    out["tokens"] += usage.tokens
    out["cost_usd"] = _add_cost((bucket or {}).get("cost_usd"), cost)
    return out


def add_usage(totals: Mapping[str, Any] | None, usage: Usage, cost: float | None, day: str) -> dict[str, Any]:
    """``state.json.usage`` with one more call: totals, per kind and model (``by_call``), per UTC day."""
    totals = dict(totals or {})
    by_call = dict(totals.get("by_call") or {})
    key = f"{usage.kind} {usage.model}"
    profile = usage.profile or str((by_call.get(key) or {}).get("profile") or "")
    by_call[key] = {"kind": usage.kind, "model": usage.model, **({"profile": profile} if profile else {}),
                    **_add(by_call.get(key), usage, cost)}
    by_day = dict(totals.get("by_day") or {})
    day_before = by_day.get(day) or {}
    by_day[day] = {"tokens": int(day_before.get("tokens", 0)) + usage.tokens,
                   "cost_usd": _add_cost(day_before.get("cost_usd"), cost)}
    return {**_add(totals, usage, cost), "by_call": by_call, "by_day": by_day}


def repo_of(task_key: Mapping[str, Any]) -> str:
    """The repository a task's spend is counted under: ``source/owner/name``."""
    return f"{task_key.get('task_source')}/{task_key.get('owner')}/{task_key.get('repo')}"


def format_tokens(state: Mapping[str, Any]) -> str:
    """A task's tokens, and how they split into prompt (cached) and completion once they were metered."""
    usage = state.get("usage")
    if not isinstance(usage, Mapping):
        return f"{int(state.get('total_tokens_used', 0)):,}"
    written = int(usage.get("cache_write_tokens", 0))
    return (f"{int(usage['tokens']):,} (prompt {int(usage['prompt_tokens']):,}, of which cached "
            f"{int(usage['cached_tokens']):,}{f', written to the cache {written:,}' if written else ''}; "
            f"completion {int(usage['completion_tokens']):,})")


def format_cost(cost: float | None, priced: bool = True) -> str:
    """A cost for people: dollars, or why there is none."""
    if not priced:
        return NO_PRICES
    if cost is None:
        return "no price for this model"
    return f"${cost:.4f}"


def over_task_limit(totals: Mapping[str, Any] | None, max_tokens: int | None, max_cost: float | None) -> str | None:
    """Why a task whose usage is ``totals`` must stop (its figures against its cap), or ``None``."""
    tokens = int((totals or {}).get("tokens", 0))
    cost = (totals or {}).get("cost_usd")
    if max_tokens is not None and tokens >= max_tokens:
        return f"budget: the task used {tokens} tokens, limits.task_tokens is {max_tokens}"
    if max_cost is not None and cost is not None and cost >= max_cost:
        return f"budget: the task cost ${cost:.4f}, limits.task_cost is ${max_cost:.4f}"
    return None
