"""Telling a context-overflow error from any other rejected request, for every server a provider may talk to.

A request too long for the model's window is not a failure of the task: the agent compresses its history and
sends the step again (:class:`agent.llm.base.ContextOverflow`). Each server says so in its own words:

- OpenAI (Chat Completions and Responses): HTTP 400, ``code: "context_length_exceeded"``; the message is "This
  model's maximum context length is N tokens..." or "Your input exceeds the context window of this model...";
- llama.cpp's server: HTTP 400, ``type: "exceed_context_size_error"``, "request (N tokens) exceeds the available
  context size (M tokens)" (older builds: "the request exceeds the available context size");
- vLLM: HTTP 400, "This model's maximum context length is N tokens. However, you requested..." or "...is longer
  than the maximum model length of N";
- DeepSeek and other compatible APIs: OpenAI's wording; LM Studio: "...context the overflows..." / "...greater than
  the context length";
- Ollama: it cuts a long prompt to ``num_ctx`` itself, but newer servers may refuse one that "exceeds the context
  length".
"""

from __future__ import annotations

import re

OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"})
"""Error ``code`` or ``type`` values that mean the prompt does not fit."""

_OVERFLOW_TEXT = re.compile(
    r"context[ _]length[ _]exceeded"
    r"|exceeds? (?:the )?(?:available |maximum )?context (?:size|length|window)"
    r"|maximum context length"
    r"|longer than the maximum model length"
    r"|exceeds the context window"
    r"|context the overflows"
    r"|greater than the context length"
    r"|prompt is too long",
    re.IGNORECASE,
)


def is_context_overflow(status: int | None, code: object, message: str) -> bool:
    """Whether a rejected request failed for being too long for the model's window (never a rate limit, which
    is waited out; a server error says so only in its words, as Ollama's may)."""
    if status == 429:
        return False
    if isinstance(code, str) and code in OVERFLOW_CODES:
        return True
    return bool(_OVERFLOW_TEXT.search(message))
