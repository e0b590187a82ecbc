"""One contract, two providers: the same tests run the official openai and ollama clients against the
replay model over real HTTP."""

from __future__ import annotations

import pickle
import random
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from agent.llm import LLMError, Provider, compute_backoff, make_provider
from agent.llm.ollama_provider import to_ollama_messages
from agent.llm.openai_provider import to_openai_messages
from replay import ReplayServer
from tests.helpers.model_server import BASH_TOOL, FINISH_TOOL, model_server

PROVIDERS = ["openai", "ollama"]
MODEL = "replay-test-model"
CONTEXT_LENGTH = 4096
SECRET_KEY = "sk-test-0123456789abcdefSECRET"

RUN_TESTS = {
    "content": "Let me run the tests.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "pytest -q"}}],
}
FINISH = {"content": None, "tool_calls": [{"name": "finish", "arguments": {"summary": "Fixed the off-by-one."}}]}


def task_messages(label: str = "task") -> list[dict[str, Any]]:
    # Records as they sit in messages.jsonl, extra fields included: providers must send only API fields.
    return [
        {"seq": 1, "role": "system", "content": "You are a coding agent.", "token_count": 6},
        {"seq": 2, "role": "user", "content": f"Fix the failing test ({label}).", "token_count": 7},
    ]


def provider_for(name: str, url: str | None, **retry: Any) -> Provider:
    retry.setdefault("backoff_base_s", 0.01)
    retry.setdefault("backoff_max_s", 0.05)
    return make_provider(name, MODEL, CONTEXT_LENGTH, url, SECRET_KEY if name == "openai" else None, **retry)


def url_for(name: str, server: ReplayServer) -> str:
    return server.openai_base_url if name == "openai" else server.url


@pytest.fixture(params=PROVIDERS)
def provider_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def two_turn_server() -> Iterator[ReplayServer]:
    with model_server([RUN_TESTS, FINISH]) as server:
        yield server


def test_tool_call_round_trip_through_the_official_client(provider_name: str, two_turn_server: ReplayServer) -> None:
    provider = provider_for(provider_name, url_for(provider_name, two_turn_server))
    messages = task_messages()

    first = provider.chat(messages, [BASH_TOOL, FINISH_TOOL])
    assert first.content is not None
    assert "Let me run the tests." in first.content
    assert [(call.name, call.arguments) for call in first.tool_calls] == [("bash", {"command": "pytest -q"})]
    messages.append(first.to_message())
    messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "1 failed", "seq": 4})

    second = provider.chat(messages, [BASH_TOOL, FINISH_TOOL])
    assert [(call.name, call.arguments) for call in second.tool_calls] == [
        ("finish", {"summary": "Fixed the off-by-one."})
    ]
    assert second.tool_calls[0].id != first.tool_calls[0].id
    assert second.model == MODEL
    sent = two_turn_server.requests[1]["body"]["messages"]
    assert all("seq" not in m and "token_count" not in m for m in sent)


def test_usage_is_reported(provider_name: str, two_turn_server: ReplayServer) -> None:
    reply = provider_for(provider_name, url_for(provider_name, two_turn_server)).chat(task_messages(), [BASH_TOOL])

    estimated = two_turn_server.requests[0]["prompt_tokens"]
    assert reply.prompt_tokens == estimated > 0
    assert reply.completion_tokens is not None
    assert reply.completion_tokens > 0
    assert reply.prompt_tokens is not None
    assert reply.total_tokens == reply.prompt_tokens + reply.completion_tokens


def test_ollama_request_sets_num_ctx_and_names_tool_results(two_turn_server: ReplayServer) -> None:
    provider = provider_for("ollama", two_turn_server.url)
    messages = task_messages()
    first = provider.chat(messages, [BASH_TOOL])
    messages += [first.to_message(), {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "ok"}]
    provider.chat(messages, [BASH_TOOL])

    body = two_turn_server.requests[1]["body"]
    assert body["options"]["num_ctx"] == CONTEXT_LENGTH
    assistant, tool = body["messages"][2], body["messages"][3]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"command": "pytest -q"}  # a dict, not JSON
    assert tool["tool_name"] == "bash"


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_failure_is_retried_then_succeeds(provider_name: str, status: int) -> None:
    with model_server([{"fail": status}, RUN_TESTS]) as server:
        reply = provider_for(provider_name, url_for(provider_name, server)).chat(task_messages(), [BASH_TOOL])

        assert reply.tool_calls[0].name == "bash"
        assert [r["status"] for r in server.requests] == [status, 200]


