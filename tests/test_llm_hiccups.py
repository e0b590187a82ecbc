"""A model hiccup never ends a task (issue 37 §3): ``Retry-After`` honoured, a retry window of minutes, the fleet's
rate limiter in Redis, fallback profiles.

Providers are the real ones (the openai and ollama clients) against the replay model over HTTP; the retries' waits
go through an injected sleep that records them and moves a fake clock, so no test waits for real what it checks.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from agent.llm import LLMError, ModelSpec, ModelUnavailable, Provider, Reply, RetryPolicy, registry
from agent.llm.fallback import FallbackProvider
from agent.llm.limiting import Admission, LimitedProvider, RateLimit, admission_wait
from agent.llm.retry import retry_after_of
from agent.loop import Cancelled
from contexts import ContextStore
from replay import ReplayServer
from tests.helpers.celery_worker import celery_client
from tests.helpers.model_server import model_server, wait_for_request
from tests.helpers.stack import local_request, make_buggy_repo
from tests.helpers.worker_scenarios import agent_requests, bash_turn, context_records, finish_turn, running_stack
from worker.model_waits import interruptible_sleep
from worker.rate_limits import PAUSE_S, RedisLimiter, limit_key
from worker.runtime import llm_config, provider_for
from worker.settings_models import Settings
from worker.submit import request_cancel

PROVIDERS = ["openai", "ollama"]
REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_TESTS = {"content": "Run the tests.", "tool_calls": [{"name": "bash", "arguments": {"command": "pytest -q"}}]}
MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]


def unique(prefix: str) -> str:
    """A profile name no other test (or earlier run on the shared Redis) used."""
    return f"{prefix}-{uuid_module.uuid4().hex[:12]}"


@dataclass
class FakeTime:
    """A monotonic clock that only the recorded sleeps move."""

    now: float = 1000.0
    waits: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def build(
    provider: str,
    server: ReplayServer,
    time: FakeTime,
    *,
    model: str = "replay-model",
    name: str | None = None,
    **policy: Any,
) -> Provider:
    """The registry's provider for the replay ``server``, its waits recorded by ``time``."""
    url = server.openai_base_url if provider == "openai" else server.url
    spec = ModelSpec(name or provider, provider, model, 8192, url)
    retry = RetryPolicy(**{"backoff_base_s": 1.0, "backoff_max_s": 60.0, **policy}, sleep=time.sleep, clock=time.clock)
    return registry.build(spec, retry, 30.0, "sk-test" if provider == "openai" else None)


def statuses(server: ReplayServer) -> list[int | None]:
    return [record["status"] for record in server.requests]


@pytest.fixture(params=PROVIDERS)
def provider_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- Retry-After and the retry window -----------------------------------------------------------------------------


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date() -> None:
    now = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after_of({"Retry-After": "7"}) == 7.0
    assert retry_after_of({"retry-after": "2.5"}) == 2.5
    assert retry_after_of({"retry-after-ms": "1500", "Retry-After": "9"}) == 1.5  # the precise one wins
    assert (
        retry_after_of([("Retry-After", format_datetime(datetime(2026, 12, 6, 12, 0, 42, tzinfo=UTC), True))], now=now)
        == 42.0
    )
    assert retry_after_of({"Retry-After": "Sun, 06 Dec 2026 11:00:00 GMT"}, now=now) == 0.0  # a date gone by
    assert retry_after_of({"Retry-After": "-3"}) == 0.0
    assert retry_after_of({"Retry-After": "soon"}) is None
    assert retry_after_of({"Retry-After": "nan"}) is None
    assert retry_after_of({"Content-Type": "application/json"}) is None
    assert retry_after_of(None) is None


def test_a_429_storm_with_retry_after_waits_exactly_what_the_server_asks(provider_name: str) -> None:
    time = FakeTime()
    with model_server([{"fail": 429, "times": 4, "headers": {"Retry-After": "7"}}, RUN_TESTS]) as server:
        reply = build(provider_name, server, time).chat(MESSAGES, None)

        assert reply.tool_calls[0].name == "bash"
        assert time.waits == [7.0, 7.0, 7.0, 7.0]
        assert statuses(server) == [429, 429, 429, 429, 200]


def test_retry_after_ms_is_waited_to_the_millisecond() -> None:
    time = FakeTime()
    headers = {"retry-after-ms": "1250", "Retry-After": "2"}
    with model_server([{"fail": 503, "times": 2, "headers": headers}, RUN_TESTS]) as server:
        build("openai", server, time).chat(MESSAGES, None)

        assert time.waits == [1.25, 1.25]


