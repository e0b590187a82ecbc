"""What issue 37 added to the Chat Completions and Ollama providers, through the official clients over HTTP: the
profile's sampling settings on the wire, ``prompt_cache_key`` for OpenAI's own API only, ``reasoning_content``
and Ollama's ``thinking`` kept and sent back, cache writes counted, and every server's context-overflow error
raised as ``ContextOverflow``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent.llm import ContextOverflow, LLMError, ModelSpec, Provider, Reply, RetryPolicy, registry
from agent.llm.openai_provider import dialect_of, generation_options
from replay import ReplayServer
from tests.helpers.canned_server import canned_server
from tests.helpers.model_server import model_server

KEY = "sk-test-extras-0123456789SECRET"
MODEL = "replay-model"
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
THOUGHT = "The test fails on an off-by-one; I should read calc.py first."
TURNS: list[dict[str, Any]] = [
    {"content": "Reading.", "thinking": THOUGHT, "tool_calls": [{"name": "bash", "arguments": {"command": "cat x"}}]},
    {"content": "Done.", "thinking": "It is fixed.", "tool_calls": []},
]


def provider(name: str, endpoint: str, *, max_retries: int = 0, **settings: Any) -> Provider:
    spec = ModelSpec(name, name, MODEL, 8192, endpoint, **settings)
    return registry.build(spec, RetryPolicy(max_retries, 0.01, 0.02), 10.0, KEY)


def task() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]


def step(chosen: Provider, messages: list[dict[str, Any]], cache_key: str = "task-7") -> Reply:
    """One step: the reply recorded as messages.jsonl keeps it (JSON), its tool calls answered."""
    reply = chosen.chat(messages, [BASH_TOOL], cache_key=cache_key)
    messages.append(json.loads(json.dumps(reply.to_message())))
    messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in reply.tool_calls)
    return reply


def bodies(server: ReplayServer) -> list[dict[str, Any]]:
    return [r["body"] for r in server.requests if r["method"] == "POST"]


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with model_server(TURNS) as s:
        yield s


def test_a_compatible_server_gets_the_profile_settings_in_the_names_it_reads(server: ReplayServer) -> None:
    chosen = provider(
        "openai",
        server.openai_base_url,
        temperature=0.4,
        max_output_tokens=2048,
        effort="low",
        headers=(("X-Gateway-Route", "team-a"),),
    )

    chosen.chat(task(), [BASH_TOOL], cache_key="task-7")

    (body,) = bodies(server)
    assert (body["temperature"], body["max_tokens"], body["reasoning_effort"]) == (0.4, 2048, "low")
    assert "max_completion_tokens" not in body  # DeepSeek and LM Studio read max_tokens only
    assert "prompt_cache_key" not in body  # strict compatible servers (Groq, NIM...) refuse unknown fields
    assert server.requests[0]["headers"]["x-gateway-route"] == "team-a"


def test_without_settings_nothing_is_added(server: ReplayServer) -> None:
    provider("openai", server.openai_base_url).chat(task(), [BASH_TOOL])

    (body,) = bodies(server)
    assert set(body) == {"model", "messages", "tools"}


def test_openai_s_own_api_gets_the_cache_key_and_max_completion_tokens_and_never_reasoning_content(
    server: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client talks to http://api.openai.com through an HTTP proxy that is the replay model: the request is
    # the one OpenAI would get, and it never leaves this machine.
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    chosen = provider("openai", "http://api.openai.com/v1", max_output_tokens=4096, effort="high")
    messages = task()

    first = step(chosen, messages)
    step(chosen, messages)

    assert server.requests[0]["headers"]["host"] == "api.openai.com"
    assert first.thinking == THOUGHT  # kept from the reply all the same
    for body in bodies(server):
        assert body["prompt_cache_key"] == "task-7"
        assert body["max_completion_tokens"] == 4096
        assert "max_tokens" not in body
        assert body["reasoning_effort"] == "high"
    assert "reasoning_content" not in bodies(server)[1]["messages"][2]  # OpenAI refuses unknown message fields


@pytest.mark.parametrize(
    ("base_url", "cache_key", "cap", "reasoning_content"),
    [
        (None, True, "max_completion_tokens", False),  # the client's default: OpenAI
        ("https://api.openai.com/v1", True, "max_completion_tokens", False),
        ("https://eu.api.openai.com/v1", True, "max_completion_tokens", False),
        ("https://team.openai.azure.com/openai/v1", False, "max_completion_tokens", False),
        ("https://api.deepseek.com/v1", False, "max_tokens", True),
        ("https://api.groq.com/openai/v1", False, "max_tokens", True),  # not fooled by /openai in the path
        ("http://localhost:8080/v1", False, "max_tokens", True),  # llama.cpp, vLLM, LM Studio
        ("https://openai.com.evil.example/v1", False, "max_tokens", True),
    ],
)
def test_the_dialect_follows_the_host(
    base_url: str | None, cache_key: bool, cap: str, reasoning_content: bool
) -> None:
    dialect = dialect_of(base_url)
    options = generation_options(ModelSpec("p", "openai", MODEL, 8192, base_url, max_output_tokens=100), dialect)

    assert dialect.prompt_cache_key is cache_key
    assert list(options) == [cap]
    assert dialect.reasoning_content is reasoning_content


def test_reasoning_content_is_kept_as_thinking_and_sent_back_with_its_tool_calls(server: ReplayServer) -> None:
    chosen = provider("openai", server.openai_base_url)
    messages = task()

    first = step(chosen, messages)
    last = step(chosen, messages)

    assert first.thinking == THOUGHT
    assert messages[2]["thinking"] == THOUGHT  # in the record messages.jsonl keeps
    assert last.thinking == "It is fixed."
    sent = bodies(server)[1]["messages"][2]
    assert sent["role"] == "assistant"
    assert sent["tool_calls"]
    assert sent["reasoning_content"] == THOUGHT  # DeepSeek's thinking mode refuses a tool turn without it
    assert "thinking" not in sent


def completion(message: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        "usage": usage,
    }


def test_cache_reads_and_writes_and_a_reasoning_field_come_back_in_the_reply() -> None:
    usage = {
        "prompt_tokens": 5000,
        "completion_tokens": 40,
        "total_tokens": 5040,
        "prompt_tokens_details": {"cached_tokens": 3968, "cache_write_tokens": 1032},
    }
    answer = completion({"role": "assistant", "content": "ok", "reasoning": "Short and sure."}, usage)
    with canned_server(200, answer) as fake:
        reply = provider("openai", fake.url).chat(task())

    assert (reply.prompt_tokens, reply.cached_tokens, reply.cache_write_tokens) == (5000, 3968, 1032)
    assert reply.thinking == "Short and sure."  # newer vLLM names it reasoning


def test_a_prompt_past_the_window_raises_context_overflow_without_retrying() -> None:
    with model_server(TURNS, context_window=20) as server:
        chosen = provider("openai", server.openai_base_url, max_retries=3)
        with pytest.raises(ContextOverflow, match="does not fit the context window") as caught:
            chosen.chat(task(), [BASH_TOOL])
        assert caught.value.status == 400
        assert len(bodies(server)) == 1


OVERFLOWS = {
    "llama.cpp": {
        "error": {
            "code": 400,
            "message": "request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 4476,
            "n_ctx": 4096,
        }
    },
    "vLLM": {
        "object": "error",
        "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    "vLLM, newer": {
        "error": {
            "message": "The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure "
            "that `max_model_len` is no smaller than the number of text tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    },
    "LM Studio": {
        "error": "Trying to keep the first 5120 tokens when context the overflows. However, the model is loaded "
        "with context length of only 4096 tokens, which is not enough."
    },
}


@pytest.mark.parametrize("server_name", list(OVERFLOWS))
def test_each_compatible_server_s_overflow_error_is_a_context_overflow(server_name: str) -> None:
    with canned_server(400, OVERFLOWS[server_name]) as fake, pytest.raises(ContextOverflow):
        provider("openai", fake.url, max_retries=2).chat(task())

    assert len(fake.posts) == 1


def test_another_bad_request_stays_an_llm_error() -> None:
    body = {"error": {"message": "Invalid value for 'tool_choice'.", "type": "invalid_request_error", "code": None}}
    with canned_server(400, body) as fake, pytest.raises(LLMError, match="Invalid value for 'tool_choice'") as caught:
        provider("openai", fake.url).chat(task())

    assert not isinstance(caught.value, ContextOverflow)


def test_ollama_thinking_is_asked_for_kept_and_sent_back(server: ReplayServer) -> None:
    chosen = provider("ollama", server.url, thinking_tokens=4096)
    messages = task()

    first = step(chosen, messages)
    step(chosen, messages)

    assert first.thinking == THOUGHT
    assert [body["think"] for body in bodies(server)] == [True, True]
    sent = bodies(server)[1]["messages"][2]
    assert sent["role"] == "assistant"
    assert sent["thinking"] == THOUGHT


@pytest.mark.parametrize(("effort", "think", "thinking"), [("high", "high", THOUGHT), ("minimal", False, None)])
def test_ollama_effort_is_a_thinking_level_and_minimal_turns_it_off(
    server: ReplayServer, effort: str, think: object, thinking: str | None
) -> None:
    reply = provider("ollama", server.url, effort=effort).chat(task(), [BASH_TOOL])

    assert bodies(server)[0]["think"] == think
    assert reply.thinking == thinking


def test_ollama_without_settings_leaves_thinking_to_the_model(server: ReplayServer) -> None:
    provider("ollama", server.url).chat(task(), [BASH_TOOL])

    assert "think" not in bodies(server)[0]


def test_ollama_refusing_a_prompt_for_its_length_is_a_context_overflow() -> None:
    refusal = {"error": "the input length exceeds the context length"}
    with canned_server(400, refusal) as fake, pytest.raises(ContextOverflow, match="exceeds the context length"):
        provider("ollama", fake.url, max_retries=2).chat(task())

    assert len(fake.posts) == 1
