"""Prompt caching: the billed input of a 40-step bug-fix session through Tasuki, against a harness with ideal
caching (issue 37's "Measured").

The session (bench/bugfix_session.py: file reads, test runs, diffs at the sizes a real session has) runs through
Tasuki's real agent loop: :class:`agent.loop.Agent`'s steps, ``build_prompt`` with the window's budget and
omissions, compression and its summary requests when the history passes the threshold, and each provider's real
request conversion, over HTTP to the fakes that speak each protocol: the fake Anthropic Messages API
(replay/anthropic_api.py) and the replay model's Responses and Chat Completions endpoints. The tools are not run:
each step's tool answers what the recorded session says, so every run sees the same outputs.

What each request cost is read back from ``requests.jsonl`` — every request as it went on the wire, summaries
included — and billed by the cache rules the fakes apply:

- Anthropic: ``fresh + 1.25 x written + 0.1 x read`` from the request's breakpoints (replay/anthropic_cache.py,
  Anthropic's documented rules; the fake's own reported usage is checked against it);
- OpenAI: the longest prefix (tools, instructions, items) shared with an earlier request of the same
  ``prompt_cache_key``, from 1,024 tokens in steps of 128 (replay/responses_api.py), cached tokens billed at 0.1 of
  an input token (GPT-5's published ratio: 0.125 against 1.25 USD per million).

The ideal harness sends the linear history — every message so far, nothing summarized or left out, whatever the
window — with one breakpoint on the newest message (Anthropic; as mini-swe-agent, SWE-agent, OpenHands send it) or
as it is (OpenAI, whose cache needs no breakpoint), billed by the same rules. At a 32k window that history does not
fit (the history reaches 40-46k tokens): the ideal is then a bound no harness with that window reaches, and
Tasuki's summaries (their requests billed too) are what it pays for the window. Targets: Anthropic <= 1.15x the
ideal, OpenAI <= 1.1x.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from agent.llm import ModelSpec, Provider, RetryPolicy, ToolCall, registry
from agent.llm.anthropic_provider import request_body
from agent.llm.openai_provider import COMPATIBLE, to_openai_messages
from agent.llm.responses_provider import responses_request
from agent.loop import Agent, AgentLimits
from agent.prompts import SYSTEM_PROMPT, task_message
from agent.tools import TOOL_SCHEMAS
from bench.bugfix_session import TASK, Step, session
from bench.common import Result, new_store, standalone
from contexts.compression import CompressionPolicy, Summarized
from contexts.context import Context
from contexts.jsonl import iter_records
from contexts.names import MESSAGES_FILE
from contexts.prompt import to_prompt_message
from contexts.requests import RecordedRequest, recorded_requests
from replay import ReplayModel, serve
from replay.anthropic_api import serve_anthropic
from replay.anthropic_cache import bill_requests
from replay.responses_api import CACHE_MIN_TOKENS, CACHE_STEP_TOKENS, prompt_units
from replay.trajectory import turns_from_entries
from worker.checkout import Checkout
from worker.logging import configure_logging
from worker.tasks import summarize, summary_span_budget

WINDOWS = (128_000, 32_000)
CACHED_PRICE = 0.1  # of an input token: OpenAI's GPT-5 cached input (0.125 USD / M against 1.25)
TARGETS = {"anthropic": 1.15, "openai-responses": 1.1, "openai": 1.1}
MODELS = {"anthropic": "claude-sonnet-4-5", "openai-responses": "gpt-5", "openai": "gpt-5"}
TASK_KEY = {"task_source": "local", "owner": "bench", "repo": "dateparse", "task_type": "issue", "task_id": "37"}


class RecordedCheckout:
    """A checkout the tools never touch: the session's outputs are recorded, nothing is run or checkpointed."""

    home = None

    def __init__(self, path: Path) -> None:
        self.path = path

    def checkpoint(self, step: int) -> bool:
        return False

    def restored_step(self) -> int | None:
        return None

    def restore_told(self) -> None:
        return None


