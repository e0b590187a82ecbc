"""What a worker process builds once: settings, the Redis client, the context store, LLM providers."""

from __future__ import annotations

import functools
import socket
import time
from datetime import datetime
from typing import Any

import redis
import redis.asyncio
import structlog

from agent.llm import ModelSpec, Provider, RetryPolicy, registry
from agent.llm.fallback import FallbackProvider
from agent.llm.limiting import LimitedProvider, RateLimit
from contexts import ContextStore
from contexts.names import ACTIVE_STATUSES
from worker import bookkeeping
from worker.model_waits import interruptible_sleep
from worker.names import HEARTBEATS_KEY, RUNNING_STATUS_PREFIX
from worker.rate_limits import RedisLimiter
from worker.redis_clock import RedisClock
from worker.settings import current_settings
from worker.settings_models import Settings
from worker.stores import open_store

log = structlog.get_logger(__name__)

CLOCK = RedisClock()  # this process's time as Redis tells it: every heartbeat is written and judged by it


def settings() -> Settings:
    """The process's settings (:func:`worker.settings.current_settings`): one object, loaded once."""
    return current_settings()


def redis_client() -> redis.Redis:
    """A Redis client on the broker's server (heartbeat index, dedupe keys, cancel flags): one per broker URL,
    so settings installed later (a test, a benchmark) never write through a client made for earlier ones."""
    return _client_for(settings().broker.url)


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def async_redis_client(url: str) -> redis.asyncio.Redis:
    """An asyncio Redis client on ``url`` for one event loop (the HTTP intake's), with the blocking one's timeouts."""
    return redis.asyncio.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def index_heartbeat(uuid: str, now: datetime, status: str) -> None:
    """Record the context's heartbeat in the Redis sorted set the monitor reads, and its status in the one set
    per status that ``/metrics`` counts (never fatal)."""
    pipe = redis_client().pipeline(transaction=True)
    pipe.time()  # the offset to Redis's clock, measured again on every heartbeat at no extra round trip
    pipe.zadd(HEARTBEATS_KEY, {uuid: now.timestamp()})
    for other in ACTIVE_STATUSES:
        if other != status:
            pipe.zrem(RUNNING_STATUS_PREFIX + other, uuid)
    if status in ACTIVE_STATUSES:
        pipe.zadd(RUNNING_STATUS_PREFIX + status, {uuid: now.timestamp()})
    sent = time.time()
    try:
        answers = pipe.execute()
    except redis.RedisError as exc:
        log.warning("heartbeat index not updated", uuid=uuid, error=str(exc))
        return
    CLOCK.observe(answers[0], sent, time.time())


def unindex(uuid: str) -> None:
    """Drop a finished context from the heartbeat index and the status sets (never fatal: the monitor repeats it)."""
    try:
        bookkeeping.unindex(redis_client(), uuid)
    except redis.RedisError as exc:
        log.warning("heartbeat index not cleaned", uuid=uuid, error=str(exc))


def context_store(s: Settings | None = None, *, index: bool = True) -> ContextStore:
    """The context store as configured; ``index``: the task holder's store, whose heartbeats also refresh the
    Redis index.

    The holder's store is kept per process and configuration: a new one per task would open the SQLite index and
    reconcile it every time. Every other caller (the monitor at each run, jobs, commands) gets a new store, whose
    first use of the index reconciles it after crashes, as before. A root removed since is made again."""
    s = s or settings()
    if not index:
        return open_store(s, must_exist=False, clock=CLOCK)
    config = s.contexts
    # Before a task's first heartbeat is written: a lock stamped by a clock minutes off would look stale (or fresh
    # for minutes too long) to every other host.
    CLOCK.measure_if_due(redis_client(), socket.gethostname(), s.contexts.max_clock_skew_s)
    key = (str(config.base_dir), config.heartbeat_interval_s, config.stale_after_s, config.hung_after, config.fsync)
    store = _stores.get(key)
    if store is None or not store.intact():
        store = _stores[key] = open_store(s, must_exist=False, on_heartbeat=index_heartbeat, clock=CLOCK)
    return store


_stores: dict[tuple[object, ...], ContextStore] = {}


