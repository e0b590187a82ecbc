"""The ``openai`` provider: the official client against any OpenAI-compatible ``base_url``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from worker.llm.base import LLMError, Message, ModelSpec, Reply, ToolCall, arguments_text, parse_arguments
from worker.llm.retry import Failure, RetryPolicy, call_with_retries, is_retryable_status, one_line

# Local servers (vLLM, llama.cpp, LM Studio, the replay model) ignore the key, but the client insists on one.
LOCAL_API_KEY = "unused"
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


class OpenAIProvider:
    """Chat completions with native tool calling; our retry policy is the only one (client retries off)."""

    def __init__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        if not api_key and not spec.endpoint:
            raise LLMError(f"openai model {spec.model!r}: no API key (set OPENAI_API_KEY) and no base_url")
        self.spec = spec
        self.model = spec.model
        self.context_length = spec.context_length
        self.base_url = spec.endpoint
        self._api_key = api_key or LOCAL_API_KEY
        self._retry = retry
        self._client = openai.OpenAI(
            api_key=self._api_key,
            base_url=spec.endpoint,
            timeout=timeout_s,
            max_retries=0,
            default_headers=dict(spec.headers) or None,
        )

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIProvider(model={self.model!r}, base_url={self.base_url!r})"

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """One chat completion, retried on rate limits, 5xx, timeouts and connection errors."""
        request: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages)}
        if tools:
            request["tools"] = tools
        # The client's own POST: `chat.completions.create` would first walk the messages and the tool schemas
        # against the request's TypedDicts (about 1 ms of CPU per call, a third of a minimal task's model
        # call) to rename aliased keys, and plain chat messages have none. Same HTTP client, errors and parsing.
        completion = call_with_retries(
            lambda: self._client.post("/chat/completions", body=request, cast_to=ChatCompletion),
            self._classify,
            self._retry,
            provider="openai",
            model=self.model,
        )
        return replace(reply_from_completion(completion, self.model), request=request)

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, openai.APITimeoutError):
            return Failure("request timed out", retryable=True)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            where = one_line(self.base_url or "the OpenAI API", self._api_key)
            return Failure(f"cannot connect to {where}: {one_line(str(cause), self._api_key)}", retryable=True)
        if isinstance(exc, openai.APIStatusError):
            detail = one_line(_error_detail(exc), self._api_key)
            return Failure(f"HTTP {exc.status_code}: {detail}", is_retryable_status(exc.status_code), exc.status_code)
        if isinstance(exc, openai.OpenAIError):
            return Failure(f"{type(exc).__name__}: {one_line(str(exc), self._api_key)}", retryable=False)
        return None


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return exc.message


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our records as the API wants them: only API keys, string contents, JSON-string tool arguments."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        keys = _MESSAGE_KEYS if role != "tool" else ("role", "content", "tool_call_id")
        clean = {key: message[key] for key in keys if message.get(key) not in (None, [])}
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
    )


def build(spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> OpenAIProvider:
    """The registry's entry: Chat Completions for ``spec``."""
    return OpenAIProvider(spec, api_key, retry, timeout_s)
