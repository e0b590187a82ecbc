"""The openai-responses provider through the official ``openai`` client against the replay model's Responses API,
which refuses what OpenAI refuses with ``store: false`` (reasoning items dropped, altered or out of place)."""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from agent.llm import ContextOverflow, LLMError, ModelSpec, ModelUnavailable, Provider, Reply, RetryPolicy, registry
from contexts import ContextStore
from replay import ReplayServer
from tests.helpers.canned_server import canned_server
from tests.helpers.ci import bubblewrap_here
from tests.helpers.model_server import BASH_TOOL, FINISH_TOOL, model_server
from tests.helpers.schemas import read_jsonl_lines, validate_context_dir
from tests.helpers.stack import fix_calc_trajectory, make_buggy_repo
from worker.run import TaskRequest, TaskRun
from worker.runtime import llm_config, provider_for
from worker.settings_models import Settings

PROVIDER = "openai-responses"
MODEL = "gpt-replay"
KEY = "sk-test-responses-0123456789SECRET"
SYSTEM = "You are a coding agent."
TOOLS = [BASH_TOOL, FINISH_TOOL]
TURNS: list[dict[str, Any]] = [
    {"content": "Let me look around.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
    {
        "content": None,
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "pytest -q"}},
            {"name": "bash", "arguments": {"command": "git diff"}},
        ],
    },
    {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Fixed the off-by-one."}}]},
]


def responses_provider(server: ReplayServer, *, max_retries: int = 0, **settings: Any) -> Provider:
    spec = ModelSpec("gpt", PROVIDER, MODEL, 128000, server.openai_base_url, **settings)
    return registry.build(spec, RetryPolicy(max_retries, 0.01, 0.02), 10.0, KEY)


def task(system: str = SYSTEM) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "Fix the failing test."}]


def step(provider: Provider, messages: list[dict[str, Any]], cache_key: str = "task-1") -> Reply:
    """One agent step: ask, record the reply as messages.jsonl keeps it (JSON), answer its tool calls."""
    reply = provider.chat(messages, TOOLS, cache_key=cache_key)
    messages.append(json.loads(json.dumps(reply.to_message())))
    messages.extend({"role": "tool", "tool_call_id": c.id, "content": f"ran {c.name}"} for c in reply.tool_calls)
    return reply


def posts(server: ReplayServer) -> list[dict[str, Any]]:
    return [r for r in server.requests if r["method"] == "POST"]


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with model_server(TURNS) as s:
        yield s


def test_reasoning_items_go_back_in_place_across_a_multi_step_tool_conversation(server: ReplayServer) -> None:
    provider = responses_provider(server)
    messages = task()

    replies = [step(provider, messages) for _ in TURNS]

    assert [r.tool_calls[0].name for r in replies] == ["bash", "bash", "finish"]
    assert [len(r.tool_calls) for r in replies] == [1, 2, 1]
    for turn, reply in enumerate(replies):
        assert reply.reasoning is not None
        assert reply.reasoning["provider"] == PROVIDER
        (item,) = reply.reasoning["items"]
        assert item["type"] == "reasoning"
        assert item["id"].startswith(f"rs_t{turn}_")
        assert item["encrypted_content"].startswith("gAAAA")
        assert reply.completion_tokens
        assert reply.prompt_tokens
    assert [r["status"] for r in posts(server)] == [200, 200, 200]
    assert {r["path"] for r in posts(server)} == {"/v1/responses"}

    last = posts(server)[-1]["body"]
    assert last["instructions"] == SYSTEM  # the system prompt, not an input message
    kinds = [item.get("type") for item in last["input"]]
    assert kinds == [
        "message",  # the task
        "reasoning", "message", "function_call", "function_call_output",  # turn 0: reasoning, text, call, result
        "reasoning", "message", "function_call", "function_call", "function_call_output", "function_call_output",
    ]  # fmt: skip
    sent = [item for item in last["input"] if item["type"] == "reasoning"]
    assert sent == [replies[0].reasoning["items"][0], replies[1].reasoning["items"][0]]  # untouched, as returned
    assert last["input"][3]["call_id"] == replies[0].tool_calls[0].id


