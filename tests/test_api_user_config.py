"""Per-user LLM settings from ``user_config_api.url``: overrides, the Redis cache, and defaults on failure."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.helpers.user_config_server import UserConfigServer
from worker.names import USER_CONFIG_PREFIX
from worker.settings_models import Settings
from worker.user_config import resolve_llm_config

DEFAULTS = {"profile": "openai", "llm_provider": "openai", "model": "gpt-4o", "context_length": 128000,
            "compression_threshold": 0.7, "endpoint": None}


@pytest.fixture
def server() -> Iterator[UserConfigServer]:
    running = UserConfigServer({
        # notfolder's user_config_api shape: {"status", "data": {"llm": {...}}}, with an API key that must be dropped
        "alice": {"status": "success", "data": {"llm": {"provider": "openai", "openai": {
            "model": "gpt-4.1-mini", "context_length": 64000, "api_key": "sk-user-key-0123456789abcdef"}}}},
        "bob": {"llm_provider": "ollama", "model": "qwen3:8b", "context_length": 16384,
                "endpoint": "http://ollama.internal:11434", "compression_threshold": 0.6},
        "carol": {"llm": {"openai": {"context_length": -5}}},  # invalid: defaults
        "dave": 500,
        "erin": ["not", "an", "object"],
    })
    yield running
    running.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], server: UserConfigServer) -> Settings:
    return make_settings({"TASUKI__USER_CONFIG_API__URL": server.url})


def test_without_the_api_or_a_user_the_defaults_apply(make_settings: Callable[..., Settings],
                                                      fake_redis: redis.Redis) -> None:
    assert resolve_llm_config(make_settings(), fake_redis, "alice") == DEFAULTS


def test_user_overrides_apply_and_api_keys_never_enter_the_config(settings: Settings, fake_redis: redis.Redis) -> None:
    config = resolve_llm_config(settings, fake_redis, "alice")
    assert config == {**DEFAULTS, "model": "gpt-4.1-mini", "context_length": 64000, "user_config": "api"}
    assert "sk-user" not in json.dumps(config)


def test_flat_overrides_switch_provider_endpoint_and_threshold(settings: Settings, fake_redis: redis.Redis) -> None:
    assert resolve_llm_config(settings, fake_redis, "bob") == {
        "profile": "ollama", "llm_provider": "ollama", "model": "qwen3:8b", "context_length": 16384,
        "compression_threshold": 0.6, "endpoint": "http://ollama.internal:11434", "user_config": "api",
    }


@pytest.mark.parametrize("user", ["carol", "dave", "erin", "nobody"])
def test_invalid_answers_and_errors_fall_back_to_the_defaults(settings: Settings, fake_redis: redis.Redis,
                                                              user: str) -> None:
    assert resolve_llm_config(settings, fake_redis, user) == DEFAULTS


def test_unreachable_api_falls_back_to_the_defaults(make_settings: Callable[..., Settings],
                                                    fake_redis: redis.Redis) -> None:
    from tests.helpers.redis_server import free_port

    settings = make_settings({"TASUKI__USER_CONFIG_API__URL": f"http://127.0.0.1:{free_port()}"})
    assert resolve_llm_config(settings, fake_redis, "alice") == DEFAULTS


def test_answers_are_cached_in_redis(settings: Settings, server: UserConfigServer, redis_client: redis.Redis) -> None:
    first = resolve_llm_config(settings, redis_client, "alice")
    second = resolve_llm_config(settings, redis_client, "alice")
    assert first == second
    assert server.hits == ["/config/alice"]
    assert 0 < int(redis_client.ttl(USER_CONFIG_PREFIX + "alice")) <= 300


def test_user_names_are_quoted_into_the_path(settings: Settings, server: UserConfigServer,
                                             fake_redis: redis.Redis) -> None:
    resolve_llm_config(settings, fake_redis, "../admin?x=1")
    assert server.hits == ["/config/..%2Fadmin%3Fx%3D1"]
