"""The ``anthropic`` provider: Claude through the Messages API with the official client.

What the OpenAI-compatible layer cannot do, and why this provider exists (issue 37):

- **Prompt caching.** Cache breakpoints (``cache_control``) go on the last tool, the last system block, the
  newest message's last block and the end of the previous request (the block the previous step's newest-message
  breakpoint wrote): four, the API's limit. Anthropic caches the prefix ``tools -> system -> messages`` up to each
  breakpoint; a request reads the longest prefix an earlier request wrote (looking back 20 blocks from each
  breakpoint) and writes one at each breakpoint. The previous request's end as a breakpoint of its own keeps the
  read even when one step added more than 20 blocks (many parallel tool calls).
- **Extended thinking.** ``thinking_tokens`` sends ``thinking: {type: enabled, budget_tokens}``. A reply's
  thinking and redacted_thinking blocks are kept, signatures and all, in ``Reply.reasoning`` and go back first in
  that assistant message, unchanged, as the API requires across tool turns.

Usage: Anthropic's ``input_tokens`` counts only what was neither read from nor written to the cache;
``Reply.prompt_tokens`` is the whole prompt (input + reads + writes), ``cached_tokens`` the reads and
``cache_write_tokens`` the writes (billed at 1.25x).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import anthropic
import structlog
from anthropic.types import Message as AnthropicMessage

from agent.llm.base import (
    ContextOverflow,
    LLMError,
    Message,
    ModelSpec,
    Reply,
    ToolCall,
    parse_arguments,
    reasoning_for,
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

log = structlog.get_logger(__name__)

PROVIDER = "anthropic"
"""The name replies' reasoning is recorded under (``reasoning.provider``); the registry's name for this module."""
DEFAULT_MAX_TOKENS = 8192
"""``max_tokens`` when the profile sets no ``max_output_tokens`` (the API requires one)."""
MIN_THINKING_BUDGET = 1024  # the API's smallest budget_tokens
MAX_BREAKPOINTS = 4  # cache_control blocks the API accepts in one request
EPHEMERAL = {"type": "ephemeral"}
EMPTY_TEXT = "(empty)"  # the API refuses empty text blocks and messages without content
THINKING_TYPES = ("thinking", "redacted_thinking")
_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}


class AnthropicProvider(HostedProvider):
    """Messages API calls with native tool use; our retry policy is the only one (client retries off)."""

    KEY_VARIABLE = "ANTHROPIC_API_KEY"

    def __init__(self, spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float = 600.0) -> None:
        super().__init__(spec, api_key, retry, timeout_s)
        self._client = anthropic.Anthropic(**self.client_options())

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """One Messages call, retried on rate limits, overload (529), 5xx, timeouts and connection errors (waiting
        what ``retry-after`` asks); a prompt too long for the window raises :class:`ContextOverflow`.
        ``cache_key``: Anthropic routes by the prefix itself, there is nothing to name."""
        request = request_body(self.spec, messages, tools)
        try:
            message = call_with_retries(
                lambda: self._client.post("/v1/messages", body=request, cast_to=AnthropicMessage),
                self._classify,
                self._retry,
                provider=PROVIDER,
                model=self.model,
            )
        except LLMError as exc:
            if is_overflow(exc.__cause__):
                raise ContextOverflow(str(exc), exc.status) from exc.__cause__
            raise
        return replace(reply_from_message(message, self.model), request=request)

    def _classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, anthropic.APITimeoutError):
            return Failure("request timed out", retryable=True)
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ or exc
            where = one_line(self.base_url or "the Anthropic API", self._api_key)
            return Failure(f"cannot connect to {where}: {one_line(str(cause), self._api_key)}", retryable=True)
        if isinstance(exc, anthropic.APIStatusError):
            detail = one_line(exc.api_message or exc.message, self._api_key)
            return Failure(
                f"HTTP {exc.status_code}: {detail}",
                is_retryable_status(exc.status_code),
                exc.status_code,
                retry_after_of(exc.response.headers),  # Anthropic's 429s and 529s say how long to wait
            )
        if isinstance(exc, anthropic.AnthropicError):
            return Failure(f"{type(exc).__name__}: {one_line(str(exc), self._api_key)}", retryable=False)
        return None


def is_overflow(exc: BaseException | None) -> bool:
    """Whether the API refused the request for its length (400 "prompt is too long: N tokens > M maximum", or
    413 for a body past the size limit): compressing the history and sending the step again will pass."""
    if not isinstance(exc, anthropic.APIStatusError):
        return False
    if exc.status_code == 413:
        return True
    return exc.status_code == 400 and is_context_overflow(exc.status_code, exc.type, exc.api_message or exc.message)


def request_body(spec: ModelSpec, messages: list[Message], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The Messages API body for ``messages`` (OpenAI-style records) and ``tools`` (OpenAI function schemas),
    with its cache breakpoints, thinking and sampling settings."""
    system, converted = to_anthropic_messages(messages)
    body: dict[str, Any] = {"model": spec.model, "max_tokens": spec.max_output_tokens or DEFAULT_MAX_TOKENS}
    if system:
        body["system"] = system
    body["messages"] = converted
    if tools:
        body["tools"] = to_anthropic_tools(tools)
    budget = max(spec.thinking_tokens, MIN_THINKING_BUDGET) if spec.thinking_tokens else None
    thinking = spec.adaptive_thinking or budget is not None
    if thinking and not thinking_allowed(converted):
        log.info("llm_thinking_off", model=spec.model, reason="the open tool turn has no thinking blocks to send back")
        thinking, budget = False, None
    if thinking and budget is None:  # adaptive: the model sizes its thinking within max_tokens itself
        body["thinking"] = {"type": "adaptive"}
    elif budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = budget + body["max_tokens"]  # thinking counts toward max_tokens: room for the answer
    elif spec.temperature is not None:
        body["temperature"] = spec.temperature  # the API refuses a temperature with thinking
    if spec.effort:
        body["output_config"] = {"effort": _EFFORTS.get(spec.effort, spec.effort)}
    place_breakpoints(body)
    return body


