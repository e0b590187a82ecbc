"""Tool calls written as text (agent/llm/textcalls.py): on replies recorded from a real small model served by
llama.cpp (tests/data/text_tool_calls, recorded by bench/local_model_calls.py) and on adversarial text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.llm.textcalls import text_calls
from agent.tools import TOOLS

RECORDINGS = Path(__file__).parent / "data" / "text_tool_calls"


def named(text: str, seed: object = "") -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of each call found in ``text``."""
    return [(call.name, call.arguments) for call in text_calls(text, TOOLS, seed)]


# -- recorded replies of Qwen2.5-Coder-1.5B-Instruct on llama-server ------------------------------------------------


def recordings() -> dict[str, dict[str, Any]]:
    """Each recorded conversation by its file's name."""
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(RECORDINGS.glob("*.json"))}


def recorded_replies() -> list[dict[str, Any]]:
    """The assistant message of every recorded raw response."""
    return [
        turn["response"]["choices"][0]["message"]
        for recording in recordings().values()
        for turn in recording["responses"]
    ]


def is_schema(arguments: dict[str, Any]) -> bool:
    return arguments.get("type") == "object" and "properties" in arguments


def test_the_recordings_are_raw_chat_completions_of_a_real_model_that_never_made_a_native_call() -> None:
    replies = recorded_replies()

    assert {recording["task"] for recording in recordings().values()} == {"calc-add", "envfile-equals", "chunked-tail"}
    assert len(replies) >= 30
    assert all(not message.get("tool_calls") for message in replies)  # what Tasuki ran before: nothing
    assert all(isinstance(message.get("content"), str) for message in replies)


def test_most_recorded_replies_carry_a_call_tasuki_now_runs() -> None:
    replies = recorded_replies()

    runnable = [message for message in replies if text_calls(message["content"], TOOLS)]

    assert len(runnable) >= 0.7 * len(replies), f"{len(runnable)} of {len(replies)}"


@pytest.mark.parametrize("name", sorted(recordings()))
def test_each_recorded_reply_gives_the_calls_the_conversation_went_on_with(name: str) -> None:
    """The conversation was continued with the calls found in each reply by the parser of the day: the same reply
    still gives them, each once, except the tool definitions the first chunked-tail conversation took for calls."""
    recording = recordings()[name]
    messages = recording["messages"]
    for turn in recording["responses"]:
        content = turn["response"]["choices"][0]["message"]["content"]
        answered = messages[turn["messages_sent"]]  # the assistant message the next request carried
        assert answered["role"] == "assistant"
        assert answered["content"] == content  # recorded as it came
        expected = []
        for call in answered.get("tool_calls") or []:
            named_call = (call["function"]["name"], json.loads(call["function"]["arguments"]))
            if named_call not in expected and not is_schema(named_call[1]):
                expected.append(named_call)
        assert named(content) == expected


def test_tool_definitions_the_model_echoed_are_no_calls() -> None:
    reply = recordings()["chunked-tail-first"]["responses"][0]["response"]["choices"][0]["message"]["content"]
    assert '{"type": "function", "function": {"name": "bash", "description"' in reply  # it copied its <tools>

    assert named(reply) == []


def test_a_call_in_doubled_braces_and_angle_brackets_as_the_recorded_model_wrote_it() -> None:
    reply = recordings()["chunked-tail"]["responses"][1]["response"]["choices"][0]["message"]["content"]
    assert reply.startswith('<{{"name": "recall", "arguments": ')

    assert [name for name, _ in named(reply)] == ["recall", "recall"]


def test_a_fenced_json_call_as_the_recorded_model_writes_it() -> None:
    reply = (
        '```json\n{\n  "name": "bash",\n  "arguments": {\n    "command": "bash -c \'echo -e \\"5\\" > test_calc.py\'",'
        '\n    "timeout_s": 60\n  }\n}\n```\n\n'
    )

    assert named(reply) == [("bash", {"command": "bash -c 'echo -e \"5\" > test_calc.py'", "timeout_s": 60})]


# -- the formats ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>',
        'I will read it.\n```json\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n```',
        '```\n{"name": "read_file", "parameters": {"path": "calc.py"}}\n```',
        '{"name": "read_file", "arguments": "{\\"path\\": \\"calc.py\\"}"}',
        '{"type": "function", "function": {"name": "read_file", "arguments": "{\\"path\\": \\"calc.py\\"}"}}',
        '{"tool_calls": [{"id": "x", "function": {"name": "read_file", "arguments": {"path": "calc.py"}}}]}',
        'Let me look: {"name": "read_file", "arguments": {"path": "calc.py"}} and then fix it.',
    ],
    ids=["qwen-tags", "fenced-json", "parameters", "string-arguments", "openai-shape", "tool-calls-list", "bare"],
)
def test_every_format_a_model_writes_gives_the_call(reply: str) -> None:
    assert named(reply) == [("read_file", {"path": "calc.py"})]


def test_several_calls_come_in_the_order_written() -> None:
    reply = (
        'First the tests:\n```json\n{"name": "bash", "arguments": {"command": "python -m unittest"}}\n```\n'
        'then the file:\n<tool_call>{"name": "read_file", "arguments": {"path": "calc.py"}}</tool_call>\n'
        '[{"name": "edit_file", "arguments": {"path": "calc.py", "old_string": "-", "new_string": "+"}},'
        ' {"name": "finish", "arguments": {"summary": "fixed"}}]'
    )

    assert [name for name, _ in named(reply)] == ["bash", "read_file", "edit_file", "finish"]