def test_a_5xx_burst_backs_off_exponentially_and_the_request_succeeds(provider_name: str) -> None:
    time = FakeTime()
    with model_server([{"fail": 502, "times": 2}, {"fail": 500}, {"fail": 503}, RUN_TESTS]) as server:
        reply = build(provider_name, server, time, backoff_base_s=1.0).chat(MESSAGES, None)

        assert reply.tool_calls[0].name == "bash"
        assert statuses(server) == [502, 502, 500, 503, 200]
        # Equal jitter: retry n waits between half and all of 2**n seconds.
        assert [2**n / 2 <= wait <= 2**n for n, wait in enumerate(time.waits)] == [True] * 4


def test_a_model_down_for_the_whole_window_is_unavailable_and_no_wait_ends_past_the_window(
    provider_name: str,
) -> None:
    time = FakeTime()
    with model_server([{"fail": 429, "times": 100, "headers": {"Retry-After": "30"}}, RUN_TESTS]) as server:
        provider = build(provider_name, server, time, retry_for_s=100)
        with pytest.raises(ModelUnavailable) as caught:
            provider.chat(MESSAGES, None)

        # Failures at 0, 30, 60 and 90 s: the next 30 s would end past the window, so it is not waited at all.
        assert time.waits == [30.0, 30.0, 30.0]
        assert statuses(server) == [429, 429, 429, 429]
        message = str(caught.value)
        assert "\n" not in message
        assert "after 4 attempts over 90 s" in message
        assert "HTTP 429" in message
        assert caught.value.status == 429


def test_our_own_backoff_is_cut_to_the_window_for_one_last_try() -> None:
    time = FakeTime()
    with model_server([{"fail": 500, "times": 100}, RUN_TESTS]) as server:
        provider = build("openai", server, time, retry_for_s=20, backoff_base_s=4, backoff_max_s=60)
        with pytest.raises(ModelUnavailable):
            provider.chat(MESSAGES, None)

    assert sum(time.waits) == pytest.approx(20.0)  # every second of the window used, none past it
    assert len(server.requests) == len(time.waits) + 1


def test_max_retries_caps_the_attempts_inside_the_window() -> None:
    time = FakeTime()
    with model_server([{"fail": 503, "times": 10}, RUN_TESTS]) as server:
        with pytest.raises(ModelUnavailable, match="after 3 attempts"):
            build("openai", server, time, max_retries=2).chat(MESSAGES, None)
        assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 404])
def test_a_request_the_server_refuses_is_an_llm_error_at_once_not_an_unavailable_model(
    provider_name: str, status: int
) -> None:
    time = FakeTime()
    with model_server([{"fail": status, "headers": {"Retry-After": "5"}}, RUN_TESTS]) as server:
        with pytest.raises(LLMError) as caught:
            build(provider_name, server, time).chat(MESSAGES, None)

        assert not isinstance(caught.value, ModelUnavailable)
        assert caught.value.status == status
        assert time.waits == []
        assert len(server.requests) == 1


def test_a_wait_stops_at_once_when_the_task_must_stop() -> None:
    time = FakeTime()
    looks: list[float] = []

    def stop() -> str | None:
        looks.append(time.now)
        return "cancelled on request" if len(looks) == 4 else None

    with pytest.raises(Cancelled, match="cancelled on request while waiting for the model"):
        interruptible_sleep(600.0, stop=stop, sleep=time.sleep, clock=time.clock)
    assert time.waits == [1.0, 1.0, 1.0]  # looked at before every slice of a second: 3 s of 600 waited


def test_an_uninterrupted_wait_lasts_its_time_in_slices() -> None:
    time = FakeTime()
    interruptible_sleep(2.5, stop=lambda: None, sleep=time.sleep, clock=time.clock)
    assert time.waits == [1.0, 1.0, 0.5]


# --- the fleet's rate limiter ------------------------------------------------------------------------------------


def test_the_window_admits_up_to_the_request_limit_then_waits_for_the_oldest_to_leave() -> None:
    limit = RateLimit(requests=3, window_s=60, slack_s=0)
    assert admission_wait([], 100.0, limit, 0) == 0
    assert admission_wait([(50.0, 0), (70.0, 0)], 100.0, limit, 0) == 0
    assert admission_wait([(50.0, 0), (70.0, 0), (90.0, 0)], 100.0, limit, 0) == 10.0  # 50 leaves at 110
    assert admission_wait([(40.0, 0), (50.0, 0), (70.0, 0), (90.0, 0)], 100.0, limit, 0) == 10.0  # 40 is gone
    assert admission_wait([(40.0, 0), (50.0, 0), (70.0, 0)], 100.0, limit, 0) == 0  # 40 + 60 is not after 100


