"""LLM providers behind one seam: ``Provider.chat(messages, tools) -> Reply`` (SPEC §5, issue 37)."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.llm import registry
from agent.llm.base import (
    ContextOverflow,
    LLMError,
    Message,
    ModelSpec,
    ModelUnavailable,
    Provider,
    Reply,
    ToolCall,
)
from agent.llm.retry import RetryPolicy, compute_backoff

__all__ = [
    "ContextOverflow",
    "LLMError",
    "Message",
    "ModelSpec",
    "ModelUnavailable",
    "Provider",
    "Reply",
    "RetryPolicy",
    "ToolCall",
    "compute_backoff",
    "make_provider",
]


def make_provider(
    provider: str,
    model: str,
    context_length: int,
    endpoint: str | None,
    api_key: str | None,
    *,
    timeout_s: float = 600.0,
    max_retries: int = 4,
    backoff_base_s: float = 1.0,
    backoff_max_s: float = 30.0,
    retry_for_s: float = 600.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Provider:
    """A provider from plain values (tests, benchmarks): a profile named after its provider; ``sleep`` does the
    retries' waiting (a test's records the waits and returns at once)."""
    spec = ModelSpec(provider, provider, model, context_length, endpoint)
    policy = RetryPolicy(max_retries, backoff_base_s, backoff_max_s, retry_for_s, sleep=sleep)
    return registry.build(spec, policy, timeout_s, api_key)
