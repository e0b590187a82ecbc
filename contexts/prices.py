"""What a model call costs (SPEC §16, issue 37): a built-in price table of the common hosted models, under the
operator's ``pricing``, looked up by a model's base name so that dated snapshots find their model.

Prices are USD per million tokens: fresh prompt tokens, prompt tokens read from the provider's cache, prompt
tokens written to it, and output tokens. Sources, read on 2026-12-06:

- Anthropic, https://docs.anthropic.com/en/docs/about-claude/pricing and
  https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing": base input, 5m cache writes, cache
  hits, output). A write to the 5-minute cache costs 1.25x the input price (the TTL Tasuki's breakpoints use; the
  1-hour TTL's 2x is not used); a read 0.1x. Sonnet 4/4.5 prompts over 200k tokens (the 1M-context beta) cost
  more; that tier is not modelled.
- OpenAI, https://platform.openai.com/docs/pricing (Standard tier), as the dated copies of it at
  https://deploybase.ai/articles/openai-pricing (March 2026) and github.com/simonw/llm-prices data/openai.json
  list it. OpenAI bills no premium for writing its prompt cache: a written token is an input token (o3 at its
  June 2025 price of $2/$8).

A model missing here has no price unless the operator gives one: its calls count tokens only, and no cost cap
applies to it. Local models (Ollama, llama.cpp, vLLM) are never in this table; a local server that answers under
a hosted model's name is priced as that model unless ``pricing`` says otherwise (``{input: 0, output: 0}``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, cast

ANTHROPIC_WRITE = 1.25
"""Anthropic's 5-minute cache write, as a multiple of the input price."""


@dataclass(frozen=True)
class Rate:
    """USD per million tokens of one model, every part known."""

    input: float
    cached_input: float
    cache_write: float
    output: float


def _anthropic(input_price: float, output: float) -> Rate:
    return Rate(input_price, round(input_price * 0.1, 6), round(input_price * ANTHROPIC_WRITE, 6), output)


def _openai(input_price: float, cached: float, output: float) -> Rate:
    return Rate(input_price, cached, input_price, output)


BUILT_IN: dict[str, Rate] = {
    # Anthropic (Claude 4.x)
    "claude-opus-4": _anthropic(15.0, 75.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-6": _anthropic(5.0, 25.0),
    "claude-opus-4-7": _anthropic(5.0, 25.0),
    "claude-opus-4-8": _anthropic(5.0, 25.0),
    "claude-sonnet-4": _anthropic(3.0, 15.0),
    "claude-sonnet-4-5": _anthropic(3.0, 15.0),
    "claude-sonnet-4-6": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    # OpenAI
    "gpt-5": _openai(1.25, 0.125, 10.0),
    "gpt-5-mini": _openai(0.25, 0.025, 2.0),
    "gpt-5-nano": _openai(0.05, 0.005, 0.40),
    "gpt-4.1": _openai(2.0, 0.50, 8.0),
    "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
    "gpt-4o": _openai(2.50, 1.25, 10.0),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
    "o3": _openai(2.0, 0.50, 8.0),
    "o4-mini": _openai(1.10, 0.275, 4.40),
}
"""Base model name -> its price (see the module's sources)."""

ALIASES = {"claude-opus-4-0": "claude-opus-4", "claude-sonnet-4-0": "claude-sonnet-4"}

_PREFIX = re.compile(r"^(?:[a-z]{2,}\.)+(?=claude-)")  # Bedrock's "anthropic." and "us.anthropic."
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+)?$")
_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def base_name(model: str) -> str:
    """The name a model is priced under: lower case, without a gateway's ``vendor/`` prefix, a Bedrock or Vertex
    decoration or a snapshot's date (``claude-sonnet-4-5-20250929`` and ``openai/gpt-4o-2024-08-06`` are
    ``claude-sonnet-4-5`` and ``gpt-4o``); Claude's dotted versions are written with dashes."""
    name = model.strip().lower().rsplit("/", 1)[-1].split("@", 1)[0]
    name = _BEDROCK_VERSION.sub("", _PREFIX.sub("", name))
    name = _SNAPSHOT.sub("", name)
    if name.startswith("claude-"):
        name = name.replace(".", "-")
    return ALIASES.get(name, name)


def built_in(model: str) -> Rate | None:
    """The built-in price of ``model`` (by its base name), or None."""
    return BUILT_IN.get(base_name(model))


def _number(price: Any, name: str) -> float | None:
    value = getattr(price, name, None)
    return float(value) if value is not None else None


class PriceBook:
    """The prices calls are charged at: the operator's ``pricing`` entry for the model (by its exact name, else by
    its base name), else the built-in table's. An operator's entry that gives no ``cache_write`` is charged at the
    vendor's write premium when the model is one whose vendor charges writes (Claude: 1.25x its input price), else
    at its input price."""

    def __init__(self, configured: Mapping[str, Any]) -> None:
        self.configured = dict(configured)
        self._by_base = {base_name(name): price for name, price in configured.items()}

    def get(self, model: str) -> Rate | None:
        """What ``model`` costs; None when neither the operator nor the table prices it."""
        price = self.configured.get(model)
        if price is None:
            price = self._by_base.get(base_name(model))
        if price is None:
            return built_in(model)
        input_price = float(price.input)
        write = _number(price, "cache_write")
        if write is None:
            known = built_in(model)
            premium = known.cache_write / known.input if known is not None and known.input else 1.0
            write = round(input_price * premium, 9)
        return Rate(input_price, _number(price, "cached_input") or 0.0, write, float(price.output))

    def knows(self, model: str) -> bool:
        """Whether ``model`` has a price."""
        return self.get(model) is not None


@functools.lru_cache(maxsize=16)
def price_book(configured: Hashable) -> PriceBook:
    """The price book of a ``pricing`` table (a mapping that hashes: the settings'), built once per table."""
    return PriceBook(cast(Mapping[str, Any], configured))
