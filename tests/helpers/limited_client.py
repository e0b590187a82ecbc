"""One worker process of the fleet-limiter tests and benchmark: ``CALLS`` chat requests through the openai provider
behind a :class:`worker.rate_limits.RedisLimiter` shared through Redis.

python -m tests.helpers.limited_client MODEL_BASE_URL REDIS_URL PROFILE CALLS REQUESTS WINDOW_S SLACK_S

Prints one line per answered request (its reply's model) and exits 0 once all are answered.
"""

from __future__ import annotations

import sys

import redis

from agent.llm import make_provider
from agent.llm.limiting import LimitedProvider, RateLimit
from worker.rate_limits import RedisLimiter


def main(argv: list[str]) -> int:
    """Send the requests one after the other, each admitted by the shared limiter first."""
    base_url, redis_url, profile, calls, requests, window_s, slack_s = argv
    client = redis.Redis.from_url(redis_url)
    limit = RateLimit(int(requests), None, float(window_s), float(slack_s))
    limiter = RedisLimiter(lambda: client, profile, limit)
    provider = LimitedProvider(make_provider("openai", "limited", 8192, base_url, None, max_retries=0), limiter)
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Go."}]
    for _ in range(int(calls)):
        print(provider.chat(messages, None).model, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
