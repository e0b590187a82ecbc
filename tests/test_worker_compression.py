"""Compression end to end: a long task with a small context window, a real worker, the scripted model over HTTP.

The budget is asserted twice for every request, agent and summary alike, because the two counts answer
different questions.  The replay model's logged ``prompt_tokens`` is the model's own count (contents, tool
calls, tool schemas and per-message framing, as OpenAI and Ollama report usage); the agent calibrates its
estimates to it (SPEC §6), so it is what the window has to hold.  :func:`request_tokens` recomputes plain UTF-8
bytes / 4 of the same contents, tool calls and tool schemas here, independently of the code under test, so a
model that under-reports cannot make an oversized prompt pass.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from agent.prompts import SUMMARIZER_SYSTEM, SYSTEM_PROMPT, task_message
from agent.tools import TOOL_SCHEMAS
from cli.viewer import format_detail
from contexts import ContextStore
from contexts.clock import utc_now
from contexts.names import MESSAGES_FILE, SUMMARIES_FILE
from contexts.queries import show_context
from contexts.tokens import estimate_tokens
from tests.helpers.celery_worker import WorkerProcess
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    PROVIDERS,
    agent_requests,
    bash_turn,
    context_records,
    finish_turn,
    replayed_turn,
    request_tokens,
    running_stack,
    worker_logs,
)
from worker import compressors
from worker.names import COMPRESSION_QUEUE, STATS_KEY

pytestmark = pytest.mark.integration

# About 2,000 tokens beside what every request carries (the system prompt and the tool schemas): 32 steps of about
# 300 tokens compress several times.
CONTEXT_LENGTH = estimate_tokens(SYSTEM_PROMPT) + estimate_tokens(json.dumps(TOOL_SCHEMAS)) + 2000
STEPS = 32
PROMPT = "Print the log blocks."
COMPRESSION_ENV = {
    "TASUKI__COMPRESSION__MIN_MESSAGES": "6",
    "TASUKI__COMPRESSION__KEEP_RECENT": "3",
}
INLINE_NOTE = "no worker took the compression job in time"
JOB_RAN = re.compile(r"Task tasuki\.compress_context\[[^]]+\] (succeeded|failed|raised)")


def long_task() -> list[dict[str, Any]]:
    """32 steps of about 300 tokens each (a bash call and its output), then finish."""
    return [bash_turn(step) for step in range(STEPS)] + [finish_turn()]


def run_long_task(stack: Stack, tmp_path: Path, concurrency: int) -> tuple[dict[str, Any], Path]:
    repo = make_buggy_repo(tmp_path / "repo")
    stack.start_worker("w1", concurrency=concurrency)
    uuid = stack.send(local_request(repo, prompt=PROMPT))
    state = stack.wait_finished(uuid, timeout_s=120)
    assert state["status"] == "completed", state
    return state, stack.contexts_dir / "completed" / uuid


def assert_compressed_within_budget(
    directory: Path, state: dict[str, Any], requests: list[dict[str, Any]], failed_summaries: int = 0
) -> list[dict[str, Any]]:
    """The checks every compression run must pass; returns the summaries."""
    validate_context_dir(directory)
    messages = context_records(directory, MESSAGES_FILE)
    summaries = context_records(directory, SUMMARIES_FILE)

    assert len(summaries) >= 2, f"expected several compressions, got {len(summaries)}"
    assert state["compression_count"] == len(summaries)
    pinned_end = 2  # the system prompt and the task
    assert [m["role"] for m in messages[:pinned_end]] == ["system", "user"]
    expected_start = pinned_end + 1
    for summary in summaries:
        assert summary["start_seq"] == expected_start, summaries
        assert summary["end_seq"] >= summary["start_seq"]
        assert summary["compression_ratio"] == round(summary["summary_tokens"] / summary["original_tokens"], 4)
        assert summary["compression_ratio"] < 1
        expected_start = summary["end_seq"] + 1
    assert [s["previous_summary_id"] for s in summaries] == [None, *range(1, len(summaries))]
    # Each summary request is metered (whichever process ran it) and counted for the task, as the model answered.
    answered = [r["usage"] for r in requests if r["kind"] == "summary" and r.get("usage")]
    assert [s["usage"]["completion_tokens"] for s in summaries] == [u["completion_tokens"] for u in answered]
    summary_calls = [b for b in state["usage"]["by_call"].values() if b["kind"] == "summary"]
    assert [b["calls"] for b in summary_calls] == [len(summaries)]

    # Nothing was asked twice or skipped across compressions: one assistant record per turn, in order.
    assert [replayed_turn(m) for m in messages if m["role"] == "assistant"] == list(range(STEPS + 1))

    for request in requests:
        tokens = request_tokens(request["body"])
        assert tokens <= CONTEXT_LENGTH, f"{request['kind']} request of {tokens} tokens: {request['body']}"
        assert request["prompt_tokens"] <= CONTEXT_LENGTH, request["body"]

    agent = agent_requests(requests)
    assert len(agent) == STEPS + 1
    for request in agent:
        head = request["body"]["messages"][:2]
        assert head == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task_message(PROMPT)},
        ]

    summary_requests = [r for r in requests if r["kind"] == "summary"]
    assert len(summary_requests) == len(summaries) + failed_summaries
    stored = [m.get("content") or "" for m in messages]
    for request in summary_requests:
        system, user = request["body"]["messages"]
        assert system == {"role": "system", "content": SUMMARIZER_SYSTEM}
        assert all(user["content"] not in content and content != SUMMARIZER_SYSTEM for content in stored)
    for summary in summaries:  # a summary lives in summaries.jsonl and in later prompts, never in messages.jsonl
        assert all(summary["summary"] not in content for content in stored)
    return summaries


@pytest.mark.parametrize("provider", PROVIDERS)
def test_long_task_compresses_on_the_compression_queue_and_every_request_fits_the_window(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, provider: str
) -> None:
    with running_stack(
        tmp_path,
        redis_url,
        long_task(),
        provider=provider,
        context_length=CONTEXT_LENGTH,
        env=COMPRESSION_ENV,
    ) as (stack, server):
        state, directory = run_long_task(stack, tmp_path, concurrency=2)
        summaries = assert_compressed_within_budget(directory, state, server.requests)

        logs = worker_logs(stack)
        # Every summary came from a compress_context job that ran in the worker's other slot.
        assert [m.group(1) for m in JOB_RAN.finditer(logs)] == ["succeeded"] * len(summaries)
        assert INLINE_NOTE not in logs
        if provider == "ollama":
            chats = [r for r in server.requests if r["method"] == "POST"]
            assert {r["path"] for r in chats} == {"/api/chat"}
            assert all(r["body"]["options"]["num_ctx"] == CONTEXT_LENGTH for r in chats)


def test_a_single_busy_worker_summarizes_inline_when_no_one_takes_the_compression_job(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    env = {**COMPRESSION_ENV, "TASUKI__COMPRESSION__START_TIMEOUT_S": "0.3"}
    with running_stack(tmp_path, redis_url, long_task(), context_length=CONTEXT_LENGTH, env=env) as (stack, server):
        state, directory = run_long_task(stack, tmp_path, concurrency=1)
        summaries = assert_compressed_within_budget(directory, state, server.requests)

        assert worker_logs(stack).count(INLINE_NOTE) == len(summaries)
        # The jobs nobody started were revoked: once the slot is free the worker drops them unrun.
        stack.wait_until(
            lambda: (
                worker_logs(stack).count("Discarding revoked task: tasuki.compress_context") == len(summaries)
                and redis_client.llen(COMPRESSION_QUEUE) == 0
            ),
            timeout_s=30,
            what="the revoked compression jobs to be discarded",
        )
        assert not JOB_RAN.search(worker_logs(stack))


@pytest.mark.parametrize("failures", [1, 3])
def test_failed_summaries_never_lose_the_task_and_every_request_fits_the_window(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, failures: int
) -> None:
    turns = long_task()
    turns.insert(6, {"fail": 500, "for": "summary", "times": failures})  # the first summary requests fail
    env = {**COMPRESSION_ENV, "TASUKI__LLM__MAX_RETRIES": "0"}
    with running_stack(tmp_path, redis_url, turns, context_length=CONTEXT_LENGTH, env=env) as (stack, server):
        state, directory = run_long_task(stack, tmp_path, concurrency=2)
        assert_compressed_within_budget(directory, state, server.requests, failed_summaries=failures)

        statuses = [r["status"] for r in server.requests if r["kind"] == "summary"]
        assert statuses[: failures + 1] == [500] * failures + [200]
        # While no summary could be made, the oldest messages were left out of the prompt (not the files).
        prompts = [m["content"] for r in agent_requests(server.requests) for m in r["body"]["messages"]]
        marker = r"\[\d+ earlier messages omitted; the recall tool finds them\]"
        assert any(re.fullmatch(marker, text or "") for text in prompts)


def test_tasuki_worker_with_one_task_process_compresses_on_its_own_compression_worker(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """The fleet's normal case: every task process busy. ``tasuki worker`` brings compression capacity of its
    own (a threads worker beside the task worker), so no compression waits for a free task process."""
    with running_stack(tmp_path, redis_url, long_task(), context_length=CONTEXT_LENGTH, env=COMPRESSION_ENV) as (
        stack, server
    ):
        stack.workers.append(WorkerProcess("w1", stack.env(), tmp_path / "w1.log", tasuki=True).start())
        stack.wait_until(lambda: compressors.alive(redis_client, time.time()) > 0, what="the compression worker")
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo"), prompt=PROMPT))
        state = stack.wait_finished(uuid, timeout_s=120)
        assert state["status"] == "completed", state
        summaries = assert_compressed_within_budget(stack.contexts_dir / "completed" / uuid, state, server.requests)

        assert {s["via"] for s in summaries} == {"queue"}
        assert [m.group(1) for m in JOB_RAN.finditer(worker_logs(stack))] == ["succeeded"] * len(summaries)
        assert INLINE_NOTE not in worker_logs(stack)
        assert state["compression_run_ms"] == sum(s["run_ms"] for s in summaries)
        assert int(redis_client.hget(STATS_KEY, "compressions_via:queue") or 0) == len(summaries)
        shown = format_detail(show_context(ContextStore(stack.contexts_dir), uuid), now=utc_now(), width=200,
                              all_summaries=True)
        assert f"Compressions: {len(summaries)} (waited " in shown
        assert shown.count("via queue, waited ") == len(summaries)


def test_with_no_compression_worker_alive_a_task_summarizes_in_its_own_process_without_waiting(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    # A wait for a consumer would last start_timeout_s per compression: far past the test's time-out.
    env = {**COMPRESSION_ENV, "TASUKI__COMPRESSION__START_TIMEOUT_S": "3600"}
    with running_stack(tmp_path, redis_url, long_task(), context_length=CONTEXT_LENGTH, env=env) as (stack, server):
        stack.workers.append(WorkerProcess("w1", stack.env(), tmp_path / "w1.log", queues="tasks").start())
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo"), prompt=PROMPT))
        state = stack.wait_finished(uuid, timeout_s=120)
        assert state["status"] == "completed", state
        summaries = assert_compressed_within_budget(stack.contexts_dir / "completed" / uuid, state, server.requests)

        assert {(s["via"], s["queue_wait_ms"]) for s in summaries} == {("inline", 0)}
        assert worker_logs(stack).count("no compression worker is alive") == len(summaries)
        assert redis_client.llen(COMPRESSION_QUEUE) == 0  # no job was ever sent
