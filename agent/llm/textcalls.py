"""Tool calls a model wrote as text instead of as native calls (issue 37 item 4).

Small local models served with their own chat template (Qwen2.5-Coder on llama.cpp, for one) often answer with
the call as a JSON object in their text: in a fenced ```json block, between ``<tool_call>`` tags (Qwen/Hermes
style) or bare. The server passes that through as plain content, so without this no command of theirs ever runs.

:func:`text_calls` finds every JSON object in the text that names a known tool, whichever wrapper surrounds it,
in the shapes models really write: ``{"name": N, "arguments": {...}}``, ``"parameters"`` instead of
``"arguments"``, OpenAI's ``{"type": "function", "function": {"name": N, "arguments": "..."}}``, and lists or
``{"tool_calls": [...]}`` holding several, and the arguments alone inside a tag named after the tool
(``<finish>{"summary": ...}</finish>``: what the recorded Qwen model writes once it has seen its tools' names in
the system prompt). Pure: text in, calls out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterator
from typing import Any

from agent.llm.base import ToolCall

ARGUMENT_KEYS = ("arguments", "parameters")
"""Where a written call keeps its arguments (``parameters``: Llama 3's format), in the order they are looked for."""
MAX_DEPTH = 4  # how deep a call is looked for inside an object that is not one ({"tool_calls": [...]})

_decoder = json.JSONDecoder(strict=False)  # models put raw newlines and tabs inside their strings
_OBJECT_START = re.compile(r"\{\s*\"")
_OPENING_TAG = re.compile(r"<([A-Za-z_][\w.-]{0,63})>\s*$")  # ``<bash>`` just before an object: its tool's arguments


def text_calls(text: str, tools: Collection[str], seed: object = "") -> list[ToolCall]:
    """The tool calls written in ``text`` that name one of ``tools`` with an object of arguments, in order.

    A call written twice in the same reply is taken once: the recorded Qwen model repeats its fenced call bare
    below it, and running ``echo x >> file`` twice is not what it asked for.

    ``seed`` says where the reply stands (the agent passes the seq its record will get), so the same call
    written in two replies gets two ids; each id is derived from the seed, the call's place and its content.
    """
    calls: list[ToolCall] = []
    for name, arguments in _written_calls(text, tools):
        if any((call.name, call.arguments) == (name, arguments) for call in calls):  # written twice: meant once
            continue
        index = len(calls)
        calls.append(ToolCall(id=call_id(seed, index, name, arguments), name=name, arguments=arguments))
    return calls


def call_id(seed: object, index: int, name: str, arguments: dict[str, Any]) -> str:
    """A stable id for the ``index``-th call of a reply: the same reply at the same place gets the same id."""
    content = json.dumps([str(seed), index, name, arguments], sort_keys=True, ensure_ascii=False, default=str)
    return f"call_text_{index}_{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def _written_calls(text: str, tools: Collection[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each JSON value in ``text`` that opens with ``{"`` is decoded and searched; what it spans is skipped, so
    a call quoted inside another call's string argument is never taken for a call of its own."""
    position = 0
    while (found := _OBJECT_START.search(text, position)) is not None:
        try:
            value, end = _decoder.raw_decode(text, found.start())
        except ValueError:
            position = found.start() + 1
            continue
        tagged = _tag_before(text, found.start(), tools)
        if tagged is not None and isinstance(value, dict) and not any(_calls_in(value, tools, MAX_DEPTH)):
            yield tagged, value  # ``<NAME>{arguments}</NAME>``: the object is the named tool's arguments
        else:
            yield from _calls_in(value, tools, MAX_DEPTH)
        position = end


def _tag_before(text: str, start: int, tools: Collection[str]) -> str | None:
    """The tool named by an opening tag right before ``start`` (whitespace between), if one is."""
    opened = _OPENING_TAG.search(text, max(0, start - 80), start)
    name = opened.group(1) if opened is not None else None
    return name if name in tools else None


def _calls_in(value: object, tools: Collection[str], depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """The calls ``value`` is or holds (a list of calls, ``{"tool_calls": [...]}``, ``{"tool_call": {...}}``)."""
    if depth <= 0:
        return
    if isinstance(value, list):
        for item in value:
            yield from _calls_in(item, tools, depth - 1)
        return
    if not isinstance(value, dict):
        return
    call = _as_call(value, tools)
    if call is not None:
        yield call
        return
    for inner in value.values():
        if isinstance(inner, (dict, list)):
            yield from _calls_in(inner, tools, depth - 1)


def _as_call(value: dict[str, Any], tools: Collection[str]) -> tuple[str, dict[str, Any]] | None:
    """``value`` as (tool name, arguments) when it is a call of a known tool whose arguments are an object."""
    function = value.get("function")
    if isinstance(function, dict):  # OpenAI's shape: {"type": "function", "function": {"name", "arguments"}}
        return _as_call(function, tools)
    name = value.get("name")
    if not isinstance(name, str) or name not in tools:
        return None
    key = next((key for key in ARGUMENT_KEYS if key in value), None)
    if key is None:
        return None
    arguments = value[key]
    if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string; a model copying it does too
        try:
            arguments = _decoder.decode(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or _is_schema(arguments):
        return None
    return name, arguments


def _is_schema(arguments: dict[str, Any]) -> bool:
    """Whether ``arguments`` are a JSON Schema: the tool's definition echoed back (the recorded Qwen model copies
    its ``<tools>`` block into its answer), not a call of it."""
    return arguments.get("type") == "object" and isinstance(arguments.get("properties"), dict)
