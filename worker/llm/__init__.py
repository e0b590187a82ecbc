"""LLM providers behind one seam: ``Provider.chat(messages, tools) -> Reply`` (SPEC §5, issue 37)."""

from __future__ import annotations

from worker.llm import registry
from worker.llm.base import (
    ContextOverflow,
    LLMError,
    Message,
    ModelSpec,
    ModelUnavailable,
    Provider,
    Reply,
    ToolCall,
)
from worker.llm.retry import RetryPolicy, compute_backoff

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
) -> Provider:
    """A provider from plain values (tests, benchmarks): a profile named after its provider."""
    spec = ModelSpec(provider, provider, model, context_length, endpoint)
    return registry.build(spec, RetryPolicy(max_retries, backoff_base_s, backoff_max_s), timeout_s, api_key)
