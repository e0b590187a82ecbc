"""Anthropic's prompt cache by its documented rules, as pure code: what a Messages request reads, writes and pays.

The rules (platform.claude.com, "Prompt caching"), as this module applies them:

- The prompt is a sequence of blocks in the order ``tools -> system -> messages``; a cache entry is a hash of
  everything up to and including one block (the model and, from the messages on, the thinking settings and
  ``tool_choice`` are part of it: changing them invalidates the messages' entries, not the tools' or system's).
  ``cache_control`` itself is not part of the content.
- Writes happen only at breakpoints (blocks with ``cache_control``, at most four), and only when the prefix there
  has at least the model's minimum cacheable length (1,024 to 4,096 tokens).
- For each breakpoint a request looks for an entry at the breakpoint and at the 19 blocks before it (20 positions
  in all); it reads the longest prefix found.
- Usage: ``cache_read_input_tokens`` the prefix read, ``cache_creation_input_tokens`` what was written beyond it,
  ``input_tokens`` the rest (after the last breakpoint); the three add up to the whole prompt.
- Entries live 5 minutes, refreshed by every read or write.
- Price: writes 1.25x, reads 0.1x of an input token.

Token counts are :func:`contexts.tokens.estimate_tokens` of each block's text (plus 4 for each message's framing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contexts.tokens import estimate_tokens

LOOKBACK_BLOCKS = 20  # positions checked per breakpoint, the breakpoint itself the first
MAX_BREAKPOINTS = 4
TTL_S = 300.0
WRITE_PRICE = 1.25  # of an input token, for the 5-minute cache
READ_PRICE = 0.1
MESSAGE_FRAMING_TOKENS = 4
_MIN_CACHEABLE: tuple[tuple[str, int], ...] = (
    # model name contains -> minimum cacheable prompt length (the documentation's table; first match wins)
    ("opus-4-6", 4096),
    ("opus-4-5", 4096),
    ("haiku-4-5", 4096),
    ("sonnet-4-6", 2048),
    ("haiku-3", 2048),
)
DEFAULT_MIN_CACHEABLE = 1024  # Sonnet 4.5, Sonnet 4, Opus 4.1, Opus 4


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches; a breakpoint before that many tokens writes nothing."""
    return next((tokens for part, tokens in _MIN_CACHEABLE if part in model), DEFAULT_MIN_CACHEABLE)


@dataclass(frozen=True)
class PrefixBlock:
    """One block of the prompt in cache order: the hash of the prefix ending with it, its tokens, and whether it
    is a breakpoint."""

    prefix_hash: str
    tokens: int
    breakpoint: bool


@dataclass(frozen=True)
class CacheUsage:
    """The input side of a response's ``usage``, in Anthropic's three disjoint parts."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt: Anthropic's ``total_input_tokens``."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    @property
    def billed(self) -> float:
        """Input token-equivalents at Anthropic's prices: fresh + 1.25 x writes + 0.1 x reads."""
        return billed_input(self.input_tokens, self.cache_creation_input_tokens, self.cache_read_input_tokens)


def billed_input(fresh: int, written: int, read: int) -> float:
    """Input token-equivalents of one request: ``fresh + 1.25 * written + 0.1 * read``."""
    return fresh + WRITE_PRICE * written + READ_PRICE * read


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _without_cache_control(block: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in block.items() if key != "cache_control"}


def block_tokens(block: dict[str, Any]) -> int:
    """Estimated tokens of one content block (its text, a call's name and input, a result's content)."""
    kind = block.get("type")
    if kind == "tool_use":
        return estimate_tokens(str(block.get("name") or "")) + estimate_tokens(_canonical(block.get("input") or {}))
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return sum(block_tokens(part) for part in content if isinstance(part, dict))
        return estimate_tokens(str(content or ""))
    field = _TEXT_FIELDS.get(str(kind))
    if field is not None:
        return estimate_tokens(str(block.get(field) or ""))
    return estimate_tokens(_canonical(_without_cache_control(block)))


_TEXT_FIELDS = {"text": "text", "thinking": "thinking", "redacted_thinking": "data"}


