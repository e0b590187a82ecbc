"""One retry policy for every provider: exponential backoff with jitter on transient failures."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from contexts.masking import mask
from worker.llm.base import LLMError

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """How a provider classified one exception: what to report and whether another try may succeed."""

    reason: str
    retryable: bool
    status: int | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a provider retries (``max_retries`` retries after the first try)."""

    max_retries: int = 4
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False)


def compute_backoff(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): half of ``base_s * 2**attempt`` (capped) plus jitter."""
    ceiling = min(max_s, base_s * 2.0 ** min(attempt, 32))
    # "Equal jitter": never less than half the exponential step, so retries from many workers spread out
    # without any of them hammering a rate-limited server immediately.
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def is_retryable_status(status: int) -> bool:
    """Rate limits and server errors may pass; any other 4xx will fail the same way again."""
    return status == 429 or status >= 500


def one_line(text: str, secret: str | None = None, limit: int = 200) -> str:
    """``text`` masked, on one line and at most ``limit`` characters, fit for an error message."""
    if secret:
        text = text.replace(secret, "[SECRET]")
    flat = " ".join(mask(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def call_with_retries(
    call: Callable[[], T],
    classify: Callable[[Exception], Failure | None],
    policy: RetryPolicy,
    *,
    provider: str,
    model: str,
) -> T:
    """Run ``call``, retrying what ``classify`` deems transient; otherwise raise ``LLMError``."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            attempts = attempt + 1
            if not failure.retryable or attempt >= policy.max_retries:
                tries = f" after {attempts} attempts" if attempts > 1 else ""
                raise LLMError(f"{provider} model {model!r} failed{tries}: {failure.reason}", failure.status) from exc
            delay = compute_backoff(attempt, policy.backoff_base_s, policy.backoff_max_s, policy.rng)
            log.warning(
                "llm_retry",
                provider=provider,
                model=model,
                attempt=attempts,
                delay_s=round(delay, 3),
                reason=failure.reason,
            )
            time.sleep(delay)
            attempt += 1
