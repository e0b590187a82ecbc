"""The fleet's rate limiter per model profile, kept in Redis: one sorted set of the requests admitted in the last
window, read and written by one Lua script so that two workers can never both take the last slot.

A sliding-window log rather than a token bucket (GCRA, redis-cell): a bucket that refilled during a quiet minute
lets a full burst through and then its steady rate, up to twice the limit in one minute; the log admits a request
only when the window before it holds fewer, so the provider never sees more than the limit in any minute. Each
member is ``TICKET|TOKENS`` scored by its admission in milliseconds of Redis's clock (one clock for every host).
The rule is :func:`agent.llm.limiting.admission_wait`'s; the script is its transcription.

A Redis that does not answer admits every request (a log line, then no limit for ``PAUSE_S``, so a dead Redis
costs a task one timeout per half minute, not one per step): the limiter protects the key, it never stops a task.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import redis
import structlog

from agent.llm.limiting import Admission, RateLimit
from worker.names import RATE_LIMIT_PREFIX

log = structlog.get_logger(__name__)

PAUSE_S = 30.0
"""After Redis failed to answer, requests go unlimited this long before it is asked again."""

# KEYS[1]: the profile's sorted set. ARGV: requests limit (0: none), tokens limit (0: none), span (ms), this
# request's tokens, its ticket, now (ms; empty: Redis's clock). Returns {1, now} when admitted, {0, wait_ms}.
ADMIT_LUA = """
local key = KEYS[1]
local max_requests = tonumber(ARGV[1])
local max_tokens = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local now = tonumber(ARGV[6])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local live = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
local count = #live / 2
local ready = now
if max_requests > 0 and count >= max_requests then
  ready = math.max(ready, tonumber(live[2 * (count - max_requests) + 2]) + window)
end
if max_tokens > 0 then
  local need = math.min(tokens, max_tokens)
  local total = 0
  for i = 1, #live, 2 do
    total = total + tonumber(string.match(live[i], '|(%d+)$'))
  end
  for i = 1, #live, 2 do
    if total + need <= max_tokens then break end
    total = total - tonumber(string.match(live[i], '|(%d+)$'))
    ready = math.max(ready, tonumber(live[i + 1]) + window)
  end
end
if ready > now then
  return {0, ready - now}
end
redis.call('ZADD', key, now, ARGV[5] .. '|' .. ARGV[4])
redis.call('PEXPIRE', key, window * 2)
return {1, now}
"""

# KEYS[1]: the profile's sorted set. ARGV: ticket, estimated tokens, actual tokens. The admission keeps its time.
SETTLE_LUA = """
local old = ARGV[1] .. '|' .. ARGV[2]
local score = redis.call('ZSCORE', KEYS[1], old)
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], old)
redis.call('ZADD', KEYS[1], score, ARGV[1] .. '|' .. ARGV[3])
return 1
"""


def limit_key(profile: str) -> str:
    """The Redis key of a profile's admitted requests."""
    return RATE_LIMIT_PREFIX + profile


class RedisLimiter:
    """One profile's limit for the whole fleet (:class:`agent.llm.limiting.Limiter`).

    ``client`` gives the Redis client when needed (the broker's, :func:`worker.runtime.redis_client`); ``now_ms``
    (tests) replaces Redis's clock; ``clock`` measures the pause after a failure."""

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        profile: str,
        limit: RateLimit,
        *,
        now_ms: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.profile = profile
        self.limit = limit
        self.key = limit_key(profile)
        self.now_ms = now_ms
        self.clock = clock
        self._unlimited_until = 0.0

    def __repr__(self) -> str:
        return f"RedisLimiter({self.profile!r}, {self.limit!r})"

    def admit(self, tokens: int) -> Admission:
        """Admit a request of ``tokens`` now if it fits, else say how long to wait (Redis unreachable: admitted)."""
        if self.clock() < self._unlimited_until:
            return Admission(0.0)
        ticket = uuid.uuid4().hex
        args: list[str | int] = [
            self.limit.requests or 0,
            self.limit.tokens or 0,
            round(self.limit.span_s * 1000),
            max(0, int(tokens)),
            ticket,
            "" if self.now_ms is None else self.now_ms(),
        ]
        try:
            admitted, value = self.client().eval(ADMIT_LUA, 1, self.key, *args)
        except redis.RedisError as exc:
            self._unreachable(exc)
            return Admission(0.0)
        return Admission(0.0, ticket) if int(admitted) else Admission(int(value) / 1000.0)

    def settle(self, ticket: str, estimated: int, actual: int) -> None:
        """Count the reply's reported tokens instead of the estimate (nothing when Redis does not answer)."""
        try:
            self.client().eval(SETTLE_LUA, 1, self.key, ticket, max(0, int(estimated)), max(0, int(actual)))
        except redis.RedisError as exc:
            self._unreachable(exc)

    def _unreachable(self, exc: redis.RedisError) -> None:
        self._unlimited_until = self.clock() + PAUSE_S
        log.warning(
            "rate limiter unreachable: requests go unlimited for a while",
            profile=self.profile,
            pause_s=PAUSE_S,
            error=str(exc)[:300],
        )