def _drop(message: dict[str, Any]) -> None:
    del message["reasoning"]


def _alter(message: dict[str, Any]) -> None:
    item = message["reasoning"]["items"][0]
    blob = item["encrypted_content"]
    item["encrypted_content"] = blob[:-6] + ("AAAAAA" if not blob.endswith("AAAAAA") else "BBBBBB")


def _strip_content(message: dict[str, Any]) -> None:
    del message["reasoning"]["items"][0]["encrypted_content"]


def _foreign(message: dict[str, Any]) -> None:
    message["reasoning"]["provider"] = "anthropic"  # written by another provider: never sent here


@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        (_drop, "was provided without its required 'reasoning' item"),
        (_foreign, "was provided without its required 'reasoning' item"),
        (_alter, "could not be verified"),
        (_strip_content, "Items are not persisted when `store` is set to false"),
    ],
)
def test_the_fake_refuses_a_turn_whose_reasoning_was_dropped_or_altered(
    server: ReplayServer, tamper: Any, refusal: str
) -> None:
    provider = responses_provider(server)
    messages = task()
    step(provider, messages)
    tamper(messages[2])  # the assistant record of turn 0

    with pytest.raises(LLMError, match="HTTP 400") as caught:
        provider.chat(messages, TOOLS, cache_key="task-1")

    assert refusal in str(caught.value)
    assert not isinstance(caught.value, ContextOverflow)
    assert posts(server)[-1]["status"] == 400
    assert posts(server)[-1]["turn"] is None  # refused before the model saw it


def test_reasoning_moved_after_its_function_call_is_refused(server: ReplayServer) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=server.openai_base_url, max_retries=0)
    ask = {"role": "user", "content": "Fix it."}
    first = client.responses.create(model=MODEL, instructions=SYSTEM, input=[ask], store=False)  # type: ignore[list-item]
    reasoning, message, call = (item.model_dump(exclude_none=True) for item in first.output)
    reasoning.pop("status", None)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}

    with pytest.raises(openai.BadRequestError, match="was provided without its required 'reasoning' item"):
        client.responses.create(
            model=MODEL, instructions=SYSTEM, store=False, input=[ask, message, call, reasoning, output]  # type: ignore[list-item]
        )
    with pytest.raises(openai.BadRequestError, match="of type 'reasoning' was provided without its required following"):
        client.responses.create(
            model=MODEL, instructions=SYSTEM, store=False, input=[ask, reasoning, message, call, output, reasoning]  # type: ignore[list-item]
        )
    again = client.responses.create(
        model=MODEL, instructions=SYSTEM, store=False, input=[ask, reasoning, message, call, output]  # type: ignore[list-item]
    )
    assert again.status == "completed"


def test_function_call_outputs_and_calls_must_answer_each_other_by_call_id(server: ReplayServer) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=server.openai_base_url, max_retries=0)
    orphan = {"type": "function_call_output", "call_id": "call_nowhere", "output": "ok"}
    with pytest.raises(openai.BadRequestError, match="No tool call found for function call output with call_id"):
        client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, orphan], store=False)  # type: ignore[list-item]
    unanswered = {"type": "function_call", "call_id": "call_x", "name": "bash", "arguments": "{}"}
    with pytest.raises(openai.BadRequestError, match="No tool output found for function call call_x"):
        client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, unanswered], store=False)  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ({"tools": [BASH_TOOL]}, "Missing required parameter: 'tools[0].name'"),  # Chat Completions' shape
        (
            {"tools": [{"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}]},
            "'required' is required to be supplied",  # strict by default, and our schema has an optional argument
        ),
        ({"store": True}, "stateless"),
        ({"max_completion_tokens": 100}, "Unknown parameter: 'max_completion_tokens'"),
    ],
)
def test_the_fake_refuses_what_the_responses_api_refuses(
    server: ReplayServer, extra: dict[str, Any], refusal: str
) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=server.openai_base_url, max_retries=0)
    body = {"model": MODEL, "input": "hi", "store": False, **extra}
    with pytest.raises(openai.BadRequestError, match=refusal.replace("(", r"\(").replace("[", r"\[")):
        client.post("/responses", body=body, cast_to=openai.types.responses.Response)