class RecordedAgent(Agent):
    """The agent loop with each step's tool answered from the recorded session instead of run."""

    def __init__(self, steps: list[Step], *parts: Any, **options: Any) -> None:
        super().__init__(*parts, **options)
        self.outputs = iter(step.output for step in steps)

    def execute(self, calls: list[ToolCall]) -> str | None:
        summary = None
        for call in calls:
            output = next(self.outputs)
            if call.name == "finish":
                summary = str(call.arguments.get("summary", ""))
                output = f"finished: {summary}"
            self._record_result(call, output, "success", None, 5)
        return summary


@contextmanager
def anthropic_fake(model: ReplayModel, window: int) -> Iterator[str]:
    """The fake Anthropic Messages API answering the session's turns; yields its base URL."""
    fake = serve_anthropic(model, context_window=window)
    try:
        yield fake.url
    finally:
        fake.stop()


@contextmanager
def replay_fake(model: ReplayModel, window: int) -> Iterator[str]:
    """The replay model's OpenAI endpoints (Responses, Chat Completions) answering the session's turns."""
    server = serve(model)
    try:
        yield server.openai_base_url
    finally:
        server.stop()


def inline_compressor(provider: Provider, policy: CompressionPolicy) -> Callable[[Context], None]:
    """What a worker does when no compression worker is alive (worker/tasks.py's inline path): one summary request
    to the task's own model, its request recorded."""

    def compress(ctx: Context) -> None:
        def summarizer(previous: str | None, span: list[dict[str, Any]]) -> Summarized:
            text, _usage, sent = summarize(provider, previous, span)
            return Summarized(text, request=replace(sent, step=ctx.next_step))

        ctx.compress(summarizer, policy, summary_span_budget(ctx))

    return compress


@dataclass(frozen=True)
class Run:
    """One task's requests as sent, and its linear history."""

    provider: str
    window: int
    requests: list[RecordedRequest]
    history: list[dict[str, Any]]
    uuid: str
    reported: float | None  # what the fake's usage says the agent calls cost (Anthropic), to check the billing


def run_task(scratch: Path, provider: str, window: int, steps: list[Step]) -> Run:
    """The session through Tasuki's agent loop against ``provider``'s fake; its requests and history."""
    policy = CompressionPolicy()  # the settings' defaults: warn 0.6, threshold 0.7, 10 messages, keep 5
    model = ReplayModel(turns_from_entries([step.turn() for step in steps]))
    with VENDORS[provider].fake(model, window) as url:
        spec = ModelSpec(provider, provider, MODELS[provider], window, url)
        llm = registry.build(spec, RetryPolicy(0, 0.1, 0.1), 60.0, api_key="bench")
        store = new_store(scratch / f"{provider}-{window}", fsync="never")
        config = {"model": spec.model, "context_length": window, "llm_provider": provider, "profile": provider}
        ctx = store.create(TASK_KEY, config, heartbeat=False)
        ctx.append_message("system", SYSTEM_PROMPT)
        ctx.append_message("user", task_message(TASK))
        ctx.step_done()
        limits = AgentLimits(max_steps=100, context_length=window, tool_output_max_chars=20_000, bash_timeout_s=60)
        checkout = cast(Checkout, RecordedCheckout(scratch))
        agent = RecordedAgent(steps, ctx, llm, checkout, limits, policy, inline_compressor(llm, policy))
        agent.run()
        directory = ctx.finish("completed")
    records = list(iter_records(directory / MESSAGES_FILE))
    reported = None
    if VENDORS[provider].reports_cache_writes:
        usages = [r["usage"] for r in records if r.get("role") == "assistant" and r.get("usage")]
        reported = sum(_billed(u) for u in usages)
    return Run(
        provider,
        window,
        list(recorded_requests(directory)),
        [to_prompt_message(r) for r in records],
        directory.name,
        reported,
    )


def _billed(usage: dict[str, Any]) -> float:
    read, written = int(usage.get("cached_tokens") or 0), int(usage.get("cache_write_tokens") or 0)
    return int(usage.get("prompt_tokens") or 0) - read - written + 1.25 * written + 0.1 * read


