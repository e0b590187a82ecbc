"""The LLM seam: one ``chat`` call in OpenAI-style messages, one ``Reply`` out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from contexts.errors import TasukiError

Message = dict[str, Any]
"""An OpenAI-style chat message: ``role``, ``content``, optional ``tool_calls`` / ``tool_call_id``."""


class LLMError(TasukiError):
    """A model call failed for good (after retries, or at once for a request the server rejects)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # HTTP status of the last failure; None for connection errors


class ContextOverflow(LLMError):
    """The request does not fit the model's context window: compress the history and send the step again."""


class ModelUnavailable(LLMError):
    """The model stayed unreachable, rate-limited or failing for the whole retry window: another profile may take
    over (``fallbacks``), else the task stops and delivers what it has."""


@dataclass(frozen=True)
class ModelSpec:
    """What a provider needs to talk to one model: a resolved profile of ``llm.models`` (never a secret)."""

    name: str
    """The profile's name (``llm.models`` key; the built-in one is named after ``llm.provider``)."""
    provider: str
    """A name in :mod:`agent.llm.registry`."""
    model: str
    context_length: int
    endpoint: str | None = None
    """Base URL of the API (OpenAI, Anthropic) or the Ollama host; None: the vendor's own."""
    temperature: float | None = None
    max_output_tokens: int | None = None
    effort: str | None = None
    """Reasoning effort (``minimal``, ``low``, ``medium``, ``high``) where the API has one."""
    thinking_tokens: int | None = None
    adaptive_thinking: bool = False
    """Anthropic's adaptive thinking: the model decides how much to think (guided by ``effort``)."""
    """Extended thinking's budget (Anthropic) or thinking on (Ollama ``think``); None: off."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra HTTP headers sent with every request (a gateway's, a beta flag)."""
    api_key_env: str | None = None
    """The environment variable holding the key; None: the provider's usual one."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``raw_arguments`` keeps arguments that were not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Reply:
    """What the model answered, with the usage the provider reported (``None`` when it reported none)."""

    content: str | None
    tool_calls: list[ToolCall]
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    model: str
    cached_tokens: int | None = None  # prompt tokens read from the provider's cache
    cache_write_tokens: int | None = None  # prompt tokens written to the provider's cache (Anthropic bills them)
    thinking: str | None = None
    """The model's readable reasoning (``reasoning_content``, Ollama's ``thinking``, Anthropic's thinking text)."""
    reasoning: dict[str, Any] | None = None
    """What the provider must be sent back with this reply on the next turn, opaque to everyone else:
    ``{"provider": NAME, "items": [...]}`` (Anthropic's signed thinking blocks, Responses' encrypted reasoning
    items). Another provider drops it."""
    request: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The body this reply answered, as sent on the wire (recorded beside the step, masked)."""

    def to_message(self) -> Message:
        """The reply as the OpenAI-style assistant message that goes into ``messages.jsonl``."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.thinking:
            message["thinking"] = self.thinking
        if self.reasoning:
            message["reasoning"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.raw_arguments
                        if call.raw_arguments is not None
                        else json.dumps(call.arguments, ensure_ascii=False),
                    },
                }
                for call in self.tool_calls
            ]
        return message


class Provider(Protocol):
    """A chat model behind some API; retries transient failures itself and raises ``LLMError`` otherwise
    (:class:`ContextOverflow` for a request too long for the window, :class:`ModelUnavailable` once retries ran
    out on transient failures)."""

    spec: ModelSpec
    model: str
    context_length: int

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """Send ``messages`` (and the tools' JSON schemas) and return the model's reply; ``cache_key`` names the
        conversation for providers that route requests to their prompt cache by it (a task's UUID)."""
        ...


def reasoning_for(message: Message, provider: str) -> list[Any]:
    """The items a reply recorded for ``provider`` to be sent back (none when another provider wrote it)."""
    reasoning = message.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("provider") == provider:
        items = reasoning.get("items")
        return list(items) if isinstance(items, list) else []
    return []


def parse_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as a dict, plus the raw text when it was not a JSON object."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)


def arguments_text(raw: object) -> str:
    """Tool-call arguments as the JSON string the OpenAI API wants (dicts from our own records included)."""
    if isinstance(raw, str):
        return raw
    return json.dumps(raw if raw is not None else {}, ensure_ascii=False)