def test_a_call_naming_an_unknown_tool_is_no_call() -> None:
    reply = '```json\n{"name": "python", "arguments": {"code": "print(1)"}}\n```'

    assert named(reply) == []


def test_arguments_inside_a_tag_named_after_the_tool_as_the_real_model_wrote_them() -> None:
    # Qwen2.5-Coder-1.5B on llama-server, after issue 38's prompt named its tools: the arguments alone, in a tag.
    reply = (
        "I fixed the bug.\n<finish>\n{\"summary\": \"add now adds\"}\n</finish>\n"
        '<bash>{"command": "python -m pytest -q"}</bash>'
    )

    assert named(reply) == [("finish", {"summary": "add now adds"}), ("bash", {"command": "python -m pytest -q"})]


def test_a_tag_that_names_no_tool_or_holds_a_whole_call_is_read_as_before() -> None:
    assert named('<python>{"code": "print(1)"}</python>') == []
    assert named('<result>{"summary": "x"}</result>') == []
    whole = '<bash>{"name": "read_file", "arguments": {"path": "a.py"}}</bash>'  # the call inside wins over the tag
    assert named(whole) == [("read_file", {"path": "a.py"})]
    assert named('<bash> but first, prose {"command": "ls"}') == []  # the object must follow the tag


def test_arguments_that_are_not_an_object_make_no_call() -> None:
    for reply in ('{"name": "bash", "arguments": "ls -la"}', '{"name": "bash", "arguments": ["ls"]}',
                  '{"name": "bash", "arguments": null}', '{"name": "bash"}'):
        assert named(reply) == [], reply


def test_prose_that_mentions_json_is_no_call() -> None:
    reply = (
        'The package.json holds {"name": "demo", "version": "1.0.0", "scripts": {"test": "jest"}}; '
        "a call looks like {name: bash} in the docs, and an empty object is {}. Braces } { stray."
    )

    assert named(reply) == []


def test_braces_and_quotes_inside_strings_stay_inside_the_call() -> None:
    content = 'def f():\n    return {"name": "bash", "arguments": {"command": "rm -rf /"}}\n# } ] ) {\n'
    call = {"name": "write_file", "arguments": {"path": "f.py", "content": content}}
    reply = "```json\n" + json.dumps(call) + "\n```"

    assert named(reply) == [("write_file", {"path": "f.py", "content": content})]


def test_raw_newlines_inside_a_string_as_small_models_write_them() -> None:
    reply = '{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\ny = 2\n"}}'

    assert named(reply) == [("write_file", {"path": "a.py", "content": "x = 1\ny = 2\n"})]


def test_a_broken_object_before_a_good_one_is_skipped() -> None:
    reply = '{"name": "bash", "arguments": {"command": "ls"\nsorry:\n{"name": "bash", "arguments": {"command": "pwd"}}'

    assert named(reply) == [("bash", {"command": "pwd"})]


def test_a_call_written_twice_in_one_reply_is_taken_once() -> None:
    call = '{"name": "bash", "arguments": {"command": "echo x >> notes.txt"}}'
    reply = f"```json\n{call}\n```\n\n\n\n{call}\n"  # as the recorded model repeats its call below the fence

    assert named(reply) == [("bash", {"command": "echo x >> notes.txt"})]


def test_ids_are_stable_distinct_within_a_reply_and_differ_between_replies() -> None:
    reply = '{"name": "bash", "arguments": {"command": "ls"}} {"name": "bash", "arguments": {"command": "pwd"}}'

    first = [c.id for c in text_calls(reply, TOOLS, seed=7)]

    assert first == [c.id for c in text_calls(reply, TOOLS, seed=7)]
    assert len(set(first)) == 2
    assert set(first).isdisjoint(c.id for c in text_calls(reply, TOOLS, seed=9))
    assert all(len(i) <= 40 and i.replace("_", "").isalnum() for i in first)  # what every API accepts as an id


# -- properties -----------------------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=12), json_values, max_size=4)
prose = st.text(alphabet=st.characters(blacklist_characters="{"), max_size=60)
WRAPPERS = (
    lambda call: call,
    lambda call: f"```json\n{call}\n```",
    lambda call: f"```\n{call}\n```",
    lambda call: f"<tool_call>\n{call}\n</tool_call>",
)


@given(st.sampled_from(sorted(TOOLS)), arguments, st.sampled_from(range(len(WRAPPERS))),
       st.sampled_from(["arguments", "parameters"]), prose, prose)
def test_any_call_in_any_wrapper_between_any_prose_is_found(
    name: str, args: dict[str, Any], wrapper: int, key: str, before: str, after: str
) -> None:
    call = json.dumps({"name": name, key: args}, ensure_ascii=False)

    assert named(before + WRAPPERS[wrapper](call) + after) == [(name, args)]


@given(st.text(min_size=1, max_size=20).filter(lambda n: n not in TOOLS), arguments, prose)
def test_a_name_that_is_no_tool_never_makes_a_call(name: str, args: dict[str, Any], before: str) -> None:
    assert named(before + json.dumps({"name": name, "arguments": args})) == []


@given(st.text(max_size=300))
def test_any_text_parses_without_error(text: str) -> None:
    for call in text_calls(text, TOOLS):
        assert call.name in TOOLS
        assert isinstance(call.arguments, dict)
