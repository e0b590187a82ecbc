"""What every provider of a hosted API (a key, a base URL, the vendor's SDK client) keeps the same way."""

from __future__ import annotations

from typing import Any, ClassVar

from agent.llm.base import LLMError, ModelSpec
from agent.llm.retry import RetryPolicy

LOCAL_API_KEY = "unused"
"""The key sent to a server at ``base_url`` that takes none (vLLM, llama.cpp, a gateway, a fake): the SDKs insist."""


class HostedProvider:
    """A provider that talks to its API through its vendor's client: the profile, the key (never shown), our retry
    policy (the client's own retries are off), and the client's options every such provider sets alike."""

    KEY_VARIABLE: ClassVar[str]
    """The environment variable a missing key is asked for, when the profile names none."""

    def __init__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        if not api_key and not spec.endpoint:
            variable = spec.api_key_env or self.KEY_VARIABLE
            raise LLMError(f"{spec.provider} model {spec.model!r}: no API key (set {variable}) and no base_url")
        self.spec = spec
        self.model = spec.model
        self.context_length = spec.context_length
        self.base_url = spec.endpoint
        self._api_key = api_key or LOCAL_API_KEY
        self._retry = retry
        self._timeout_s = timeout_s

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments of the vendor's client: key, base URL, timeout, no retries, the profile's headers."""
        return {
            "api_key": self._api_key,
            "base_url": self.spec.endpoint,
            "timeout": self._timeout_s,
            "max_retries": 0,
            "default_headers": dict(self.spec.headers) or None,
        }

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"
