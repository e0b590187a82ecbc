"""The compression policy as pure functions (SPEC §6): when, which span, and what a summary record is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from contexts.clock import iso
from contexts.errors import ContextError
from contexts.requests import SentRequest
from contexts.tokens import estimate_tokens

Stage = Literal["ok", "warn", "compress", "emergency"]


@dataclass(frozen=True)
class Summarized:
    """A summary with facts about how it was made (``via``, ``queue_wait_ms``, ``run_ms``), kept in its record."""

    text: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    request: SentRequest | None = None
    """The summary's request, recorded in ``requests.jsonl`` (kind ``summary``) whether or not the summary is kept."""


Summarizer = Callable[[str | None, list[dict[str, Any]]], "str | Summarized"]
"""Receives the previous summary (or None) and the span of message records; returns the new summary."""


class SummaryRejectedError(ContextError):
    """The summarizer returned nothing, or something longer than what it was meant to replace."""


@dataclass(frozen=True)
class CompressionPolicy:
    """Thresholds as fractions of the model's ``context_length`` (000's stages, 001's trigger)."""

    warn_at: float = 0.6
    threshold: float = 0.7
    min_messages: int = 10
    keep_recent: int = 5

    def stage(self, tokens: int, context_length: int) -> Stage:
        """Where ``tokens`` of unsummarized history stand against the budget."""
        if tokens >= context_length:
            return "emergency"
        if tokens > self.threshold * context_length:
            return "compress"
        if tokens > self.warn_at * context_length:
            return "warn"
        return "ok"

    def should_compress(self, tokens: int, count: int, context_length: int) -> bool:
        """Summarize when unsummarized tokens pass the threshold and there are enough messages."""
        return tokens > self.threshold * context_length and count >= self.min_messages


def select_span(
    unsummarized: list[dict[str, Any]], keep_recent: int, max_tokens: int | None = None, *, count: int | None = None
) -> list[dict[str, Any]]:
    """The oldest unsummarized messages, leaving the newest ``keep_recent`` and never splitting a tool call
    from its results (the cut moves back to the assistant message that made the call).

    ``max_tokens`` caps the span so that the summarizer's own request fits the model's window even after
    summaries failed for a while; the rest is summarized next time.  The first message group is always
    taken, so that compression can make progress.

    ``unsummarized`` may be only the oldest of ``count`` unsummarized messages, read until
    :func:`span_prefix_done` says that they hold the cut and the tool results after it.
    """
    limit = max((len(unsummarized) if count is None else count) - keep_recent, 0)
    cut, capped = limit, False
    if max_tokens is not None:
        total = 0
        for index, record in enumerate(unsummarized[:limit]):
            total += int(record.get("token_count", 0))
            if total > max_tokens:
                cut, capped = index, True
                break
    while 0 < cut < len(unsummarized) and unsummarized[cut].get("role") == "tool":
        cut -= 1
    if cut == 0 and capped:  # one oversized first group: take it whole rather than never compress again
        end = 1
        while end < len(unsummarized) and unsummarized[end].get("role") == "tool":
            end += 1
        cut = end if end <= limit else 0
    return unsummarized[:cut]


def span_prefix_done(read: list[dict[str, Any]], tokens: int, limit: int, max_tokens: int | None) -> bool:
    """Whether the oldest unsummarized messages ``read`` so far (``tokens`` in all) hold everything
    :func:`select_span` needs: the record where the cut falls (by count ``limit`` or by tokens), and the
    tool results right after the first group, which the cut must not separate from their call."""
    cut_reached = len(read) > limit or (max_tokens is not None and tokens > max_tokens)
    return cut_reached and len(read) > 1 and read[-1].get("role") != "tool"


def make_summary_record(
    *,
    span: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    text: str,
    now: datetime,
) -> dict[str, Any]:
    """The ``summaries.jsonl`` record for ``text`` summarizing ``previous`` + ``span`` (001 §3.4).

    ``original_tokens`` counts what the summary replaces in the prompt: the span and the previous
    summary it supersedes.  An empty summary, or one no shorter than that, is rejected.
    """
    if not span:
        raise SummaryRejectedError("nothing to summarize")
    text = text.strip()
    if not text:
        raise SummaryRejectedError("the summarizer returned an empty summary")
    original = sum(int(r.get("token_count", 0)) for r in span)
    if previous is not None:
        original += int(previous.get("summary_tokens", 0))
    summary_tokens = estimate_tokens(text)
    if summary_tokens >= original:
        raise SummaryRejectedError(
            f"summary of {summary_tokens} tokens is not shorter than the {original} tokens it replaces"
        )
    return {
        "start_seq": span[0]["seq"],
        "end_seq": span[-1]["seq"],
        "summary": text,
        "created_at": iso(now),
        "original_tokens": original,
        "summary_tokens": summary_tokens,
        "compression_ratio": round(summary_tokens / original, 4) if original else 0.0,
        "previous_summary_id": previous["summary_id"] if previous else None,
    }
