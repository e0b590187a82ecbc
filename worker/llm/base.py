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
    cached_tokens: int | None = None  # prompt tokens the provider served from its cache (OpenAI reports them)

    def to_message(self) -> Message:
        """The reply as the OpenAI-style assistant message that goes into ``messages.jsonl``."""
        message: Message = {"role": "assistant", "content": self.content}
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
    """A chat model behind some API; retries transient failures itself and raises ``LLMError`` otherwise."""

    model: str
    context_length: int

    def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> Reply:
        """Send ``messages`` (and the tools' JSON schemas) and return the model's reply."""
        ...


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
