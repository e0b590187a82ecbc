"""The anthropic provider through the official ``anthropic`` client against a fake Messages API over real HTTP.

The fake (:mod:`replay.anthropic_api`) answers with the replay model's scripted turns, refuses what the API refuses
(breakpoints past four, unanswered tool calls, dropped or altered thinking) and computes cache reads and writes
by Anthropic's documented rules (:mod:`replay.anthropic_cache`), so the figures asserted here are the ones the
breakpoints earn, not ones the fake was told to report.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from agent.llm import ContextOverflow, LLMError, ModelSpec, ModelUnavailable, Reply, RetryPolicy, registry
from agent.llm.anthropic_provider import DEFAULT_MAX_TOKENS, place_breakpoints, to_anthropic_messages
from replay import ReplayModel
from replay.anthropic_api import AnthropicServer, serve_anthropic
from replay.anthropic_cache import (
    LOOKBACK_BLOCKS,
    CacheUsage,
    PromptCache,
    bill_requests,
    billed_conversation,
    conversation_requests,
    min_cacheable_tokens,
)
from replay.trajectory import turns_from_entries

MODEL = "claude-sonnet-4-5"
SECRET_KEY = "sk-ant-test-0123456789abcdefSECRET"
SYSTEM = "You are a coding agent working in a checkout. " * 120  # ~1,400 tokens: past Sonnet's 1,024 minimum
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command in the checkout.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
FINISH = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "End the task.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
    },
}
TOOLS = [BASH, FINISH]


def bash_turn(step: int, calls: int = 1) -> dict[str, Any]:
    return {
        "content": f"Step {step}: look around.",
        "tool_calls": [{"name": "bash", "arguments": {"command": f"ls -la dir{step}_{k}"}} for k in range(calls)],
    }


FINISH_TURN = {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Fixed it."}}]}


def fake_for(entries: list[dict[str, Any]], **options: Any) -> AnthropicServer:
    return serve_anthropic(ReplayModel(turns_from_entries(entries)), **options)


def claude(
    url: str,
    *,
    key: str | None = SECRET_KEY,
    timeout_s: float = 10.0,
    sleep: Callable[[float], None] | None = None,
    **spec: Any,
) -> Any:
    """The provider as a task gets it: from the registry, for a profile ``provider: anthropic``; ``sleep`` records
    the waits between tries instead of waiting."""
    profile = ModelSpec("claude", "anthropic", MODEL, 200_000, url, **spec)
    policy = RetryPolicy(max_retries=3, backoff_base_s=0.01, backoff_max_s=0.02, sleep=sleep or (lambda _: None))
    return registry.build(profile, policy, timeout_s, key)


def task(label: str = "task") -> list[dict[str, Any]]:
    # Records as messages.jsonl holds them, extra fields included: the provider sends only what the API takes.
    return [
        {"seq": 1, "role": "system", "content": SYSTEM, "token_count": 1400},
        {"seq": 2, "role": "user", "content": f"Fix the failing test ({label}).", "token_count": 9},
    ]


def tool_output(step: int, k: int = 0) -> str:
    return "\n".join(f"-rw-r--r-- 1 dev dev {1000 + n} file_{step}_{k}_{n}.py" for n in range(30))


def step(provider: Any, messages: list[dict[str, Any]]) -> Reply:
    """One agent step: ask, record the reply, answer each tool call with its output."""
    reply: Reply = provider.chat(messages, TOOLS, cache_key="task-uuid")
    messages.append(reply.to_message())
    for k, call in enumerate(reply.tool_calls):
        messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_output(len(messages), k)})
    return reply


def answered(server: AnthropicServer) -> list[dict[str, Any]]:
    return [r for r in server.requests if r["status"] == 200]


def sdk(server: AnthropicServer, key: str = "k") -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=server.url, max_retries=0, timeout=10)


@pytest.fixture
def ten_steps() -> Iterator[AnthropicServer]:
    with fake_for([bash_turn(n) for n in range(9)] + [FINISH_TURN]) as server:
        yield server


# --- conversion -------------------------------------------------------------------------------------------------


def test_records_become_system_blocks_and_alternating_messages() -> None:
    records: list[dict[str, Any]] = [
        {"seq": 1, "role": "system", "content": "Be brief."},
        {"seq": 2, "role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "Two looks.",
            "reasoning": {"provider": "anthropic", "items": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": ""},
        {"role": "user", "content": "Please go on."},
        {"role": "assistant", "content": "", "reasoning": {"provider": "openai-responses", "items": [{"id": "r"}]}},
        {"role": "user", "content": "   "},
    ]
    system, messages = to_anthropic_messages(records)

    assert system == [{"type": "text", "text": "Be brief."}]
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},  # first, as received
                {"type": "text", "text": "Two looks."},
                {"type": "tool_use", "id": "c1", "name": "bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "c2", "name": "bash", "input": {"command": "pwd"}},
            ],
        },
        {
            "role": "user",  # both results and the nudge after them: one user message, results first
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "a.py"},
                {"type": "tool_result", "tool_use_id": "c2"},
                {"type": "text", "text": "Please go on."},
            ],
        },
        # another provider's reasoning is not sent; an empty reply still has a (non-empty) block
        {"role": "assistant", "content": [{"type": "text", "text": "(empty)"}]},
        {"role": "user", "content": [{"type": "text", "text": "(empty)"}]},
    ]


def test_the_request_round_trips_through_the_official_client(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url, temperature=0.2, max_output_tokens=4000, effort="minimal")
    messages = task()
    first = step(provider, messages)
    second = step(provider, messages)

    assert first.content == "[tasuki-replay turn=0] Step 0: look around."
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("call_t0_0", "bash", {"command": "ls -la dir0_0"})
    ]
    assert second.tool_calls[0].arguments == {"command": "ls -la dir1_0"}  # the fake read turn 0's call and result
    assert second.model == MODEL
    body = ten_steps.requests[1]["body"]
    assert body == second.request  # Reply.request is the body sent
    assert body["max_tokens"] == 4000
    assert body["temperature"] == 0.2
    assert body["output_config"] == {"effort": "low"}  # Anthropic's lowest effort
    assert "thinking" not in body
    assert body["tools"] == [
        {
            "name": "bash",
            "input_schema": BASH["function"]["parameters"],  # type: ignore[index]
            "description": "Run a command in the checkout.",
        },
        {
            "name": "finish",
            "input_schema": FINISH["function"]["parameters"],  # type: ignore[index]
            "description": "End the task.",
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert body["messages"][1]["content"][-1] == {
        "type": "tool_use",
        "id": "call_t0_0",
        "name": "bash",
        "input": {"command": "ls -la dir0_0"},
    }
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "call_t0_0",
        "content": tool_output(3),
        "cache_control": {"type": "ephemeral"},
    }


def test_breakpoints_are_four_at_most_and_on_the_right_blocks(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url)
    messages = task()
    for _ in range(3):
        step(provider, messages)

    first, third = ten_steps.requests[0]["body"], ten_steps.requests[2]["body"]
    marked = [path for path, _ in breakpoints(third)]
    assert marked == ["tools.1", "system.0", "messages.2.content.0", "messages.4.content.0"]
    # the newest message's last block, and the end of the request before the newest assistant turn
    assert third["messages"][4]["content"][-1]["type"] == "tool_result"
    assert third["messages"][2]["content"][-1]["tool_use_id"] == "call_t0_0"
    assert [path for path, _ in breakpoints(first)] == ["tools.1", "system.0", "messages.0.content.0"]
    assert all(r["status"] == 200 for r in ten_steps.requests)


def breakpoints(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    found += [(f"system.{i}", b) for i, b in enumerate(body.get("system") or []) if "cache_control" in b]
    for m, message in enumerate(body["messages"]):
        found += [(f"messages.{m}.content.{i}", b) for i, b in enumerate(message["content"]) if "cache_control" in b]
    return found


# --- caching ----------------------------------------------------------------------------------------------------


def test_a_ten_step_conversation_reads_each_previous_prompt_and_writes_only_what_is_new(
    ten_steps: AnthropicServer,
) -> None:
    provider = claude(ten_steps.url)
    messages = task()
    replies = [step(provider, messages) for _ in range(10)]

    usages = [r["usage"] for r in answered(ten_steps)]
    prompts = [r["prompt_tokens"] for r in answered(ten_steps)]
    assert len(usages) == 10
    assert replies[-1].tool_calls[0].name == "finish"
    # Step 0 writes its whole prompt (the last block is a breakpoint: nothing is left as plain input).
    assert usages[0] == {**usages[0], "cache_read_input_tokens": 0, "cache_creation_input_tokens": prompts[0]}
    for n in range(1, 10):
        assert usages[n]["cache_read_input_tokens"] == prompts[n - 1]  # all of the previous prompt is read
        assert usages[n]["cache_creation_input_tokens"] == prompts[n] - prompts[n - 1]  # only the new step is written
        assert usages[n]["input_tokens"] == 0
        assert usages[n]["cache_creation_input_tokens"] < prompts[n] / 4
    # The reply reports the whole prompt, the reads and the writes as the fake computed them.
    for reply, usage, prompt in zip(replies, usages, prompts, strict=True):
        assert (reply.prompt_tokens, reply.cached_tokens, reply.cache_write_tokens) == (
            prompt,
            usage["cache_read_input_tokens"],
            usage["cache_creation_input_tokens"],
        )
        assert reply.completion_tokens == usage["output_tokens"] > 0
    billed = sum(u["input_tokens"] + 1.25 * u["cache_creation_input_tokens"] + 0.1 * u["cache_read_input_tokens"]
                 for u in usages)  # fmt: skip
    assert billed < 0.35 * sum(prompts)  # against sending the same prompts uncached


def test_a_step_of_many_parallel_calls_still_reads_the_previous_prompt() -> None:
    # 12 calls and their results add 26 blocks: past the 20-block lookback from the newest message's breakpoint.
    entries = [bash_turn(0), bash_turn(1, calls=12), bash_turn(2), FINISH_TURN]
    with fake_for(entries) as server:
        provider = claude(server.url)
        messages = task()
        for _ in range(3):
            step(provider, messages)
        usages = [r["usage"] for r in answered(server)]
        prompts = [r["prompt_tokens"] for r in answered(server)]
        bodies = [r["body"] for r in answered(server)]

    assert usages[2]["cache_read_input_tokens"] == prompts[1]
    # Without the breakpoint at the previous request's end, the lookback would miss it and read only the system
    # prompt: the same requests with that breakpoint removed, through the same cache rules.
    bare = [copy.deepcopy(body) for body in bodies]
    for body in bare:
        for path, block in breakpoints(body)[2:-1]:
            assert path.startswith("messages.")
            del block["cache_control"]
    assert breakpoints(bodies[2])[2][0] == "messages.2.content.0"  # the one removed
    read = bill_requests(bare)[2].cache_read_input_tokens
    assert 0 < read < prompts[0]  # the tools and system prompt only, not even the task
    assert bill_requests(bodies)[2].cache_read_input_tokens == prompts[1]  # the pure rules agree with the fake


def test_the_cache_rules_follow_anthropic_documentation() -> None:
    def body(blocks: int, *, marks: tuple[int, ...], tools: str = "t", thinking: bool = False) -> dict[str, Any]:
        content = [{"type": "text", "text": f"block {n} " + "x" * 400} for n in range(blocks)]
        for mark in marks:
            content[mark - 1]["cache_control"] = {"type": "ephemeral"}
        request: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 10,
            "tools": [{"name": tools, "input_schema": {"type": "object"}}],
            "system": [{"type": "text", "text": "s" * 2400, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": content}],
        }
        if thinking:
            request["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        return request

    cache = PromptCache(min_tokens=500)
    # The documentation's example: a write at block 10; 15 blocks later a hit at 10; at block 35 the entry
    # at 15 is one position outside the 20 checked, unless a second breakpoint at 15 opens a window there.
    first = cache.use(body(10, marks=(10,)), now=0)
    assert (first.cache_read_input_tokens, first.input_tokens) == (0, 0)
    second = cache.use(body(15, marks=(15,)), now=1)
    assert second.cache_read_input_tokens == first.prompt_tokens
    assert second.cache_creation_input_tokens == second.prompt_tokens - first.prompt_tokens
    system_only = PromptCache(min_tokens=500)
    for request in (body(10, marks=(10,)), body(15, marks=(15,))):
        system_only.use(request, now=1)
    third = system_only.use(body(35, marks=(35,)), now=2)
    assert 0 < third.cache_read_input_tokens < first.prompt_tokens  # only the system prompt's entry
    assert LOOKBACK_BLOCKS == 20
    assert cache.use(body(35, marks=(15, 35)), now=2).cache_read_input_tokens == second.prompt_tokens
    # Changing the thinking settings invalidates the messages, not the tools and system prompt.
    other = cache.use(body(15, marks=(15,), thinking=True), now=4)
    assert 0 < other.cache_read_input_tokens < second.prompt_tokens
    # Changing a tool invalidates everything.
    assert cache.use(body(15, marks=(15,), tools="u"), now=5).cache_read_input_tokens == 0
    # Entries live five minutes from their last use (the one at block 15 was last used at 2).
    assert cache.use(body(15, marks=(15,)), now=2 + 299).cache_read_input_tokens == second.prompt_tokens
    assert cache.use(body(15, marks=(15,)), now=2 + 299 + 301).cache_read_input_tokens == 0
    # A prefix shorter than the model's minimum is not written.
    short = PromptCache()
    tiny = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}  # fmt: skip
    assert short.use(tiny, now=0) == CacheUsage(
        input_tokens=5, cache_read_input_tokens=0, cache_creation_input_tokens=0
    )
    assert len(short) == 0
    assert (min_cacheable_tokens("claude-sonnet-4-5"), min_cacheable_tokens("claude-haiku-4-5")) == (1024, 4096)


def test_billed_conversation_prices_what_the_fake_computed(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url)
    messages = task()
    for _ in range(10):
        step(provider, messages)
    served = [CacheUsage(**{k: v for k, v in r["usage"].items() if k != "output_tokens"}) for r in answered(ten_steps)]

    spec = provider.spec
    assert conversation_requests(messages, TOOLS, spec) == [r["body"] for r in answered(ten_steps)]
    billed = billed_conversation(messages, TOOLS, spec)
    assert billed == pytest.approx(sum(u.billed for u in served))
    uncached = sum(u.prompt_tokens for u in served)
    assert billed < uncached / 3


# --- extended thinking ------------------------------------------------------------------------------------------


def test_thinking_blocks_go_back_first_and_unchanged_across_tool_turns(ten_steps: AnthropicServer) -> None:
    ten_steps.fake.redacted_thinking = True
    provider = claude(ten_steps.url, thinking_tokens=2048, temperature=0.5)
    messages = task()
    first = step(provider, messages)
    second = step(provider, messages)
    step(provider, messages)

    assert first.thinking is not None
    assert first.thinking.startswith("Turn 0:")
    assert first.reasoning is not None
    items = first.reasoning["items"]
    assert [item["type"] for item in items] == ["thinking", "redacted_thinking"]
    assert messages[2]["reasoning"] == {"provider": "anthropic", "items": items}
    body = ten_steps.requests[2]["body"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 2048 + DEFAULT_MAX_TOKENS
    assert "temperature" not in body  # the API refuses one with thinking
    assert body["messages"][1]["content"][:2] == items  # first, as received
    assert second.reasoning is not None
    assert body["messages"][3]["content"][:2] == second.reasoning["items"]
    assert all(r["status"] == 200 for r in ten_steps.requests)


def test_adaptive_thinking_lets_the_model_size_its_thinking_and_keeps_the_blocks(ten_steps: AnthropicServer) -> None:
    # Claude Opus 4.7 and later take only adaptive thinking: a budget would be a 400.
    provider = claude(ten_steps.url, adaptive_thinking=True, effort="medium", temperature=0.5)
    messages = task()
    first = step(provider, messages)
    step(provider, messages)

    body = ten_steps.requests[1]["body"]
    assert body["thinking"] == {"type": "adaptive"}
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS  # no budget to add room for
    assert body["output_config"] == {"effort": "medium"}
    assert "temperature" not in body
    assert first.reasoning is not None
    assert body["messages"][1]["content"][: len(first.reasoning["items"])] == first.reasoning["items"]
    assert all(r["status"] == 200 for r in ten_steps.requests)


def test_the_fake_refuses_a_turn_whose_thinking_was_dropped_or_altered(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url, thinking_tokens=2048)
    messages = task()
    step(provider, messages)
    step(provider, messages)
    body = copy.deepcopy(ten_steps.requests[1]["body"])
    client = sdk(ten_steps)

    # The newest assistant turn without its thinking: the API's own rule.
    dropped = copy.deepcopy(body)
    dropped["messages"][1]["content"] = dropped["messages"][1]["content"][1:]
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block") as caught:
        client.messages.create(**dropped)
    assert caught.value.status_code == 400
    assert caught.value.type == "invalid_request_error"
    # An altered thinking block: its signature no longer matches.
    altered = copy.deepcopy(body)
    altered["messages"][1]["content"][0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature` in `thinking` block"):
        client.messages.create(**altered)
    # Through the provider: a recorded reasoning item changed on disk is refused at once, not retried.
    messages[2]["reasoning"]["items"][0]["thinking"] = "something else"
    before = len(ten_steps.requests)
    with pytest.raises(LLMError, match=r"HTTP 400: .*Invalid `signature`") as refused:
        provider.chat(messages, TOOLS)
    assert refused.value.status == 400
    assert len(ten_steps.requests) == before + 1


def test_the_fake_is_stricter_than_the_api_about_earlier_turns(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url, thinking_tokens=2048)
    messages = task()
    for _ in range(3):
        step(provider, messages)
    body = copy.deepcopy(ten_steps.requests[2]["body"])
    body["messages"][1]["content"] = body["messages"][1]["content"][1:]  # turn 0's thinking, not the newest turn's

    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0\.type: Expected the `thinking`"):
        sdk(ten_steps).messages.create(**body)


def test_a_turn_opened_by_another_provider_goes_without_thinking(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url, thinking_tokens=2048)
    messages = task()
    reply = step(provider, messages)
    messages[2].pop("reasoning")  # as if a fallback profile (no signed thinking) had answered this step
    assert reply.tool_calls

    second = provider.chat(messages, TOOLS)

    assert second.request is not None
    assert "thinking" not in second.request
    assert second.reasoning is None
    assert ten_steps.requests[-1]["status"] == 200


# --- failures ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 529, 500])
def test_rate_limits_overload_and_server_errors_are_retried_waiting_what_retry_after_asks(status: int) -> None:
    waits: list[float] = []
    fault = {"fail": status, "times": 2, "headers": {"retry-after": "7"}}
    with fake_for([fault, bash_turn(0)]) as server:
        reply = claude(server.url, sleep=waits.append).chat(task(), TOOLS)
        statuses = [r["status"] for r in server.requests]

    assert reply.tool_calls[0].name == "bash"
    assert statuses == [status, status, 200]
    assert waits == [7.0, 7.0]  # as the server asked, not our 0.01-0.02 s backoff


def test_without_retry_after_our_backoff_applies() -> None:
    waits: list[float] = []
    with fake_for([{"fail": 529}, bash_turn(0)]) as server:
        claude(server.url, sleep=waits.append).chat(task(), TOOLS)
    assert len(waits) == 1
    assert 0.005 <= waits[0] <= 0.01


def test_a_storm_that_outlasts_the_retries_leaves_the_model_unavailable() -> None:
    with fake_for([bash_turn(0)]) as server:
        server.fake.model.start_storm(600, 429, {"retry-after": "1"})
        with pytest.raises(ModelUnavailable, match="HTTP 429") as caught:
            claude(server.url).chat(task(), TOOLS)
        assert [r["status"] for r in server.requests] == [429] * 4  # the first try and three retries
    assert caught.value.status == 429


def test_a_rate_limit_answer_is_anthropics(ten_steps: AnthropicServer) -> None:
    with (
        fake_for([{"fail": 429, "headers": {"retry-after": "7"}}, bash_turn(0)]) as server,
        pytest.raises(anthropic.RateLimitError) as caught,
    ):
        sdk(server).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.type == "rate_limit_error"
    with fake_for([{"fail": 529}, bash_turn(0)]) as server, pytest.raises(anthropic.InternalServerError) as over:
        sdk(server).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert (over.value.status_code, over.value.type) == (529, "overloaded_error")


def test_a_prompt_too_long_raises_context_overflow_at_once() -> None:
    with fake_for([bash_turn(0)], context_window=500) as server:
        with pytest.raises(ContextOverflow, match=r"prompt is too long: [0-9]+ tokens > 500 maximum") as caught:
            claude(server.url).chat(task(), TOOLS)
        assert len(server.requests) == 1
    assert caught.value.status == 400
    assert "\n" not in str(caught.value)


def test_the_key_never_appears_in_errors_or_repr() -> None:
    with fake_for([bash_turn(0)], api_key="sk-ant-the-right-one") as server:
        provider = claude(server.url)
        with pytest.raises(LLMError) as caught:
            provider.chat(task(), TOOLS)
        assert len(server.requests) == 1  # a 401 is not retried
    assert caught.value.status == 401
    assert "invalid x-api-key" in str(caught.value)
    assert SECRET_KEY not in str(caught.value)
    assert SECRET_KEY not in repr(provider)
    assert SECRET_KEY not in repr(caught.value.__cause__)


def test_no_key_and_no_base_url_is_a_configuration_error() -> None:
    with pytest.raises(LLMError, match="no API key"):
        registry.build(ModelSpec("c", "anthropic", MODEL, 200_000), RetryPolicy(), 10.0)


# --- the fake refuses what the API refuses ----------------------------------------------------------------------


def test_the_fake_refuses_five_breakpoints_unanswered_calls_and_missing_fields(ten_steps: AnthropicServer) -> None:
    provider = claude(ten_steps.url)
    messages = task()
    step(provider, messages)
    step(provider, messages)
    body = copy.deepcopy(ten_steps.requests[1]["body"])
    client = sdk(ten_steps)

    five = copy.deepcopy(body)
    five["messages"][1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert len(breakpoints(five)) == 5
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control may be provided"):
        client.messages.create(**five)

    unanswered = copy.deepcopy(body)
    unanswered["messages"][2]["content"] = [{"type": "text", "text": "no result"}]
    with pytest.raises(anthropic.BadRequestError, match="`tool_use` ids were found without `tool_result` blocks"):
        client.messages.create(**unanswered)

    stray = copy.deepcopy(body)
    stray["messages"][2]["content"].append({"type": "tool_result", "tool_use_id": "call_elsewhere"})
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        client.messages.create(**stray)

    empty = copy.deepcopy(body)
    empty["messages"][0]["content"][0]["text"] = " "
    with pytest.raises(anthropic.BadRequestError, match="non-whitespace text"):
        client.messages.create(**empty)

    openai_shaped = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "system", "content": "x"}]}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.role: Input should be 'user' or 'assistant'"):
        client.post("/v1/messages", body=openai_shaped, cast_to=anthropic.types.Message)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Field required"):
        client.post(
            "/v1/messages", body={"model": MODEL, "messages": body["messages"]}, cast_to=anthropic.types.Message
        )
    refused = [r for r in ten_steps.requests if r["status"] == 400]
    assert len(refused) == 6
    assert all(r["kind"] is None for r in refused)  # refused before the replay model saw them


def test_place_breakpoints_never_marks_more_than_four_nor_a_thinking_block() -> None:
    body: dict[str, Any] = {
        "tools": [{"name": "a"}, {"name": "b"}],
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "u"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "x"}]},
            {"role": "user", "content": [{"type": "text", "text": "v"}]},
        ],
    }
    place_breakpoints(body)
    assert [path for path, _ in breakpoints(body)] == ["tools.1", "system.0", "messages.0.content.0",
                                                        "messages.2.content.0"]  # fmt: skip
    assert json.dumps(body).count("cache_control") == 4
