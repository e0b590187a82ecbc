"""The ``openai-responses`` provider: OpenAI's Responses API, stateless, with the model's reasoning carried over.

Nothing is stored at OpenAI (``store: false``): every request holds the whole conversation as input items, and
each reply's reasoning items come back encrypted (``include: ["reasoning.encrypted_content"]``). They are kept
with the reply (``Reply.reasoning``, ``messages.jsonl``'s ``reasoning``) and sent back in place, before that
reply's message and function calls, so a reasoning model keeps its chain of thought across the tool calls of a
task instead of starting over at every step.

Reasoning summaries are not asked for: OpenAI refuses ``reasoning.summary`` to an organization it has not
verified (HTTP 400), and the encrypted items carry the reasoning. Summaries a server returns anyway, and the
``reasoning_text`` of open models behind a compatible server, become ``Reply.thinking``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import openai
from openai.types.responses import Response

from agent.llm.base import (
    ContextOverflow,
    Message,
    ModelSpec,
    Reply,
    ToolCall,
    arguments_text,
    parse_arguments,
    reasoning_for,
)
from agent.llm.hosted import HostedProvider
from agent.llm.openai_provider import classify_openai_error, raising_overflow
from agent.llm.overflow import is_context_overflow
from agent.llm.retry import Failure, RetryPolicy, call_with_retries, one_line

INCLUDE = ["reasoning.encrypted_content"]
_REASONING_KEYS = ("type", "id", "summary", "content", "encrypted_content")  # an input reasoning item's fields


class ResponseFailed(Exception):
    """A response that came back with ``status: "failed"`` and an error (HTTP 200 all the same)."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self.code = code


class ResponsesProvider(HostedProvider):
    """One ``POST /responses`` per step; our retry policy is the only one (client retries off)."""

    KEY_VARIABLE = "OPENAI_API_KEY"

    def __init__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        super().__init__(spec, api_key, retry, timeout_s)
        self._client = openai.OpenAI(**self.client_options())

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """One response, retried on rate limits, 5xx, timeouts and connection errors; a prompt too long for the
        window raises :class:`ContextOverflow` at once."""
        request = responses_request(self.spec, messages, tools, cache_key)
        # The client's own POST, as for Chat Completions: `responses.create` would walk the input items against
        # its TypedDicts first, and ours are already in the API's shape.
        response = call_with_retries(
            lambda: raising_overflow(lambda: self._post(request), self.spec, self._api_key),
            self._classify,
            self._retry,
            provider=self.spec.provider,
            model=self.model,
        )
        return replace(reply_from_response(response, self.spec), request=request)

    def _post(self, request: dict[str, Any]) -> Response:
        response = self._client.post("/responses", body=request, cast_to=Response)
        if response.status != "failed":
            return response
        code = response.error.code if response.error else None
        message = response.error.message if response.error else "the response failed"
        if is_context_overflow(None, code, message):
            detail = one_line(message, self._api_key)
            raise ContextOverflow(
                f"{self.spec.provider} model {self.model!r}: the prompt does not fit the context window: {detail}"
            )
        raise ResponseFailed(code, message)

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, ResponseFailed):
            # "server_error" and "rate_limit_exceeded" pass like their HTTP kin; the rest (an image it could not
            # read, a prompt it refused) would fail the same way again.
            retryable = exc.code in ("server_error", "rate_limit_exceeded")
            return Failure(f"response failed ({exc.code}): {one_line(str(exc), self._api_key)}", retryable)
        return classify_openai_error(exc, self.base_url or "the OpenAI API", self._api_key)


def responses_request(
    spec: ModelSpec, messages: list[Message], tools: list[dict[str, Any]] | None, cache_key: str | None
) -> dict[str, Any]:
    """The body of ``POST /responses`` for one step."""
    instructions, items = to_responses_input(messages, spec.provider)
    request: dict[str, Any] = {"model": spec.model, "input": items, "store": False, "include": list(INCLUDE)}
    if instructions:
        request["instructions"] = instructions
    if tools:
        request["tools"] = [function_tool(tool) for tool in tools]
    if cache_key:
        request["prompt_cache_key"] = cache_key  # part of the Responses API (compatible servers ignore it)
    if spec.effort is not None:
        request["reasoning"] = {"effort": spec.effort}
    if spec.max_output_tokens is not None:
        request["max_output_tokens"] = spec.max_output_tokens  # reasoning tokens count against it too
    if spec.temperature is not None:
        request["temperature"] = spec.temperature
    return request


