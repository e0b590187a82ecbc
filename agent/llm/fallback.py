"""Fallback profiles: when a model stays down for a whole retry window, the next profile of an ordered list takes
the same request, so an outage of one provider costs a task minutes, not its work.

The reply says which model answered (``Reply.model``), so the step is metered at that model's price. A profile
found down is passed over by later requests for ``cooldown_s`` (a task would otherwise wait out the window again at
every step), then tried first again. Reasoning a provider recorded for itself is sent back only to that provider
(:func:`agent.llm.base.reasoning_for`): a conversation moves between providers without breaking either.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from agent.llm.base import Message, ModelSpec, ModelUnavailable, Provider, Reply

log = structlog.get_logger(__name__)


class FallbackProvider:
    """The first profile of ``chain`` that answers; :class:`ModelUnavailable` only when every one was down.

    It presents itself as the first profile (``spec``, ``model``, ``context_length``): the task's own."""

    def __init__(
        self, chain: Sequence[Provider], cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not chain:
            raise ValueError("a fallback chain needs at least one provider")
        self.chain = tuple(chain)
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.spec: ModelSpec = self.chain[0].spec
        self.model = self.chain[0].model
        self.context_length = self.chain[0].context_length
        self._down_until: dict[int, float] = {}  # index in the chain -> when it is tried first again

    def __repr__(self) -> str:
        return f"FallbackProvider({', '.join(p.spec.name for p in self.chain)})"

    def candidates(self, now: float) -> list[Provider]:
        """The profiles to try, in order: those not found down lately (every one when all were)."""
        up = [p for i, p in enumerate(self.chain) if self._down_until.get(i, 0.0) <= now]
        return up or list(self.chain)

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """The same request to each candidate in turn until one answers."""
        tried: list[str] = []
        candidates = self.candidates(self.clock())
        for position, provider in enumerate(candidates):
            try:
                return provider.chat(messages, tools, cache_key=cache_key)
            except ModelUnavailable as exc:
                self._down_until[self.chain.index(provider)] = self.clock() + self.cooldown_s
                tried.append(provider.spec.name)
                if position + 1 == len(candidates):
                    raise ModelUnavailable(f"{exc} (profiles tried: {', '.join(tried)})", exc.status) from exc
                log.warning(
                    "model unavailable; the next profile takes over",
                    profile=provider.spec.name,
                    fallback=candidates[position + 1].spec.name,
                    error=str(exc),
                )
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
