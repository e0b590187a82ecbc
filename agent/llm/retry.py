"""One retry policy for every provider: wait what the server asks (``Retry-After``), else back off exponentially
with jitter, for as long as a retry window lasts; then the model counts as unavailable.

A fleet sharing one key meets 429s as a matter of course, and a provider's outage may last minutes: a hiccup must
cost waiting, never the task. The window (``llm.retry_for_s``, ten minutes by default) bounds how long one request
keeps a task waiting; ``max_retries``, when set, caps the attempts as well (tests, impatient setups).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import TypeVar

import structlog

from agent.llm.base import LLMError, ModelUnavailable
from contexts.masking import mask

log = structlog.get_logger(__name__)

T = TypeVar("T")

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
"""Response headers: ``httpx.Headers``, a dict, or pairs."""


@dataclass(frozen=True)
class Failure:
    """How a provider classified one exception: what to report and whether another try may succeed."""

    reason: str
    retryable: bool
    status: int | None = None
    retry_after: float | None = None
    """Seconds the server asked the client to wait before the next try (:func:`retry_after_of` of the error
    response's headers); None when it said nothing."""


@dataclass(frozen=True)
class RetryPolicy:
    """How patiently a provider retries transient failures.

    ``retry_for_s`` is the window: counted from a request's first failure, retries go on while the next wait still
    ends inside it; a wait the server asks for that would end past it is not waited at all (the model counts as
    unavailable at once, so a fallback profile may take over). ``max_retries`` (None: no count) caps the retries
    after the first try as well. ``sleep`` does the waiting: the worker's is interrupted by a cancel or a
    shutdown (it raises), a test's records the waits and returns at once; ``clock`` is what the window is measured
    by (monotonic seconds)."""

    max_retries: int | None = None
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_for_s: float = 600.0
    rng: random.Random = field(default_factory=random.Random, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


def compute_backoff(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): half of ``base_s * 2**attempt`` (capped) plus jitter."""
    ceiling = min(max_s, base_s * 2.0 ** min(attempt, 32))
    # "Equal jitter": never less than half the exponential step, so retries from many workers spread out
    # without any of them hammering a rate-limited server immediately.
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def is_retryable_status(status: int) -> bool:
    """Rate limits and server errors (529: Anthropic overloaded) may pass; any other 4xx fails the same way again."""
    return status == 429 or status >= 500


def retry_after_of(headers: Headers | None, now: float | None = None) -> float | None:
    """Seconds an error response's headers ask a client to wait, or None when they ask nothing usable.

    ``retry-after-ms`` (OpenAI's and Anthropic's, in milliseconds) is read first, then the standard
    ``Retry-After``: a number of seconds or an HTTP date (``now``: the wall clock's seconds since the epoch, for
    the date; the present by default). Names are matched without regard to case. A negative or past value is 0;
    anything unreadable is None. Every provider's classifier passes its error's response headers here
    (``openai``/``anthropic``: ``exc.response.headers``)."""
    if headers is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = {str(name).lower(): str(value).strip() for name, value in pairs}
    millis = _number(found.get("retry-after-ms"))
    if millis is not None:
        return max(0.0, millis / 1000.0)
    raw = found.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # HTTP dates are GMT
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def one_line(text: str, secret: str | None = None, limit: int = 200) -> str:
    """``text`` masked, on one line and at most ``limit`` characters, fit for an error message."""
    if secret:
        text = text.replace(secret, "[SECRET]")
    flat = " ".join(mask(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def next_wait(failure: Failure, attempt: int, left_s: float, policy: RetryPolicy) -> float | None:
    """Seconds to wait before retry ``attempt`` (0-based) with ``left_s`` of the window left, or None to give up.

    The server's ``Retry-After`` is waited as it is (a value of 0 gives no advice: our backoff applies), but
    never past the window: a server asking for longer than is left ends the retries now. Our own backoff is
    shortened to what is left, for one last try at the window's end."""
    if policy.max_retries is not None and attempt >= policy.max_retries:
        return None
    if failure.retry_after is not None and failure.retry_after > 0:
        return failure.retry_after if failure.retry_after <= left_s else None
    if left_s <= 0:
        return None
    return min(compute_backoff(attempt, policy.backoff_base_s, policy.backoff_max_s, policy.rng), left_s)


_before_retry: ContextVar[Callable[[], None] | None] = ContextVar("before_retry", default=None)


@contextmanager
def before_each_retry(hook: Callable[[], None]) -> Iterator[None]:
    """Run ``hook`` before each retry :func:`call_with_retries` makes within this block, after its wait: a
    rate-limited provider's retries wait for a free request slot of the fleet's limiter there, so a 429 storm's
    retries from many workers are spread out instead of all sent the moment their ``Retry-After`` ends."""
    token = _before_retry.set(hook)
    try:
        yield
    finally:
        _before_retry.reset(token)


def call_with_retries(
    call: Callable[[], T],
    classify: Callable[[Exception], Failure | None],
    policy: RetryPolicy,
    *,
    provider: str,
    model: str,
) -> T:
    """Run ``call``, retrying what ``classify`` deems transient within the policy's window.

    A failure that is not transient raises :class:`LLMError` at once; transient failures that outlast the window
    (or ``max_retries``) raise :class:`ModelUnavailable`. Exceptions ``classify`` does not know (None) and those
    ``policy.sleep`` raises (a cancel) pass through."""
    attempt = 0
    first_failure: float | None = None
    while True:
        try:
            return call()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            attempts = attempt + 1
            tries = f" after {attempts} attempts" if attempts > 1 else ""
            if not failure.retryable:
                raise LLMError(f"{provider} model {model!r} failed{tries}: {failure.reason}", failure.status) from exc
            now = policy.clock()
            first_failure = now if first_failure is None else first_failure
            delay = next_wait(failure, attempt, first_failure + policy.retry_for_s - now, policy)
            if delay is None:
                over = f" over {now - first_failure:.0f} s" if attempts > 1 else ""
                raise ModelUnavailable(
                    f"{provider} model {model!r} failed{tries}{over}: {failure.reason}", failure.status
                ) from exc
            log.warning(
                "llm_retry",
                provider=provider,
                model=model,
                attempt=attempts,
                delay_s=round(delay, 3),
                asked=failure.retry_after is not None and failure.retry_after > 0,
                reason=failure.reason,
            )
            policy.sleep(delay)
            hook = _before_retry.get()
            if hook is not None:
                hook()
            attempt += 1