def llm_config(s: Settings, profile: str | None = None) -> dict[str, Any]:
    """The resolved LLM settings recorded in ``metadata.json.config`` (never a secret): the model profile
    ``profile`` (None: the default one)."""
    chosen = s.llm_profile(profile)
    return {
        "profile": chosen.name,
        "llm_provider": chosen.provider,
        "model": chosen.model,
        "context_length": chosen.context_length,
        "compression_threshold": s.compression.threshold,
        "endpoint": str(chosen.endpoint) if chosen.endpoint else None,
    }


def model_spec(config: dict[str, Any], s: Settings) -> ModelSpec:
    """What a task's recorded config asks of a provider: its profile's settings (the configuration's today), with
    the provider, model, window and endpoint the task recorded (a per-user override, a profile changed since)."""
    name = config.get("profile")
    try:
        profile = s.llm_profile(str(name)) if name else None
    except KeyError:
        profile = None  # a profile removed since the task started: the recorded values are all there is
    options = profile.settings if profile is not None else None
    provider = str(config.get("llm_provider") or (profile.provider if profile else s.llm_profile().provider))
    return ModelSpec(
        name=str(name or provider),
        provider=provider,
        model=str(config["model"]),
        context_length=int(config["context_length"]),
        endpoint=config.get("endpoint"),
        temperature=options.temperature if options else None,
        max_output_tokens=options.max_output_tokens if options else None,
        effort=options.effort if options else None,
        thinking_tokens=options.thinking_tokens if options else None,
        adaptive_thinking=options.adaptive_thinking if options else False,
        headers=tuple(sorted(options.headers.items())) if options else (),
        api_key_env=options.api_key_env if options else None,
    )


def provider_for(config: dict[str, Any], s: Settings | None = None) -> Provider:
    """A provider for a task's recorded LLM config; the API key comes from the environment.

    What a model hiccup costs is waiting, never the task: each profile retries within ``llm.retry_for_s``
    (``Retry-After`` honoured), waits for the fleet's rate limit of its profile (``rate_limits``, kept in Redis),
    and hands the request to its ``fallbacks`` in order when it stays down. Every wait stops at once on a cancel or
    a shutdown (:mod:`worker.model_waits`).

    Providers are kept per model spec: a new HTTP client per task would reload the TLS certificate bundle every
    time (about 50 ms), and a profile found down stays known as down to the next task.
    """
    s = s or settings()
    return _provider(model_spec(config, s), s)


@functools.lru_cache(maxsize=32)
def _provider(spec: ModelSpec, s: Settings) -> Provider:
    chain = [_profile_provider(spec, s)]
    for name in fallbacks_of(spec.name, s):
        chain.append(_profile_provider(model_spec(llm_config(s, name), s), s))
    return chain[0] if len(chain) == 1 else FallbackProvider(chain, cooldown_s=s.llm.retry_for_s)


def fallbacks_of(profile: str, s: Settings) -> tuple[str, ...]:
    """The profiles that take over from ``profile`` in order (itself and repeats left out; none for a profile
    removed from the configuration since its task started)."""
    try:
        named = s.llm_profile(profile).settings.fallbacks
    except KeyError:
        return ()
    return tuple(name for name in dict.fromkeys(named) if name != profile)


def retry_policy(s: Settings) -> RetryPolicy:
    """The configured patience with a failing model; its waits stop on a cancel or a shutdown."""
    llm = s.llm
    return RetryPolicy(
        llm.max_retries, llm.backoff_base_s, llm.backoff_max_s, llm.retry_for_s, sleep=interruptible_sleep
    )


def _profile_provider(spec: ModelSpec, s: Settings) -> Provider:
    """One profile's provider, behind the fleet's rate limiter when the profile has limits."""
    provider = registry.build(spec, retry_policy(s), float(s.llm.timeout_s))  # the key: from the environment
    try:
        limits = s.llm_profile(spec.name).settings.rate_limits
    except KeyError:
        return provider
    limit = RateLimit(limits.requests_per_minute, limits.tokens_per_minute)
    if not limit:
        return provider
    limiter = RedisLimiter(lambda: _client_for(s.broker.url), spec.name, limit)  # these settings' Redis
    return LimitedProvider(provider, limiter, sleep=interruptible_sleep)
