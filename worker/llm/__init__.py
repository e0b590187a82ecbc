"""LLM providers behind one seam: ``Provider.chat(messages, tools) -> Reply`` (SPEC §5)."""

from __future__ import annotations

from worker.llm.base import LLMError, Message, Provider, Reply, ToolCall
from worker.llm.retry import RetryPolicy, compute_backoff

PROVIDERS = ("openai", "ollama")

__all__ = [
    "PROVIDERS",
    "LLMError",
    "Message",
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
    base_url_or_host: str | None,
    api_key: str | None,
    *,
    timeout_s: float = 600.0,
    max_retries: int = 4,
    backoff_base_s: float = 1.0,
    backoff_max_s: float = 30.0,
) -> Provider:
    """The configured provider; ``base_url_or_host`` is the OpenAI ``base_url`` or the Ollama ``host``."""
    if provider == "openai":
        from worker.llm.openai_provider import OpenAIProvider

        return OpenAIProvider(
            model,
            context_length,
            base_url=base_url_or_host,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
        )
    if provider == "ollama":
        from worker.llm.ollama_provider import OllamaProvider

        return OllamaProvider(
            model,
            context_length,
            base_url_or_host,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
        )
    raise LLMError(f"unknown LLM provider {provider!r}: expected one of {', '.join(PROVIDERS)}")