def function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions tool schema in the Responses shape (name and parameters at the top).

    ``strict`` is off: the Responses API makes function tools strict by default, which demands every property
    be required and no other allowed, and our tools have optional arguments."""
    function = tool.get("function", tool)
    converted: dict[str, Any] = {
        "type": "function",
        "name": function["name"],
        "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        "strict": False,
    }
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def to_responses_input(messages: list[Message], provider: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Our records as ``instructions`` (the leading system messages) and ``input`` items.

    An assistant record becomes its reasoning items (those ``provider`` returned with it), its message, then a
    ``function_call`` per tool call, the order the API returned them in; a tool result becomes the
    ``function_call_output`` of its call. Reasoning with neither text nor calls after it is dropped: the API
    refuses a reasoning item without its following item."""
    leading: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "system" and not items:
            if text:
                leading.append(text)
        elif role == "assistant":
            items.extend(_assistant_items(message, provider, text))
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": str(message.get("tool_call_id", "")), "output": text}
            )
        elif role in ("user", "system", "developer"):
            items.append({"type": "message", "role": role, "content": text})
    return ("\n\n".join(leading) or None), items


def _assistant_items(message: Message, provider: str, text: str) -> list[dict[str, Any]]:
    calls = [
        {
            "type": "function_call",
            "call_id": str(call.get("id", f"call_{index}")),
            "name": call.get("function", {}).get("name", ""),
            "arguments": arguments_text(call.get("function", {}).get("arguments")),
        }
        for index, call in enumerate(message.get("tool_calls") or [])
    ]
    if not text and not calls:
        return []
    items = [_input_reasoning(item) for item in reasoning_for(message, provider) if isinstance(item, dict)]
    if text:
        said: dict[str, Any] = {"type": "message", "role": "assistant", "content": text}
        phase = message.get("reasoning", {}).get("phase") if isinstance(message.get("reasoning"), dict) else None
        if items and isinstance(phase, str):
            said["phase"] = phase  # gpt-5.3-codex and later read it back; dropping it can degrade them
        items.append(said)
    return items + calls


def _input_reasoning(item: dict[str, Any]) -> dict[str, Any]:
    return {key: item[key] for key in _REASONING_KEYS if item.get(key) is not None}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def reply_from_response(response: Response, spec: ModelSpec) -> Reply:
    """A response's output items as a ``Reply``: text, function calls, and the reasoning items to send back."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    phase: str | None = None
    for item in response.output:
        if item.type == "reasoning":
            reasoning.append(_input_reasoning(item.model_dump(mode="json", exclude_none=True)))
            thoughts.extend(part.text for part in item.summary if part.text)
            thoughts.extend(part.text for part in item.content or [] if part.text)
        elif item.type == "message":
            phase = item.phase or phase
            for part in item.content:
                texts.append(part.text if part.type == "output_text" else part.refusal)
        elif item.type == "function_call":
            arguments, raw = parse_arguments(item.arguments)
            calls.append(ToolCall(id=item.call_id, name=item.name, arguments=arguments, raw_arguments=raw))
        # Hosted tools (web search, code interpreter...) are never offered, so never expected back.
    usage = response.usage
    details = usage.input_tokens_details if usage else None
    kept: dict[str, Any] | None = None
    if reasoning:
        kept = {"provider": spec.provider, "items": reasoning}
        if phase:
            kept["phase"] = phase
    return Reply(
        content="".join(texts) or None,
        tool_calls=calls,
        prompt_tokens=usage.input_tokens if usage else None,
        completion_tokens=usage.output_tokens if usage else None,  # reasoning tokens included
        total_tokens=usage.total_tokens if usage else None,
        model=response.model or spec.model,
        cached_tokens=getattr(details, "cached_tokens", None),
        cache_write_tokens=getattr(details, "cache_write_tokens", None),
        thinking="\n\n".join(thoughts) or None,
        reasoning=kept,
    )


def build(spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> ResponsesProvider:
    """The registry's entry: the Responses API for ``spec``."""
    return ResponsesProvider(spec, api_key, retry, timeout_s)