def test_an_admitted_request_counts_for_the_window_and_its_slack() -> None:
    limit = RateLimit(requests=1, window_s=60, slack_s=1)
    assert admission_wait([(0.0, 0)], 60.5, limit, 0) == 0.5
    assert admission_wait([(0.0, 0)], 61.0, limit, 0) == 0


def test_the_window_admits_tokens_up_to_the_limit_and_a_huge_request_when_it_is_empty() -> None:
    limit = RateLimit(tokens=1000, window_s=60, slack_s=0)
    assert admission_wait([(50.0, 400), (70.0, 400)], 100.0, limit, 200) == 0
    assert admission_wait([(50.0, 400), (70.0, 400)], 100.0, limit, 300) == 10.0  # once 50 left: 400 + 300
    assert admission_wait([(50.0, 400), (70.0, 400)], 100.0, limit, 700) == 30.0  # both must leave
    assert admission_wait([(50.0, 400)], 100.0, limit, 5000) == 10.0  # bigger than the limit: an empty window
    assert admission_wait([], 100.0, limit, 5000) == 0


@pytest.mark.parametrize("limit", [RateLimit(4, None, 10), RateLimit(None, 1000, 10), RateLimit(3, 600, 7)])
def test_the_redis_script_follows_the_pure_rule_step_by_step(redis_client: redis.Redis, limit: RateLimit) -> None:
    rng = random.Random(37)  # noqa: S311 - a reproducible sequence of requests, not a secret
    now_ms = [1_000_000]
    limiter = RedisLimiter(lambda: redis_client, unique("script"), limit, now_ms=lambda: now_ms[0])
    in_ms = RateLimit(limit.requests, limit.tokens, limit.window_s * 1000, limit.slack_s * 1000)  # exact integers
    admitted: list[tuple[float, int]] = []
    outcomes = []
    for _ in range(300):
        now_ms[0] += rng.choice([0, 1, 250, 900, 3000])
        tokens = rng.choice([0, 50, 200, 450, 2000])
        expected_ms = admission_wait(admitted, now_ms[0], in_ms, tokens)
        admission = limiter.admit(tokens)
        assert round(admission.wait_s * 1000) == max(0, expected_ms)
        assert (admission.ticket is not None) == (expected_ms <= 0)
        if admission.ticket is not None:
            admitted.append((now_ms[0], tokens))
        outcomes.append(expected_ms <= 0)
    assert set(outcomes) == {True, False}  # both sides of the rule were exercised
    assert redis_client.pttl(limit_key(limiter.profile)) > 0  # an idle profile's key goes away by itself


def test_a_reply_corrects_the_tokens_its_request_was_counted_for(redis_client: redis.Redis) -> None:
    now_ms = 5_000_000
    limiter = RedisLimiter(lambda: redis_client, unique("settle"), RateLimit(None, 1000, 60), now_ms=lambda: now_ms)
    first = limiter.admit(500)
    assert first.ticket is not None
    assert limiter.admit(600).wait_s == 61.0  # the minute and its second of slack
    limiter.settle(first.ticket, 500, 300)
    assert limiter.admit(600).ticket is not None  # 300 + 600 fit


def test_a_redis_that_does_not_answer_admits_everything_and_is_left_alone_for_a_while() -> None:
    with socket.socket() as probe:  # a port with no listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
    asked: list[int] = []
    time = FakeTime()

    def client() -> redis.Redis:
        asked.append(1)
        return dead

    limiter = RedisLimiter(client, "dead", RateLimit(1, None, 60), clock=time.clock)
    assert limiter.admit(10) == Admission(0.0)
    assert limiter.admit(10) == Admission(0.0)
    assert len(asked) == 1  # the second request did not wait for a timeout again
    time.now += PAUSE_S
    assert limiter.admit(10) == Admission(0.0)
    assert len(asked) == 2