def test_effort_output_cap_temperature_headers_and_cache_key_are_on_the_wire(server: ReplayServer) -> None:
    provider = responses_provider(
        server, effort="high", max_output_tokens=4000, temperature=0.3, headers=(("X-Team", "blue"),)
    )

    provider.chat(task(), TOOLS, cache_key="task-42")

    record = posts(server)[0]
    body = record["body"]
    assert body["reasoning"] == {"effort": "high"}
    assert body["max_output_tokens"] == 4000
    assert body["temperature"] == 0.3
    assert body["prompt_cache_key"] == "task-42"
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert "messages" not in body
    assert "summary" not in body["reasoning"]  # OpenAI refuses summaries to an organization it has not verified
    assert [t["name"] for t in body["tools"]] == ["bash", "finish"]
    assert all(t["strict"] is False and "function" not in t for t in body["tools"])
    assert record["headers"]["x-team"] == "blue"
    assert "authorization" not in record["headers"]  # the log never keeps the key
    assert KEY not in json.dumps(server.requests)


def test_without_settings_the_request_leaves_the_model_its_defaults(server: ReplayServer) -> None:
    responses_provider(server).chat(task(), TOOLS)

    body = posts(server)[0]["body"]
    assert not {"reasoning", "max_output_tokens", "temperature", "prompt_cache_key"} & body.keys()


def test_cached_input_tokens_are_reported_from_the_longest_prefix_of_the_same_cache_key() -> None:
    long_system = "You are a careful coding agent who reads before editing. " * 120  # about 1700 tokens
    with model_server(TURNS) as server:
        provider = responses_provider(server)
        messages = task(long_system)
        replies = [step(provider, messages, cache_key="task-a") for _ in TURNS]
        logged = [r["usage"] for r in posts(server)]

    assert replies[0].cached_tokens == 0  # nothing earlier to share a prefix with
    assert replies[1].cached_tokens is not None
    assert replies[2].cached_tokens is not None
    assert 1024 <= replies[1].cached_tokens < replies[2].cached_tokens  # the prefix grows with the conversation
    for reply, usage in zip(replies, logged, strict=True):
        assert reply.cached_tokens == usage["cached_tokens"]
        assert reply.prompt_tokens == usage["prompt_tokens"]
        cached, prompt = reply.cached_tokens or 0, reply.prompt_tokens or 0
        assert cached % 128 == 0
        assert cached <= prompt


def test_a_prompt_past_the_window_raises_context_overflow_at_once() -> None:
    with model_server(TURNS, context_window=30) as server:
        provider = responses_provider(server, max_retries=3)
        with pytest.raises(ContextOverflow, match="does not fit the context window") as caught:
            provider.chat(task(), TOOLS)
        assert caught.value.status == 400
        assert len(posts(server)) == 1  # compressing helps, sending it again does not
        assert posts(server)[0]["status"] == 400


@pytest.mark.parametrize(
    ("code", "raised", "posts_made"),
    [
        ("server_error", ModelUnavailable, 3),
        ("context_length_exceeded", ContextOverflow, 1),
        ("bad_image", LLMError, 1),
    ],
)
def test_a_response_that_failed_is_retried_only_when_it_may_pass(
    code: str, raised: type[LLMError], posts_made: int
) -> None:
    failed = {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": "failed",
        "error": {"code": code, "message": f"the response failed: {code}"},
        "model": MODEL,
        "output": [],
    }
    with canned_server(200, failed) as fake:
        spec = ModelSpec("gpt", PROVIDER, MODEL, 128000, fake.url)
        chosen = registry.build(spec, RetryPolicy(2, 0.01, 0.02), 10, KEY)
        with pytest.raises(raised, match=code) as caught:
            chosen.chat(task(), TOOLS)

    assert type(caught.value) is raised
    assert len(fake.posts) == posts_made


