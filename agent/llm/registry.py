"""The provider registry: each provider is a module with a ``build`` function and one line here.

The only place a provider's name is compared. Modules are imported when first used: a worker talking to Ollama
never imports the Anthropic SDK.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol

from agent.llm.base import LLMError, ModelSpec, Provider
from agent.llm.retry import RetryPolicy

PROVIDERS: dict[str, str] = {
    "openai": "agent.llm.openai_provider",  # Chat Completions: OpenAI and every compatible server
    "openai-responses": "agent.llm.responses_provider",  # Responses: stateless, encrypted reasoning sent back
    "ollama": "agent.llm.ollama_provider",
    "anthropic": "agent.llm.anthropic_provider",  # Messages API: cache breakpoints, extended thinking
}
"""Registry name -> the module whose ``build`` makes that provider."""

API_KEY_ENV: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
"""The environment variable a provider's key is read from when the profile names none."""


class Builder(Protocol):
    """A provider module's ``build``."""

    def __call__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> Provider:
        """The provider for ``spec``; ``api_key`` is None when the environment holds none."""
        ...


def known(name: str) -> bool:
    """Whether ``name`` is a registered provider."""
    return name in PROVIDERS


def names() -> tuple[str, ...]:
    """The registered providers' names, for error messages and the configuration reference."""
    return tuple(PROVIDERS)


def api_key_of(spec: ModelSpec) -> str | None:
    """The key for ``spec`` from the environment (the profile's ``api_key_env``, else the provider's usual one)."""
    variable = spec.api_key_env or API_KEY_ENV.get(spec.provider)
    return (os.environ.get(variable) or None) if variable else None


def build(spec: ModelSpec, retry: RetryPolicy, timeout_s: float, api_key: str | None = None) -> Provider:
    """The provider ``spec`` names; ``api_key`` overrides the environment's (tests, the settings' secrets)."""
    module = PROVIDERS.get(spec.provider)
    if module is None:
        raise LLMError(f"unknown LLM provider {spec.provider!r}: expected one of {', '.join(PROVIDERS)}")
    builder: Builder = importlib.import_module(module).build
    return builder(spec, api_key if api_key is not None else api_key_of(spec), retry, timeout_s)