def test_a_limited_provider_waits_what_the_limiter_says_and_counts_its_retries(redis_client: redis.Redis) -> None:
    time = FakeTime()
    limit = RateLimit(requests=3, tokens=None, window_s=59, slack_s=1)
    profile = unique("limited")
    limiter = RedisLimiter(lambda: redis_client, profile, limit, now_ms=lambda: round(time.now * 1000))
    entries = [{"fail": 429, "times": 2, "headers": {"Retry-After": "1"}}, RUN_TESTS]
    with model_server(entries) as server:
        provider = LimitedProvider(build("openai", server, time), limiter, sleep=time.sleep)
        first = provider.chat(MESSAGES, None)  # 429, 429, 200: three requests, each admitted
        assert time.waits == [1.0, 1.0]
        members = redis_client.zrange(limit_key(profile), 0, -1)
        tokens = sorted(int(str(m).rsplit("|", 1)[1]) for m in members)
        assert tokens == sorted([0, 0, first.total_tokens])  # the retries are requests, not more tokens
        provider.chat(MESSAGES, None)  # the fourth request: the window (from 1000 s) is full until 1060 s

        assert time.waits == [1.0, 1.0, 58.0]
        assert statuses(server) == [429, 429, 200, 200]


def test_workers_in_several_processes_never_send_more_than_the_limit_in_any_window(redis_url: str) -> None:
    # The slack covers how late an admitted request may reach the server: a loaded CI machine (load 14 seen) can
    # hold a process for a few hundred milliseconds between its admission and its request.
    limit, window_s, slack_s, processes, calls = 3, 2.0, 1.0, 3, 4
    profile = unique("fleet")
    with model_server([RUN_TESTS]) as server:
        args = [server.openai_base_url, redis_url, profile, str(calls), str(limit), str(window_s), str(slack_s)]
        children = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.limited_client", *args],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        outputs = [child.communicate(timeout=120) for child in children]
        assert [child.returncode for child in children] == [0] * processes, outputs
        times = sorted(record["received_at"] for record in server.requests)

    assert len(times) == processes * calls
    # The server's own windows, measured by its own clock: never more than the limit, and the limit reached.
    busiest = max(sum(1 for t in times if start <= t < start + window_s) for start in times)
    assert busiest == limit


# --- fallback profiles -------------------------------------------------------------------------------------------


class Scripted:
    """A provider that answers from a list: a reply, or an exception to raise."""

    def __init__(self, name: str, outcomes: list[Reply | LLMError]) -> None:
        self.spec = ModelSpec(name, "openai", f"{name}-model", 8192)
        self.model = self.spec.model
        self.context_length = 8192
        self.outcomes = outcomes
        self.asked = 0

    def chat(self, messages: Any, tools: Any = None, *, cache_key: str | None = None) -> Reply:
        self.asked += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, LLMError):
            raise outcome
        return outcome


def reply_from(model: str) -> Reply:
    return Reply("ok", [], 10, 2, 12, model)


def test_the_next_profile_takes_over_and_the_one_found_down_is_passed_over_for_a_while() -> None:
    time = FakeTime()
    down = ModelUnavailable("primary down", 503)
    primary = Scripted("primary", [down, reply_from("primary-model")])
    backup = Scripted("backup", [reply_from("backup-model"), reply_from("backup-model")])
    provider = FallbackProvider([primary, backup], cooldown_s=600, clock=time.clock)

    assert provider.chat(MESSAGES).model == "backup-model"
    assert provider.chat(MESSAGES).model == "backup-model"  # the primary is not asked again yet
    assert (primary.asked, backup.asked) == (1, 2)
    time.now += 600
    assert provider.chat(MESSAGES).model == "primary-model"  # tried first again after the cooldown
    assert provider.spec.name == "primary"


def test_every_profile_down_is_one_unavailable_error_naming_them_and_other_errors_pass_untouched() -> None:
    primary = Scripted("primary", [ModelUnavailable("primary down"), LLMError("HTTP 400: bad request", 400)])
    backup = Scripted("backup", [ModelUnavailable("backup down")])
    provider = FallbackProvider([primary, backup], cooldown_s=600, clock=FakeTime().clock)

    with pytest.raises(ModelUnavailable, match=r"backup down \(profiles tried: primary, backup\)"):
        provider.chat(MESSAGES)
    with pytest.raises(LLMError, match="bad request") as caught:  # all down: every one is tried again, in order
        provider.chat(MESSAGES)
    assert not isinstance(caught.value, ModelUnavailable)
    assert backup.asked == 1