def test_effort_none_gets_no_reasoning_and_the_next_turn_sends_none(server: ReplayServer) -> None:
    provider = responses_provider(server, effort="none")  # gpt-5.1 and later can answer without reasoning
    messages = task()

    first = step(provider, messages)
    step(provider, messages)

    assert first.reasoning is None
    assert "reasoning" not in messages[2]
    assert [i["type"] for i in posts(server)[1]["body"]["input"]].count("reasoning") == 0
    assert [r["status"] for r in posts(server)] == [200, 200]


def run_on_gpt(
    tmp_path: Path, make_settings: Callable[..., Settings], profile: dict[str, Any]
) -> tuple[dict[str, Any], Path, list[dict[str, Any]]]:
    """The calc fix as one task (TaskRun in this process) on the profile ``gpt``, ``provider: openai-responses``,
    against the replay model's Responses API; the outcome, the context directory and the model's request log."""
    bubblewrap_here()
    repo = make_buggy_repo(tmp_path / "repo")
    with model_server(fix_calc_trajectory()) as server:
        models = {"gpt": {"provider": PROVIDER, "model": MODEL, "base_url": server.openai_base_url, **profile}}
        settings = make_settings({"TASUKI__LLM__MODELS": json.dumps(models), "TASUKI__LLM__DEFAULT": "gpt"})
        uuid = str(uuid_module.uuid4())
        request = TaskRequest(
            {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt", "task_id": uuid[:8]},
            prompt="Fix the failing test.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        outcome = TaskRun(
            uuid, request, settings, store, provider_for=lambda config: provider_for(config, settings)
        ).execute(llm_config(settings))
        requests = posts(server)
    directory = store.completed_path(uuid)
    validate_context_dir(directory)
    return outcome, directory, requests


@pytest.mark.integration
def test_a_whole_task_runs_on_an_openai_responses_profile(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    # gpt-4.1 does not reason: no reasoning items to carry (the next test has them)
    outcome, directory, requests = run_on_gpt(
        tmp_path, make_settings, {"model": "gpt-4.1", "max_output_tokens": 8000, "temperature": 0.2}
    )

    assert outcome["status"] == "completed", outcome
    assert outcome["summary"] == "Fix add(): it subtracted."
    assert [(r["path"], r["status"], r["kind"]) for r in requests] == [("/v1/responses", 200, "agent")] * 5
    bodies = [r["body"] for r in requests]
    assert all(b["max_output_tokens"] == 8000 and b["temperature"] == 0.2 for b in bodies)
    assert not any(i["type"] == "reasoning" for b in bodies for i in b["input"])
    assert len({b["prompt_cache_key"] for b in bodies}) == 1  # the task's UUID names its cache
    assert bodies[0]["prompt_cache_key"] == directory.name
    assert [i["type"] for i in bodies[-1]["input"]].count("function_call_output") == 4
    config = json.loads((directory / "metadata.json").read_text())["config"]
    assert (config["profile"], config["llm_provider"]) == ("gpt", PROVIDER)
    replies = [r for r in read_jsonl_lines(directory / "messages.jsonl") if r["role"] == "assistant"]
    assert [r["usage"]["prompt_tokens"] for r in replies] == [r["prompt_tokens"] for r in requests]


@pytest.mark.integration
def test_a_whole_task_with_reasoning_sends_every_reasoning_item_back(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    outcome, directory, requests = run_on_gpt(tmp_path, make_settings, {"effort": "low"})

    assert outcome["status"] == "completed", outcome
    assert [(r["status"], r["kind"]) for r in requests] == [(200, "agent")] * 5  # each passed the reasoning check
    assert [[i["type"] for i in r["body"]["input"]].count("reasoning") for r in requests] == [0, 1, 2, 3, 4]
    replies = [r for r in read_jsonl_lines(directory / "messages.jsonl") if r["role"] == "assistant"]
    assert all(r["reasoning"]["provider"] == PROVIDER and r["reasoning"]["items"] for r in replies)
