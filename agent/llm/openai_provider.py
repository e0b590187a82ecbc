"""The ``openai`` provider: the official client against any OpenAI-compatible ``base_url``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import openai
from openai.types.chat import ChatCompletion

from agent.llm.base import (
    ContextOverflow,
    LLMError,
    Message,
    ModelSpec,
    Reply,
    ToolCall,
    arguments_text,
    parse_arguments,
)
from agent.llm.hosted import HostedProvider
from agent.llm.overflow import is_context_overflow
from agent.llm.retry import (
    Failure,
    RetryPolicy,
    call_with_retries,
    is_retryable_status,
    one_line,
    retry_after_of,
)

# Local servers (vLLM, llama.cpp, LM Studio, the replay model) ignore the key, but the client insists on one.
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
_READABLE_REASONING_FIELDS = ("reasoning_content", "reasoning")  # vLLM, llama.cpp, LM Studio, DeepSeek; newer vLLM
T = TypeVar("T")


class OpenAIProvider(HostedProvider):
    """Chat completions with native tool calling; our retry policy is the only one (client retries off)."""

    KEY_VARIABLE = "OPENAI_API_KEY"

    def __init__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        super().__init__(spec, api_key, retry, timeout_s)
        self._client = openai.OpenAI(**self.client_options())

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """One chat completion, retried on rate limits, 5xx, timeouts and connection errors; a prompt too long
        for the window raises :class:`ContextOverflow` at once."""
        dialect = dialect_of(str(self._client.base_url))
        request: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(messages, reasoning_content=dialect.reasoning_content),
        }
        if tools:
            request["tools"] = tools
        request.update(generation_options(self.spec, dialect))
        if cache_key and dialect.prompt_cache_key:
            request["prompt_cache_key"] = cache_key
        # The client's own POST: `chat.completions.create` would first walk the messages and the tool schemas
        # against the request's TypedDicts (about 1 ms of CPU per call, a third of a minimal task's model
        # call) to rename aliased keys, and plain chat messages have none. Same HTTP client, errors and parsing.
        completion = call_with_retries(
            lambda: raising_overflow(
                lambda: self._client.post("/chat/completions", body=request, cast_to=ChatCompletion),
                self.spec,
                self._api_key,
            ),
            self._classify,
            self._retry,
            provider=self.spec.provider,
            model=self.model,
        )
        return replace(reply_from_completion(completion, self.model), request=request)

    def _classify(self, exc: Exception) -> Failure | None:
        return classify_openai_error(exc, self.base_url or "the OpenAI API", self._api_key)


@dataclass(frozen=True)
class Dialect:
    """What a Chat Completions server reads beyond the common core, told by its host."""

    prompt_cache_key: bool
    """OpenAI routes requests with the same key to the same cache. Groq, Cerebras, Mistral, NVIDIA NIM and Azure AI
    Foundry answer the unknown field with a 400/422; llama.cpp and vLLM keep a prefix cache without a key."""
    max_completion_tokens: bool
    """OpenAI's reasoning models (Azure's too) refuse ``max_tokens``; DeepSeek and LM Studio read only it (llama.cpp
    and vLLM read both)."""
    reasoning_content: bool
    """An assistant's thinking goes back as ``reasoning_content`` beside its tool calls: DeepSeek's thinking mode
    refuses a tool turn without it, llama.cpp's and vLLM's templates read it; OpenAI and Azure refuse unknown
    message fields."""


OPENAI = Dialect(prompt_cache_key=True, max_completion_tokens=True, reasoning_content=False)
AZURE_OPENAI = Dialect(prompt_cache_key=False, max_completion_tokens=True, reasoning_content=False)
COMPATIBLE = Dialect(prompt_cache_key=False, max_completion_tokens=False, reasoning_content=True)


def dialect_of(base_url: str | None) -> Dialect:
    """The dialect of the server at ``base_url`` (None: the client's default, OpenAI's own API)."""
    host = (urlsplit(base_url).hostname or "").lower() if base_url else "api.openai.com"
    if host == "openai.com" or host.endswith(".openai.com"):
        return OPENAI
    if host.endswith(".openai.azure.com"):
        return AZURE_OPENAI
    return COMPATIBLE


def generation_options(spec: ModelSpec, dialect: Dialect) -> dict[str, Any]:
    """The profile's sampling settings in the words ``dialect`` reads (``reasoning_effort`` as the profile names
    it: vLLM and DeepSeek read it too)."""
    options: dict[str, Any] = {}
    if spec.temperature is not None:
        options["temperature"] = spec.temperature
    if spec.max_output_tokens is not None:
        options["max_completion_tokens" if dialect.max_completion_tokens else "max_tokens"] = spec.max_output_tokens
    if spec.effort is not None:
        options["reasoning_effort"] = spec.effort
    return options


def classify_openai_error(exc: Exception, where: str, secret: str) -> Failure | None:
    """How the ``openai`` client's exceptions are retried (shared by Chat Completions and Responses)."""
    if isinstance(exc, openai.APITimeoutError):
        return Failure("request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return Failure(f"cannot connect to {one_line(where, secret)}: {one_line(str(cause), secret)}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        detail = one_line(error_detail(exc), secret)
        return Failure(
            f"HTTP {exc.status_code}: {detail}",
            is_retryable_status(exc.status_code),
            exc.status_code,
            retry_after_of(exc.response.headers),
        )
    if isinstance(exc, openai.OpenAIError):
        return Failure(f"{type(exc).__name__}: {one_line(str(exc), secret)}", retryable=False)
    return None


def raising_overflow(call: Callable[[], T], spec: ModelSpec, secret: str) -> T:
    """``call()``, with a rejection for a prompt too long for the window raised as :class:`ContextOverflow`
    (never retried as it is: the agent compresses and sends the step again)."""
    try:
        return call()
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        code = body.get("code") if isinstance(body.get("code"), str) else body.get("type")
        if not is_context_overflow(exc.status_code, code, error_detail(exc)):
            raise
        detail = one_line(error_detail(exc), secret)
        raise ContextOverflow(
            f"{spec.provider} model {spec.model!r}: the prompt does not fit the context window: {detail}",
            exc.status_code,
        ) from exc


def error_detail(exc: openai.APIStatusError) -> str:
    """The server's own message for a failed request (the ``error.message`` of OpenAI's shape and its kin)."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    if isinstance(body, str) and body:
        return body  # {"error": "text"}, as LM Studio and some gateways answer
    return exc.message


def to_openai_messages(messages: list[Message], *, reasoning_content: bool = False) -> list[dict[str, Any]]:
    """Our records as the API wants them: only API keys, string contents, JSON-string tool arguments; with
    ``reasoning_content`` (:class:`Dialect`), an assistant message that called tools carries its thinking back."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        keys = _MESSAGE_KEYS if role != "tool" else ("role", "content", "tool_call_id")
        clean = {key: message[key] for key in keys if message.get(key) not in (None, [])}
        if reasoning_content and role == "assistant" and clean.get("tool_calls") and message.get("thinking"):
            clean["reasoning_content"] = message["thinking"]
        if role != "assistant" or "tool_calls" not in clean:
            clean["content"] = clean.get("content") or ""  # only an assistant's tool call may lack text
        if role != "assistant":
            clean.pop("tool_calls", None)
        else:
            clean.setdefault("content", None)
        if "tool_calls" in clean:
            clean["tool_calls"] = [
                {
                    "id": call.get("id", f"call_{index}"),
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": arguments_text(call["function"].get("arguments")),
                    },
                }
                for index, call in enumerate(clean["tool_calls"])
            ]
        out.append(clean)
    return out