# -- what a request costs --------------------------------------------------------------------------------------


def anthropic_bill(bodies: list[dict[str, Any]]) -> list[float]:
    """Each body's billed input at Anthropic's rules, sent in order to one cache."""
    return [usage.billed for usage in bill_requests(bodies)]


def chat_units(body: dict[str, Any]) -> list[tuple[str, int]]:
    """A Chat Completions body as the prefix cache sees it: the tools, then each message."""
    return prompt_units({"tools": body.get("tools"), "input": body.get("messages") or []})


def openai_bill(bodies: list[dict[str, Any]], units: Callable[[dict[str, Any]], list[tuple[str, int]]]) -> list[float]:
    """Each body's billed input at OpenAI's rules: the longest prefix shared with an earlier request of the same
    ``prompt_cache_key`` cached (from 1,024 tokens, in steps of 128) at :data:`CACHED_PRICE`, the rest fresh."""
    earlier: dict[str, list[list[tuple[str, int]]]] = {}
    out = []
    for body in bodies:
        mine = units(body)
        seen = earlier.setdefault(str(body.get("prompt_cache_key") or ""), [])
        shared = max((_common(mine, other) for other in seen), default=0)
        seen.append(mine)
        total = sum(tokens for _, tokens in mine)
        cached = 0 if total < CACHE_MIN_TOKENS or shared < CACHE_MIN_TOKENS else shared - shared % CACHE_STEP_TOKENS
        out.append(total - cached + CACHED_PRICE * cached)
    return out


def _common(units: list[tuple[str, int]], other: list[tuple[str, int]]) -> int:
    shared = 0
    for (digest, tokens), (other_digest, _) in zip(units, other, strict=False):
        if digest != other_digest:
            break
        shared += tokens
    return shared


def anthropic_sizes(bodies: list[dict[str, Any]]) -> list[int]:
    """Each body's input tokens, all of them (what it costs with no cache at all), as Anthropic counts them."""
    return [usage.prompt_tokens for usage in bill_requests(bodies)]


def unit_sizes(units: Callable[[dict[str, Any]], list[tuple[str, int]]]) -> Callable[[list[dict[str, Any]]], list[int]]:
    """Each body's input tokens, all of them, as OpenAI's prefix cache counts them (``units``)."""
    return lambda bodies: [sum(tokens for _, tokens in units(body)) for body in bodies]


# -- the ideal harness -----------------------------------------------------------------------------------------