def test_timeout_is_retried(provider_name: str) -> None:
    # The first answer of the turn is held for 30 s; the client gives up long before and asks again.
    with model_server([{"delay_s": 30}, RUN_TESTS]) as server:
        provider = provider_for(provider_name, url_for(provider_name, server), timeout_s=0.5)
        reply = provider.chat(task_messages(), [BASH_TOOL])

        assert reply.tool_calls[0].name == "bash"
        assert len(server.requests) == 2


def test_permanent_server_error_raises_llm_error_with_a_one_line_message(provider_name: str) -> None:
    with model_server([{"fail": 500, "times": 10}, RUN_TESTS]) as server:
        provider = provider_for(provider_name, url_for(provider_name, server), max_retries=2)
        with pytest.raises(LLMError) as caught:
            provider.chat(task_messages(), [BASH_TOOL])

        message = str(caught.value)
        assert "\n" not in message
        assert provider_name in message
        assert MODEL in message
        assert "500" in message
        assert "3 attempts" in message
        assert SECRET_KEY not in message
        assert caught.value.status == 500
        assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_error_is_not_retried(provider_name: str, status: int) -> None:
    with model_server([{"fail": status}, RUN_TESTS]) as server:
        with pytest.raises(LLMError) as caught:
            provider_for(provider_name, url_for(provider_name, server)).chat(task_messages(), [BASH_TOOL])

        assert caught.value.status == status
        assert f"HTTP {status}" in str(caught.value)
        assert len(server.requests) == 1


def test_exhausted_trajectory_is_a_clear_error(provider_name: str) -> None:
    with model_server([]) as server, pytest.raises(LLMError, match="exhausted"):
        provider_for(provider_name, url_for(provider_name, server)).chat(task_messages(), None)


def test_connection_refused_raises_llm_error(provider_name: str) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}" + ("/v1" if provider_name == "openai" else "")

    with pytest.raises(LLMError, match="cannot connect") as caught:
        provider_for(provider_name, url, max_retries=1).chat(task_messages(), None)
    assert caught.value.status is None
    assert "\n" not in str(caught.value)


def test_api_key_never_appears_in_errors_or_repr() -> None:
    with model_server([{"fail": 401}, RUN_TESTS]) as server:
        provider = provider_for("openai", server.openai_base_url)
        with pytest.raises(LLMError) as caught:
            provider.chat(task_messages(), None)
    assert SECRET_KEY not in str(caught.value)
    assert SECRET_KEY not in repr(provider)


def test_records_become_api_messages() -> None:
    records: list[dict[str, Any]] = [
        {"seq": 3, "role": "assistant", "content": "", "tool_calls": [], "token_count": 1},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "tool_name": "bash", "name": "bash", "content": None},
    ]
    assert to_openai_messages(records) == [
        {"role": "assistant", "content": ""},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": ""},
    ]
    assert to_ollama_messages(records)[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}],
        },
        {"role": "tool", "content": "", "tool_name": "bash"},
    ]


def test_openai_without_key_or_base_url_is_a_configuration_error() -> None:
    with pytest.raises(LLMError, match="no API key"):
        make_provider("openai", "gpt-4o", 128000, None, None)


def test_unknown_provider_is_rejected() -> None:
    with pytest.raises(LLMError, match="unknown LLM provider 'gemini'"):
        make_provider("gemini", "m", 1000, None, None)


def test_llm_error_survives_pickling() -> None:
    error = LLMError("openai model 'm' failed: HTTP 500: boom", 500)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 (our own object, as Celery does)
    assert str(copy) == str(error)
    assert copy.status == 500


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)  # noqa: S311 (seeded jitter, not crypto)
    for attempt in range(10):
        ceiling = min(8.0, 0.5 * 2**attempt)
        delay = compute_backoff(attempt, base_s=0.5, max_s=8.0, rng=rng)
        assert ceiling / 2 <= delay <= ceiling
    assert compute_backoff(1000, base_s=1.0, max_s=30.0, rng=rng) <= 30.0


def test_backoff_is_deterministic_for_a_seeded_rng() -> None:
    seeded = random.Random  # seeded jitter, not crypto
    first = [compute_backoff(a, 1.0, 30.0, seeded(1)) for a in range(5)]
    second = [compute_backoff(a, 1.0, 30.0, seeded(1)) for a in range(5)]
    assert first == second