def reply_from_completion(completion: ChatCompletion, requested_model: str) -> Reply:
    """The first choice of a completion as a ``Reply``."""
    if not completion.choices:
        raise LLMError(f"openai model {requested_model!r} returned no choices")
    message = completion.choices[0].message
    calls: list[ToolCall] = []
    for call in message.tool_calls or []:
        if call.type != "function":
            continue  # custom tools are never offered, so never expected back
        arguments, raw = parse_arguments(call.function.arguments)
        calls.append(ToolCall(id=call.id, name=call.function.name, arguments=arguments, raw_arguments=raw))
    usage = completion.usage
    details = usage.prompt_tokens_details if usage else None
    return Reply(
        content=message.content or None,
        tool_calls=calls,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        total_tokens=usage.total_tokens if usage else None,
        model=completion.model or requested_model,
        cached_tokens=details.cached_tokens if details else None,
        cache_write_tokens=details.cache_write_tokens if details else None,
        thinking=readable_reasoning(message.model_extra),
    )


def readable_reasoning(extra: dict[str, Any] | None) -> str | None:
    """The reasoning a compatible server returns beside the content (a field OpenAI's own API does not have,
    so the client keeps it among the message's extra fields)."""
    for name in _READABLE_REASONING_FIELDS:
        value = (extra or {}).get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def build(spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> OpenAIProvider:
    """The registry's entry: Chat Completions for ``spec``."""
    return OpenAIProvider(spec, api_key, retry, timeout_s)