def thinking_allowed(messages: list[dict[str, Any]]) -> bool:
    """Whether thinking may be on for this request: with thinking on, the API requires the newest assistant message
    of the open tool loop to start with its thinking blocks. One answered by another provider (a fallback) or
    recorded without them has none, and signed blocks cannot be made up: the request goes without thinking, and so
    does the rest of that tool loop (its replies have no thinking either), until a user message opens a new turn."""
    if not messages or messages[-1]["role"] != "user":
        return True
    if not any(block.get("type") == "tool_result" for block in messages[-1]["content"]):
        return True  # a new user turn: no tool loop is open
    previous = messages[-2] if len(messages) > 1 else None
    if previous is None or previous["role"] != "assistant":
        return True
    return bool(previous["content"]) and previous["content"][0].get("type") in THINKING_TYPES


def to_anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function schemas as Anthropic tools: ``{name, description, input_schema}``."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function", tool)
        converted: dict[str, Any] = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            converted["description"] = function["description"]
        out.append(converted)
    return out


def to_anthropic_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OpenAI-style records as Anthropic's ``system`` blocks and alternating ``messages`` of content blocks.

    The leading system messages become the system blocks; a later one (a nested directory's instructions, given
    when the agent first works below it) becomes a user text, since the API has system text only at the top;
    tool results become ``tool_result`` blocks of a user message; consecutive messages of one role become one
    message, as the API would merge them; an assistant's Anthropic thinking blocks go first, as received.
    """
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    leading = True
    for message in messages:
        role = message.get("role")
        if role == "system" and leading:
            text = _text(message.get("content"))
            if text.strip():
                system.append({"type": "text", "text": text})
            continue
        leading = False
        if role == "assistant":
            blocks = _assistant_blocks(message)
            _append(out, "assistant", blocks)
        elif role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or "")}
            text = _text(message.get("content"))
            if text:
                block["content"] = text
            _append(out, "user", [block])
        else:  # user, or a system message within the conversation
            _append(out, "user", [{"type": "text", "text": _non_empty(_text(message.get("content")))}])
    return system, out


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [dict(item) for item in reasoning_for(message, PROVIDER) if isinstance(item, dict)]
    text = _text(message.get("content"))
    calls = message.get("tool_calls") or []
    if text.strip() or not calls:
        blocks.append({"type": "text", "text": _non_empty(text)})
    for index, call in enumerate(calls):
        function = call.get("function", {})
        arguments, _ = parse_arguments(function.get("arguments"))
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or f"call_{index}"),
                "name": function.get("name", ""),
                "input": arguments,
            }
        )
    return blocks


def _append(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _non_empty(text: str) -> str:
    return text if text.strip() else EMPTY_TEXT


def place_breakpoints(body: dict[str, Any]) -> None:
    """Mark the cache breakpoints, at most four: the last tool, the last system block, the newest message's last
    block, and the last block of the message that ended the previous request (the one before the newest assistant
    turn), so its entry is found whatever the number of blocks added since."""
    marked: list[dict[str, Any]] = []
    if body.get("tools"):
        marked.append(body["tools"][-1])
    if body.get("system"):
        marked.append(body["system"][-1])
    messages = body["messages"]
    newest = _cacheable_tail(messages[-1]) if messages else None
    assistant = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"), None)
    previous_end = _cacheable_tail(messages[assistant - 1]) if assistant else None
    if previous_end is not None and previous_end is not newest:
        marked.append(previous_end)
    if newest is not None:
        marked.append(newest)
    for block in marked[-MAX_BREAKPOINTS:]:
        block["cache_control"] = dict(EPHEMERAL)


def _cacheable_tail(message: dict[str, Any]) -> dict[str, Any] | None:
    # Thinking blocks cannot carry cache_control; they always come first, so the last other block is the tail.
    blocks = [block for block in message["content"] if block.get("type") not in THINKING_TYPES]
    return blocks[-1] if blocks else None


def reply_from_message(message: AnthropicMessage, requested_model: str) -> Reply:
    """A Messages API response as a ``Reply``: text, tool calls, thinking kept to send back, whole-prompt usage."""
    texts: list[str] = []
    thoughts: list[str] = []
    items: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            arguments, raw = parse_arguments(block.input if isinstance(block.input, dict) else json.dumps(block.input))
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments, raw_arguments=raw))
        elif block.type in THINKING_TYPES:
            items.append(block.to_dict(mode="json"))  # as received: the API checks the signature
            if block.type == "thinking" and block.thinking:
                thoughts.append(block.thinking)
    usage = message.usage
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    prompt = usage.input_tokens + read + written
    content = "".join(texts)
    return Reply(
        content=content or None,
        tool_calls=calls,
        prompt_tokens=prompt,
        completion_tokens=usage.output_tokens,
        total_tokens=prompt + usage.output_tokens,
        model=message.model or requested_model,
        cached_tokens=read,
        cache_write_tokens=written,
        thinking="\n\n".join(thoughts) or None,
        reasoning={"provider": PROVIDER, "items": items} if items else None,
    )


def build(spec: ModelSpec, api_key: str | None, retry: RetryPolicy, timeout_s: float) -> AnthropicProvider:
    """The registry's entry: the Messages API for ``spec``."""
    return AnthropicProvider(spec, api_key, retry, timeout_s)