def one_breakpoint(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with its breakpoints taken off and one put on the newest message's last block."""
    body = copy.deepcopy(body)
    for block in [*(body.get("tools") or []), *(body.get("system") or [])]:
        block.pop("cache_control", None)
    for message in body["messages"]:
        if isinstance(message["content"], list):
            for block in message["content"]:
                block.pop("cache_control", None)
    newest = body["messages"][-1]
    if isinstance(newest["content"], str):
        newest["content"] = [{"type": "text", "text": newest["content"]}]
    tail = [block for block in newest["content"] if block.get("type") not in ("thinking", "redacted_thinking")]
    tail[-1]["cache_control"] = {"type": "ephemeral"}
    return body


def chat_body(spec: ModelSpec, prompt: list[dict[str, Any]], _uuid: str) -> dict[str, Any]:
    """A Chat Completions body of ``prompt`` as it is, the way Tasuki's provider converts it."""
    return {
        "model": spec.model,
        "messages": to_openai_messages(prompt, reasoning_content=COMPATIBLE.reasoning_content),
        "tools": TOOL_SCHEMAS,
    }


def ideal_bodies(run: Run) -> list[dict[str, Any]]:
    """What the ideal harness sends for each step: the linear history before each reply, in the provider's
    shape (the same conversion Tasuki's provider uses)."""
    spec = ModelSpec(run.provider, run.provider, MODELS[run.provider], 10**9)
    prompts = [run.history[:i] for i, message in enumerate(run.history) if message["role"] == "assistant"]
    return [VENDORS[run.provider].ideal(spec, prompt, run.uuid) for prompt in prompts]


@dataclass(frozen=True)
class Vendor:
    """One provider as this benchmark bills it: its fake, its cache's rules, what the ideal harness sends."""

    fake: Callable[[ReplayModel, int], AbstractContextManager[str]]
    """The fake API for a model and a context window; entered, its base URL."""
    bill: Callable[[list[dict[str, Any]]], list[float]]
    """Each body's billed input token-equivalents, sent in order."""
    sizes: Callable[[list[dict[str, Any]]], list[int]]
    """Each body's input tokens, all of them (what it costs with no cache at all)."""
    ideal: Callable[[ModelSpec, list[dict[str, Any]], str], dict[str, Any]]
    """The ideal harness's body for a prompt (the task's uuid: the Responses API's cache key)."""
    reports_cache_writes: bool
    """Whether the fake reports what the cache wrote and read, checked against this billing."""


VENDORS = {
    "anthropic": Vendor(anthropic_fake, anthropic_bill, anthropic_sizes,
                        lambda spec, prompt, _: one_breakpoint(request_body(spec, prompt, TOOL_SCHEMAS)),
                        reports_cache_writes=True),
    "openai-responses": Vendor(replay_fake, lambda bodies: openai_bill(bodies, prompt_units), unit_sizes(prompt_units),
                               lambda spec, prompt, uuid: responses_request(spec, prompt, TOOL_SCHEMAS, uuid),
                               reports_cache_writes=False),
    "openai": Vendor(replay_fake, lambda bodies: openai_bill(bodies, chat_units), unit_sizes(chat_units), chat_body,
                     reports_cache_writes=False),
}
"""The providers measured, each with its own rules (the benchmark's table, beside the provider registry's)."""


# -- the benchmark ---------------------------------------------------------------------------------------------


def measure(run: Run) -> Result:
    """Tasuki's billed input against the ideal's, printed with what went into each."""
    bodies = [request.wire or {} for request in run.requests]
    vendor = VENDORS[run.provider]
    billed = vendor.bill(bodies)
    kinds = [request.kind for request in run.requests]
    tasuki = sum(billed)
    summaries = sum(cost for cost, kind in zip(billed, kinds, strict=True) if kind == "summary")
    ideal_side = ideal_bodies(run)
    ideal = sum(vendor.bill(ideal_side))
    ratio = tasuki / ideal
    target = TARGETS[run.provider]
    label = f"{run.provider} {run.window // 1000}k"  # fits the summary table's 34 columns with its prefix
    mine, theirs = vendor.sizes(bodies), vendor.sizes(ideal_side)
    print(
        f"{label}: {kinds.count('agent')} agent requests + {kinds.count('summary')} summaries; billed input "
        f"{tasuki:,.0f} token-equivalents ({summaries:,.0f} of them summaries), ideal {ideal:,.0f}: {ratio:.2f}x "
        f"(target <= {target})\n  without caching: {sum(mine):,} ({sum(mine) / ideal:.1f}x the ideal); the ideal's "
        f"history reaches {theirs[-1]:,} tokens, Tasuki's largest prompt {max(mine):,}",
        flush=True,
    )
    if run.reported is not None:
        agent_billed = sum(cost for cost, kind in zip(billed, kinds, strict=True) if kind == "agent")
        print(
            f"  the fake's reported usage of the agent calls: {run.reported:,.0f} (billed here: {agent_billed:,.0f})",
            flush=True,
        )
    return Result(f"caching {label}", f"{ratio:.2f}", f"<= {target}", ratio <= target)


def run(scratch: Path, *, quick: bool = False) -> list[Result]:
    """Each provider at each window: the session through Tasuki, billed, against the ideal harness."""
    configure_logging("WARNING")  # the agent logs every call; printing them is not the point
    steps = session(steps=12 if quick else 40)
    results = []
    for window in WINDOWS:
        for provider in VENDORS:
            started = time.perf_counter()
            task = run_task(scratch, provider, window, steps)
            results.append(measure(task))
            print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    return results


if __name__ == "__main__":
    standalone(run, __doc__)