def test_a_fallback_over_http_sends_the_same_request_and_the_reply_names_the_model_that_answered() -> None:
    time = FakeTime()
    with (
        model_server([{"fail": 503, "times": 100, "headers": {"Retry-After": "20"}}, RUN_TESTS]) as down,
        model_server([RUN_TESTS]) as up,
    ):
        primary = build("openai", down, time, model="primary-model", name="primary", retry_for_s=60)
        backup = build("ollama", up, time, model="backup-model", name="backup", retry_for_s=60)
        reply = FallbackProvider([primary, backup], cooldown_s=60, clock=time.clock).chat(MESSAGES, None)

        assert reply.model == "backup-model"
        assert reply.tool_calls[0].name == "bash"
        assert statuses(down) == [503, 503, 503, 503]
        assert [m["content"] for m in up.requests[0]["body"]["messages"]] == [m["content"] for m in MESSAGES]


# --- through the worker --------------------------------------------------------------------------------------------


def profiles_env(primary_url: str, backup_url: str, **primary: Any) -> dict[str, str]:
    models = {
        "primary": {
            "provider": "openai",
            "model": "primary-model",
            "base_url": f"{primary_url}/v1",
            "context_length": 32768,
            "fallbacks": ["backup"],
            **primary,
        },
        "backup": {"provider": "ollama", "model": "backup-model", "base_url": backup_url, "context_length": 32768},
    }
    return {"TASUKI__LLM__MODELS": json.dumps(models), "TASUKI__LLM__DEFAULT": "primary"}


@pytest.fixture
def backup_server() -> Iterator[ReplayServer]:
    with model_server([bash_turn(0), bash_turn(1), bash_turn(2), finish_turn()]) as server:
        yield server


@pytest.mark.integration
def test_a_fallback_profile_takes_over_mid_task_and_the_task_completes_metered_at_its_model(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, backup_server: ReplayServer
) -> None:
    # The primary answers turn 0, then refuses turn 1 (Retry-After: 1 s) until its 1.5 s window is used up.
    turns = [
        bash_turn(0),
        {"fail": 429, "times": 1000, "headers": {"Retry-After": "1"}},
        bash_turn(1),
        bash_turn(2),
        finish_turn(),
    ]
    with running_stack(tmp_path, redis_url, turns, env={"TASUKI__LLM__RETRY_FOR_S": "1.5"}) as (stack, server):
        stack.env_overrides.update(profiles_env(server.url, backup_server.url))  # the primary: the stack's server
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        assert state["llm_call_count"] == 4  # no step lost or repeated
        primary = [(r["turn"], r["status"]) for r in agent_requests(server.requests)]
        assert primary[:3] == [(0, 200), (1, 429), (1, 429)]  # 1 s waited, the next 1 s would end past 1.5 s
        assert agent_requests(backup_server.requests)[0]["turn"] == 1  # the same step, taken over
        records = context_records(stack.contexts_dir / "completed" / uuid, "messages.jsonl")
        models = [m["usage"]["model"] for m in records if m["role"] == "assistant"]
        assert models[:2] == ["primary-model", "backup-model"]
        assert "backup-model" in json.dumps(state.get("usage"))


@pytest.mark.integration
def test_a_task_waiting_out_a_long_retry_after_is_cancelled_at_once(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(0), {"fail": 429, "times": 1000, "headers": {"Retry-After": "500"}}, finish_turn()]
    with running_stack(tmp_path, redis_url, turns) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo")))
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == 1 and r["status"] == 429, 60)
        with celery_client(stack.redis_url) as app:
            request_cancel(app, redis_client, ContextStore(stack.contexts_dir), uuid)
        state = stack.wait_finished(uuid, timeout_s=60)  # far less than the 500 s the server asked for

        assert state["status"] == "cancelled", state
        assert "cancelled on request" in state["error"]
        assert [r["status"] for r in server.requests if r["turn"] == 1] == [429]


def test_provider_for_puts_a_limited_profile_behind_the_fleet_limiter_in_the_settings_redis(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    profile = unique("limited")
    with model_server([RUN_TESTS]) as server:
        models = {
            profile: {
                "provider": "openai",
                "model": "m",
                "base_url": server.openai_base_url,
                "rate_limits": {"requests_per_minute": 5, "tokens_per_minute": 100000},
            }
        }
        s = make_settings(
            {
                "TASUKI__BROKER__URL": redis_url,
                "TASUKI__LLM__MODELS": json.dumps(models),
                "TASUKI__LLM__DEFAULT": profile,
            }
        )
        reply = provider_for(llm_config(s), s).chat(MESSAGES, None)

    members = redis_client.zrange(limit_key(profile), 0, -1)
    assert [int(str(m).rsplit("|", 1)[1]) for m in members] == [reply.total_tokens]
