"""``tasuki context request UUID STEP``: the request one step sent; ``--send PROFILE``: another model's answer to it.

The request is read from the context's ``requests.jsonl`` (contexts/requests.py), rebuilt from the durable copy when
the context ran on another host of the fleet. Sending it again asks the other profile's model with the step's
provider-neutral messages and tools, as recorded (masked), and changes nothing in the context.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from cli.common import UsageError, out
from contexts.requests import RecordedRequest, request_of_step
from worker.stores import open_store

if TYPE_CHECKING:
    from agent.llm import Reply
    from worker.settings_models import Settings

EXIT_OK = 0
SEND_RETRY_FOR_S = 60.0  # a person waits for the answer: a model that fails for a minute is down for them


def request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuid", metavar="UUID", help="the task's UUID")
    parser.add_argument("step", metavar="STEP", type=_step, help="the model call's number (1 is the first)")
    parser.add_argument("--summary", action="store_true", help="the summary request made before STEP instead")
    parser.add_argument("--wire", action="store_true", help="the body as it was sent to the provider")
    parser.add_argument("--json", action="store_true", help="print everything recorded (and the answer) as JSON")
    parser.add_argument(
        "--send",
        metavar="PROFILE",
        help="send the step's messages and tools (as recorded, masked) to PROFILE's model and print its answer",
    )


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a step number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"steps count from 1, not {value}")
    return value


def cmd_context_request(args: argparse.Namespace, settings: Settings) -> int:
    """Print one step's request, or send it to another profile's model and print the answer."""
    from contexts.queries import readable

    if args.send and args.wire:
        raise UsageError("--send prints the other model's answer; --wire prints the recorded body: choose one")
    with readable(open_store(settings), args.uuid) as (store, _here):
        request = request_of_step(store.locate_inside(args.uuid), args.step, "summary" if args.summary else "agent")
    if args.send:
        reply = send_again(request, args.send, settings)
        if args.json:
            out(
                json.dumps(
                    {"request": _header_json(request), "answer": answer_json(reply)}, ensure_ascii=False, indent=2
                )
            )
        else:
            out(format_answer(args.send, reply))
        return EXIT_OK
    if args.json:
        out(json.dumps(request.to_json(), ensure_ascii=False, indent=2))
    elif args.wire:
        if request.wire is None:
            raise UsageError(f"step {request.step}'s provider recorded no wire body")
        out(json.dumps(request.wire, ensure_ascii=False, indent=2))
    else:
        out(format_request(request))
    return EXIT_OK


# -- sending again -------------------------------------------------------------------------------------------------


def send_again(request: RecordedRequest, profile: str, settings: Settings) -> Reply:
    """The answer of ``profile``'s model to the request's neutral messages and tools (no cache key: not the task's),
    retried for at most :data:`SEND_RETRY_FOR_S`."""
    from agent.llm import LLMError
    from worker.runtime import llm_config, provider_for

    try:
        config = llm_config(settings, profile)
    except KeyError:
        known = ", ".join(settings.llm.profile_names())
        raise UsageError(f"unknown profile {profile!r}: expected one of {known}") from None
    llm = settings.llm.model_copy(update={"retry_for_s": min(settings.llm.retry_for_s, SEND_RETRY_FOR_S)})
    try:
        provider = provider_for(config, settings.model_copy(update={"llm": llm}))
        return provider.chat(request.messages, request.tools)
    except LLMError as exc:
        where = f" at {config['endpoint']}" if config.get("endpoint") else ""
        raise LLMError(
            f"profile {profile!r} ({config['llm_provider']} {config['model']}{where}) did not answer: "
            f"{_first_line(str(exc))}",
            exc.status,
        ) from None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def answer_json(reply: Reply) -> dict[str, Any]:
    """The answer as JSON: text, tool calls, thinking and usage."""
    return {
        "model": reply.model,
        "content": reply.content,
        "thinking": reply.thinking,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.raw_arguments or c.arguments} for c in reply.tool_calls
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "cached_tokens": reply.cached_tokens,
            "cache_write_tokens": reply.cache_write_tokens,
        },
    }


def format_answer(profile: str, reply: Reply) -> str:
    """The answer for a person: who answered, its text, its tool calls, its usage."""
    lines = [f"answer of profile {profile} ({reply.model}):"]
    if reply.thinking:
        lines += ["", "thinking:", reply.thinking.strip()]
    if reply.content:
        lines += ["", reply.content.strip()]
    for call in reply.tool_calls:
        arguments = call.raw_arguments or json.dumps(call.arguments, ensure_ascii=False)
        lines += ["", f"tool call {call.name} {arguments}"]
    if not reply.content and not reply.tool_calls:
        lines += ["", "(no text and no tool call)"]
    lines += ["", "usage: " + _usage(reply)]
    return "\n".join(lines)


def _usage(reply: Reply) -> str:
    if reply.prompt_tokens is None and reply.completion_tokens is None:
        return "not reported"
    parts = [f"{reply.prompt_tokens or 0:,} prompt tokens"]
    cache = [
        f"{n:,} {what}"
        for n, what in ((reply.cached_tokens, "read from cache"), (reply.cache_write_tokens, "written to cache"))
        if n
    ]
    if cache:
        parts[0] += f" ({', '.join(cache)})"
    parts.append(f"{reply.completion_tokens or 0:,} completion tokens")
    return ", ".join(parts)


# -- printing the request ------------------------------------------------------------------------------------------


def _header_json(request: RecordedRequest) -> dict[str, Any]:
    record = request.to_json()
    return {key: record[key] for key in ("request_id", "step", "kind", "profile", "provider", "model", "reply_seq")}


def header(request: RecordedRequest) -> str:
    """One line: the step, its kind, who it was sent to, how big it was."""
    tools = f", {len(request.tools)} tools" if request.tools else ""
    reply = f" · reply: message {request.reply_seq}" if request.reply_seq is not None else ""
    when = f" · {request.timestamp}" if request.timestamp else ""
    return (
        f"step {request.step} · {request.kind} · profile {request.profile} ({request.provider} {request.model}) · "
        f"{len(request.messages)} messages{tools}{reply}{when}"
    )


def format_request(request: RecordedRequest) -> str:
    """The neutral prompt in full, message by message, under its header."""
    lines = [header(request)]
    if request.tools:
        names = [str(t.get("function", t).get("name", "?")) for t in request.tools if isinstance(t, dict)]
        lines.append(f"tools: {', '.join(names)}")
    for number, message in enumerate(request.messages, 1):
        lines += ["", _message_heading(number, message)]
        content = message.get("content")
        if content:
            lines.append(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, indent=2))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"→ {function.get('name')} {function.get('arguments')}")
    return "\n".join(lines)


def _message_heading(number: int, message: dict[str, Any]) -> str:
    role = str(message.get("role"))
    if role == "tool":
        return f"── {number} tool ({message.get('name', '?')}, {message.get('tool_call_id', '?')})"
    return f"── {number} {role}"