def content_blocks(content: Any) -> list[dict[str, Any]]:
    """A message's or the system's content as blocks (a plain string is one text block, with no breakpoint)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content or [] if isinstance(block, dict)]


def prefix_blocks(body: dict[str, Any]) -> list[PrefixBlock]:
    """The request's blocks in cache order (tools, system, messages), each with the hash of its whole prefix."""
    digest = hashlib.sha256(_canonical({"model": body.get("model")}).encode())
    out: list[PrefixBlock] = []

    def add(key: Any, tokens: int, breakpoint: bool) -> None:
        digest.update(_canonical(key).encode())
        out.append(PrefixBlock(digest.copy().hexdigest(), tokens, breakpoint))

    for tool in body.get("tools") or []:
        plain = _without_cache_control(tool)
        add({"tool": plain}, estimate_tokens(_canonical(plain)), "cache_control" in tool)
    for block in content_blocks(body.get("system")):
        add({"system": _without_cache_control(block)}, block_tokens(block), "cache_control" in block)
    # Thinking settings and tool_choice belong to the messages' level: changing them invalidates only these.
    digest.update(_canonical({"thinking": body.get("thinking"), "tool_choice": body.get("tool_choice")}).encode())
    for index, message in enumerate(body.get("messages") or []):
        for position, block in enumerate(content_blocks(message.get("content"))):
            framing = MESSAGE_FRAMING_TOKENS if position == 0 else 0
            key = {"message": index, "role": message.get("role"), "block": _without_cache_control(block)}
            add(key, block_tokens(block) + framing, "cache_control" in block)
    return out


def breakpoint_count(body: dict[str, Any]) -> int:
    """Blocks with ``cache_control`` in the request (a top-level ``cache_control`` takes one slot too)."""
    count = sum(1 for block in prefix_blocks(body) if block.breakpoint)
    return count + (1 if body.get("cache_control") else 0)


class PromptCache:
    """One organization's prompt cache: entries by prefix hash, each with its expiry (not thread-safe: the fake
    server holds a lock around it)."""

    def __init__(self, min_tokens: int | None = None, ttl_s: float = TTL_S) -> None:
        self.min_tokens = min_tokens
        self.ttl_s = ttl_s
        self._expiry: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def use(self, body: dict[str, Any], now: float) -> CacheUsage:
        """What ``body`` reads and writes at time ``now`` (seconds), its entries then written or refreshed."""
        blocks = prefix_blocks(body)
        minimum = self.min_tokens if self.min_tokens is not None else min_cacheable_tokens(str(body.get("model")))
        cumulative: list[int] = []
        running = 0
        for block in blocks:
            running += block.tokens
            cumulative.append(running)
        breakpoints = [i for i, block in enumerate(blocks) if block.breakpoint]
        read, read_at = 0, None
        for point in breakpoints:
            for position in range(point, max(point - LOOKBACK_BLOCKS, -1), -1):
                if self._live(blocks[position].prefix_hash, now):
                    if cumulative[position] > read:
                        read, read_at = cumulative[position], position
                    break
        written = 0
        for point in breakpoints:
            if cumulative[point] < minimum:
                continue  # too short to cache: processed as plain input
            if not self._live(blocks[point].prefix_hash, now):
                written = max(written, cumulative[point] - read)
            self._expiry[blocks[point].prefix_hash] = now + self.ttl_s
        if read_at is not None:
            self._expiry[blocks[read_at].prefix_hash] = now + self.ttl_s
        return CacheUsage(running - read - written, read, written)

    def _live(self, prefix_hash: str, now: float) -> bool:
        expiry = self._expiry.get(prefix_hash)
        return expiry is not None and expiry > now


def bill_requests(bodies: Iterable[dict[str, Any]], min_tokens: int | None = None) -> list[CacheUsage]:
    """The usage of Messages request bodies sent one after another (within the cache's lifetime) to one cache."""
    cache = PromptCache(min_tokens)
    return [cache.use(body, float(step)) for step, body in enumerate(bodies)]


def conversation_requests(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, spec: Any
) -> list[dict[str, Any]]:
    """The body the ``anthropic`` provider sends for each step of a recorded conversation (OpenAI-style records,
    as ``messages.jsonl`` holds them): one per assistant record, of the messages before it. ``spec`` is the
    profile's :class:`agent.llm.base.ModelSpec`."""
    from agent.llm.anthropic_provider import request_body

    return [request_body(spec, messages[:i], tools) for i, m in enumerate(messages) if m.get("role") == "assistant"]


def billed_conversation(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, spec: Any, min_tokens: int | None = None
) -> float:
    """The billed input token-equivalents (fresh + 1.25 x writes + 0.1 x reads) of a recorded conversation sent
    step by step through the ``anthropic`` provider, with its cache breakpoints."""
    return sum(usage.billed for usage in bill_requests(conversation_requests(messages, tools, spec), min_tokens))
