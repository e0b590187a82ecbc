"""What the worker hands to ``requests.jsonl`` for each model call (contexts/requests.py, issue 37)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from agent.llm import Message, Provider, Reply
from contexts.requests import SentRequest


def sent_request(
    provider: Provider,
    step: int,
    kind: str,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    reply: Reply,
    reply_seq: int | None = None,
) -> SentRequest:
    """The request ``reply`` answered: the provider-neutral prompt and the body the provider sent for it."""
    spec = provider.spec
    return SentRequest(step, kind, spec.name, spec.provider, spec.model, messages, tools, reply.request, reply_seq)


def request_as_json(sent: SentRequest) -> dict[str, Any]:
    """``sent`` as plain JSON (a compression job's result carries it to the context's holder)."""
    return asdict(sent)


def request_from_json(data: object, step: int) -> SentRequest | None:
    """A request carried as :func:`request_as_json` made it, numbered ``step`` by the holder; None when there is
    none or it is not one (a worker of another version during a rolling upgrade)."""
    if not isinstance(data, dict):
        return None
    try:
        return SentRequest(**{**data, "step": step})
    except TypeError:
        return None
