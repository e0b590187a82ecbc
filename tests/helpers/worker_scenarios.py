"""Scripted scenarios for worker tests: trajectories of bash steps, both providers, a stack with its model.

with running_stack(tmp_path, redis_url, [bash_turn(0), finish_turn()], provider="ollama") as (stack, server):
    stack.start_worker("w1")
    ...  # server.requests is the model's request log
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contexts.tokens import estimate_tokens
from replay import ReplayModel, ReplayServer, serve
from replay.rules import text_of
from replay.trajectory import MARKER_PATTERN, turns_from_entries
from tests.helpers.schemas import read_jsonl_lines
from tests.helpers.stack import Stack

PROVIDERS = ("openai", "ollama")
MODEL_NAME = "scripted"
LOG_LINE = "the quick brown fox jumps over the lazy dog"


def bash_turn(step: int, lines: int = 16, **extra: Any) -> dict[str, Any]:
    """A turn that prints ``lines`` distinct log lines (about 55 bytes each) with ``bash``."""
    command = f'for n in $(seq 1 {lines}); do echo "step {step} line $n: {LOG_LINE}"; done'
    return {"content": f"Step {step}: print the log block.", "tool_calls": [tool("bash", command=command)], **extra}


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    """One scripted tool call."""
    return {"name": name, "arguments": arguments}


def finish_turn(summary: str = "Printed every log block.") -> dict[str, Any]:
    """The last turn: ``finish``."""
    return {"content": "Done.", "tool_calls": [tool("finish", summary=summary)]}


def provider_env(provider: str, model_url: str, context_length: int) -> dict[str, str]:
    """Settings that point the worker's ``provider`` at the replay model with ``context_length``."""
    if provider == "ollama":
        return {
            "TASUKI__LLM__PROVIDER": "ollama",
            "TASUKI__LLM__OLLAMA__HOST": model_url,
            "TASUKI__LLM__OLLAMA__MODEL": MODEL_NAME,
            "TASUKI__LLM__OLLAMA__CONTEXT_LENGTH": str(context_length),
        }
    return {
        "TASUKI__LLM__PROVIDER": "openai",
        "TASUKI__LLM__OPENAI__BASE_URL": f"{model_url}/v1",
        "TASUKI__LLM__OPENAI__MODEL": MODEL_NAME,
        "TASUKI__LLM__OPENAI__CONTEXT_LENGTH": str(context_length),
    }


def request_tokens(body: dict[str, Any]) -> int:
    """UTF-8 bytes / 4 of everything a chat request asks the model to read: contents, tool calls, tool schemas."""
    tokens = 0
    for message in body.get("messages") or []:
        tokens += estimate_tokens(text_of(message.get("content")))
        if message.get("tool_calls"):
            tokens += estimate_tokens(json.dumps(message["tool_calls"], ensure_ascii=False))
    if body.get("tools"):
        tokens += estimate_tokens(json.dumps(body["tools"], ensure_ascii=False))
    return tokens


@contextmanager
def running_stack(
    root: Path,
    redis_url: str,
    entries: list[dict[str, Any]],
    *,
    provider: str = "openai",
    context_length: int = 32768,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[Stack, ReplayServer]]:
    """A replay model answering ``entries`` and a stack whose workers use it; everything stops on exit."""
    server = serve(ReplayModel(turns_from_entries(entries)))
    stack = Stack(root, redis_url, server.url, {**provider_env(provider, server.url, context_length), **(env or {})})
    try:
        yield stack, server
    finally:
        stack.stop()
        server.stop()


def context_records(directory: Path, name: str) -> list[dict[str, Any]]:
    """Every record of one JSONL file of a context directory (strict: no torn line allowed)."""
    return read_jsonl_lines(directory / name)


def replayed_turn(record: dict[str, Any]) -> int | None:
    """The replay turn an assistant record answers (its content's marker), or ``None``."""
    match = MARKER_PATTERN.search(record.get("content") or "")
    return int(match.group(1)) if match else None


def agent_requests(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's chat requests in a replay model's log (not summaries, not listings)."""
    return [r for r in requests if r["kind"] == "agent"]


def worker_logs(stack: Stack) -> str:
    """Every worker's log of the stack, concatenated."""
    return "\n".join(worker.log_text() for worker in stack.workers)
