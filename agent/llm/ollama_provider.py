"""The ``ollama`` provider: the official client, ``options.num_ctx`` set to the configured context length."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import httpx
import ollama
import pydantic

from agent.llm.base import ContextOverflow, Message, ModelSpec, Reply, ToolCall, parse_arguments
from agent.llm.overflow import is_context_overflow
from agent.llm.retry import (
    Failure,
    RetryPolicy,
    call_with_retries,
    is_retryable_status,
    one_line,
    retry_after_of,
)


class OllamaProvider:
    """Chat with native tool calling on an Ollama server; we set the context window, not the model file."""

    def __init__(self, spec: ModelSpec, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        self.spec = spec
        self.model = spec.model
        self.context_length = spec.context_length
        self.host = spec.endpoint or "http://localhost:11434"
        self._retry = retry
        self._client = ollama.Client(host=self.host, timeout=timeout_s, headers=dict(spec.headers) or None)

    def __repr__(self) -> str:
        return f"OllamaProvider(model={self.model!r}, host={self.host!r})"

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """One chat call, retried on rate limits, 5xx, timeouts and connection errors (Ollama keeps its own cache
        of the prompt's prefix: ``cache_key`` has nothing to name)."""
        converted = to_ollama_messages(messages)
        options: dict[str, Any] = {"num_ctx": self.context_length}
        if self.spec.temperature is not None:
            options["temperature"] = self.spec.temperature
        if self.spec.max_output_tokens is not None:
            options["num_predict"] = self.spec.max_output_tokens
        think = think_of(self.spec)
        request: dict[str, Any] = {"model": self.model, "messages": converted, "tools": tools or None}
        request["options"] = options
        if think is not None:
            request["think"] = think
        response = call_with_retries(
            lambda: self._send(converted, tools, think, options),
            self._classify,
            self._retry,
            provider=self.spec.provider,
            model=self.model,
        )
        return replace(reply_from_response(response, messages, self.model), request=request)

    def _send(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        think: bool | str | None,
        options: dict[str, Any],
    ) -> ollama.ChatResponse:
        try:
            return self._client.chat(
                model=self.model, messages=messages, tools=tools or None, stream=False, think=think, options=options
            )
        except ollama.ResponseError as exc:
            status = exc.status_code if exc.status_code > 0 else None
            if not is_context_overflow(status, None, str(exc.error)):
                raise
            raise ContextOverflow(
                f"{self.spec.provider} model {self.model!r}: the prompt does not fit the context window: "
                f"{one_line(str(exc.error))}",
                status,
            ) from exc

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, ollama.ResponseError):
            status = exc.status_code if exc.status_code > 0 else None
            reason = f"HTTP {status}: {one_line(str(exc.error))}" if status else one_line(str(exc.error))
            retryable = status is not None and is_retryable_status(status)
            return Failure(reason, retryable, status, retry_after_of(_response_headers(exc)))
        if isinstance(exc, httpx.TimeoutException):
            return Failure("request timed out", retryable=True)
        if isinstance(exc, ConnectionError | httpx.TransportError):
            return Failure(f"cannot connect to {one_line(self.host)} ({type(exc).__name__})", retryable=True)
        if isinstance(exc, ValueError | pydantic.ValidationError):
            return Failure(f"invalid request or response: {one_line(str(exc))}", retryable=False)
        return None


def think_of(spec: ModelSpec) -> bool | str | None:
    """Ollama's ``think``: the effort as a level for models that take one (gpt-oss: low, medium, high; Ollama has
    no "minimal", so that one turns thinking off), else on when the profile asks for thinking
    (``thinking_tokens``); None leaves the model's default."""
    if spec.effort == "minimal":
        return False
    if spec.effort is not None:
        return spec.effort
    return True if spec.thinking_tokens is not None else None


def _response_headers(exc: ollama.ResponseError) -> httpx.Headers | None:
    """The headers of the response an error came from: the client raises its ``ResponseError`` while handling
    httpx's ``HTTPStatusError`` (``from None`` hides it from tracebacks, not from ``__context__``)."""
    context = exc.__context__
    return context.response.headers if isinstance(context, httpx.HTTPStatusError) else None


def to_ollama_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI-style messages in Ollama's shape: arguments as dicts, tool results named by ``tool_name``; an
    assistant's thinking goes back in ``thinking``, where the model's template finds it (gpt-oss needs its
    reasoning beside the tool calls it led to)."""
    names_by_id: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        converted: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
        if role == "assistant" and isinstance(message.get("thinking"), str) and message["thinking"]:
            converted["thinking"] = message["thinking"]
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function", {})
                names_by_id[str(call.get("id", ""))] = function.get("name", "")
                arguments, _ = parse_arguments(function.get("arguments"))
                calls.append({"function": {"name": function.get("name", ""), "arguments": arguments}})
            converted["tool_calls"] = calls
        elif role == "tool":
            name = message.get("tool_name") or message.get("name") or names_by_id.get(message.get("tool_call_id", ""))
            if name:
                converted["tool_name"] = name
        out.append(converted)
    return out


def _call_id(messages: list[Message], index: int, name: str, arguments: dict[str, Any]) -> str:
    # Ollama sends no ids. Derive one from the request and the call, so the same answer to the same
    # conversation always gets the same id, and calls of different turns do not collide.
    last = messages[-1].get("content") if messages else None
    seed = json.dumps([len(messages), last, index, name, arguments], sort_keys=True, default=str)
    return f"call_{index}_{hashlib.sha256(seed.encode()).hexdigest()[:10]}"


def reply_from_response(response: ollama.ChatResponse, messages: list[Message], requested_model: str) -> Reply:
    """An Ollama chat response as a ``Reply`` (``prompt_eval_count``/``eval_count`` are its usage)."""
    calls: list[ToolCall] = []
    for index, call in enumerate(response.message.tool_calls or []):
        arguments = dict(call.function.arguments or {})
        calls.append(
            ToolCall(
                id=_call_id(messages, index, call.function.name, arguments),
                name=call.function.name,
                arguments=arguments,
            )
        )
    prompt, completion = response.prompt_eval_count, response.eval_count
    total = prompt + completion if prompt is not None and completion is not None else None
    return Reply(
        content=response.message.content or None,
        tool_calls=calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        model=response.model or requested_model,
        thinking=response.message.thinking or None,
    )


def build(spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> OllamaProvider:
    """The registry's entry: an Ollama server (it takes no key)."""
    return OllamaProvider(spec, retry, timeout_s)
