"""A fleet-wide rate limit per model profile: the rule (a sliding window over the requests admitted), and the
provider that waits for it before every request it sends.

Many workers on one API key would otherwise meet the provider's limit together and retry together. The rule is
pure (it takes ``now``); where the admitted requests are kept, shared by the fleet, is the worker's business
(:mod:`worker.rate_limits` keeps them in Redis behind the :class:`Limiter` protocol), so this package never
imports Redis.

The window is exact, with a little slack: a request is admitted only when fewer than ``requests`` were admitted
in the ``window_s + slack_s`` before it, and when its tokens fit beside theirs. The slack (a second a minute) covers
the difference between the moment a request is admitted and the moment the provider counts it (a round trip, a
process scheduled late), so that the provider never sees more than the limit in any window of its own. A request's
tokens are estimated before it is sent and corrected by the usage its reply reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from agent.llm.base import Message, ModelSpec, Provider, Reply
from agent.llm.retry import before_each_retry
from contexts.tokens import estimate_message_tokens, estimate_tokens

log = structlog.get_logger(__name__)

WINDOW_S = 60.0
"""The limits are per minute (``rate_limits.requests_per_minute``, ``tokens_per_minute``)."""
SLACK_S = 1.0
"""How much longer than the window an admitted request still counts (1.6 % of a minute's throughput)."""


@dataclass(frozen=True)
class RateLimit:
    """What all workers together may send with one profile in any ``window_s``; None: no limit of that kind.
    An admitted request counts for ``span_s``: the window and its slack."""

    requests: int | None = None
    tokens: int | None = None
    window_s: float = WINDOW_S
    slack_s: float = SLACK_S

    def __bool__(self) -> bool:
        return self.requests is not None or self.tokens is not None

    @property
    def span_s(self) -> float:
        """How long an admitted request counts."""
        return self.window_s + self.slack_s


Admitted = tuple[float, int]
"""One admitted request: when (seconds) and its tokens."""


def admission_wait(admitted: Sequence[Admitted], now: float, limit: RateLimit, tokens: int) -> float:
    """Seconds from ``now`` until a request of ``tokens`` fits beside the requests ``admitted`` (0: it fits now).

    A request counts while ``now < its time + span_s``. For the request limit, the oldest requests past
    ``requests - 1`` must leave the window first; for the token limit, the oldest ones until the rest and this
    one's tokens fit. A request larger than the whole token limit fits an otherwise empty window (it could never
    be sent otherwise; the provider says what it thinks of it). :mod:`worker.rate_limits` runs the same rule in
    Redis, atomically."""
    span = limit.span_s
    live = sorted(entry for entry in admitted if entry[0] > now - span)
    until = now
    if limit.requests is not None and len(live) >= limit.requests:
        until = max(until, live[len(live) - limit.requests][0] + span)
    if limit.tokens is not None:
        need = min(tokens, limit.tokens)
        total = sum(count for _, count in live)
        for at, count in live:
            if total + need <= limit.tokens:
                break
            total -= count
            until = max(until, at + span)
    return until - now


@dataclass(frozen=True)
class Admission:
    """A limiter's answer: admitted (``wait_s`` 0, with the ``ticket`` its tokens are corrected by), or how long to
    wait before asking again."""

    wait_s: float
    ticket: str | None = None


class Limiter(Protocol):
    """The fleet's shared count of one profile's requests (:class:`worker.rate_limits.RedisLimiter`)."""

    limit: RateLimit

    def admit(self, tokens: int) -> Admission:
        """Record a request of ``tokens`` if it fits now (atomically, for the whole fleet), else say how long to
        wait. A limiter that cannot reach its store admits (and says so in the log): it never stops a task."""
        ...

    def settle(self, ticket: str, estimated: int, actual: int) -> None:
        """Correct an admitted request's tokens from the estimate to what the reply reported."""
        ...


def estimate_request_tokens(messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    """Tokens a request is counted for before it is sent: its messages and the tools' schemas."""
    tokens = sum(estimate_message_tokens(m.get("content"), m.get("tool_calls")) for m in messages)
    return tokens + (estimate_tokens(json.dumps(tools)) if tools else 0)


def reported_tokens(reply: Reply) -> int | None:
    """Tokens a reply says its request cost (prompt and output), None when it reported no usage."""
    if reply.total_tokens is not None:
        return reply.total_tokens
    if reply.prompt_tokens is None:
        return None
    return reply.prompt_tokens + (reply.completion_tokens or 0)


class LimitedProvider:
    """``inner`` behind a fleet-wide limiter: every request (retries too) waits for its admission first.

    The first admission counts the request's estimated tokens, corrected by its reply's usage; a retry counts as
    another request but not as more tokens (a refused request consumed none). ``sleep`` does the waiting (the
    worker's is interrupted by a cancel or a shutdown)."""

    def __init__(self, inner: Provider, limiter: Limiter, sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.limiter = limiter
        self.sleep = sleep
        self.spec: ModelSpec = inner.spec
        self.model = inner.model
        self.context_length = inner.context_length

    def __repr__(self) -> str:
        return f"LimitedProvider({self.inner!r}, {self.limiter.limit!r})"

    def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, cache_key: str | None = None
    ) -> Reply:
        """``inner.chat`` once the limiter admits it (and each of its retries)."""
        estimated = estimate_request_tokens(messages, tools)
        ticket = self._wait_for_admission(estimated)
        with before_each_retry(self._admit_retry):
            reply = self.inner.chat(messages, tools, cache_key=cache_key)
        actual = reported_tokens(reply)
        if ticket is not None and actual is not None and actual != estimated:
            self.limiter.settle(ticket, estimated, actual)
        return reply

    def _admit_retry(self) -> None:
        self._wait_for_admission(0)

    def _wait_for_admission(self, tokens: int) -> str | None:
        waited = 0.0
        while True:
            admission = self.limiter.admit(tokens)
            if admission.wait_s <= 0:
                if waited:
                    log.info("rate limit: admitted", profile=self.spec.name, waited_s=round(waited, 3))
                return admission.ticket
            if not waited:
                log.info("rate limit: waiting", profile=self.spec.name, wait_s=round(admission.wait_s, 3))
            self.sleep(admission.wait_s)
            waited += admission.wait_s
