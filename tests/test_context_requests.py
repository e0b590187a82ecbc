"""Every request a task's model calls sent, recorded beside ``messages.jsonl`` (issue 37): a real task in-process
against the replay model over HTTP, compression included; the file's size, mode, masking and torn tail; its copies
(retention, the fleet's durable copy); and ``tasuki context request`` as an operator runs it, ``--send`` to a second
replay server configured as another profile."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.llm import make_provider
from agent.loop import Agent, AgentLimits
from agent.prompts import SYSTEM_PROMPT, task_message
from agent.tools import TOOL_SCHEMAS
from contexts import ContextStore
from contexts.clock import utc_now
from contexts.compression import CompressionPolicy, Summarized
from contexts.context import Context
from contexts.names import REQUESTS_FILE
from contexts.requests import SentRequest, recorded_requests, request_of_step
from contexts.retention import gzip_context
from contexts.tokens import estimate_tokens
from replay import ReplayServer
from tests.helpers.cli_process import ok, one_line_error
from tests.helpers.fleet_hosts import HostFactory
from tests.helpers.model_server import model_server
from tests.helpers.schemas import read_jsonl_lines, validate_record
from tests.helpers.stack import make_buggy_repo
from tests.helpers.worker_scenarios import bash_turn, finish_turn, replayed_turn, tool
from worker.checkout import Checkout
from worker.tasks import summarize

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}
TOKEN = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"  # a secret a tool prints; never on disk
# Compresses every few steps (tests/test_worker_compression.py's size): about 2,000 tokens beside what every request
# carries, the system prompt and the tool schemas.
SMALL_WINDOW = estimate_tokens(SYSTEM_PROMPT) + estimate_tokens(json.dumps(TOOL_SCHEMAS)) + 2000
LARGE_WINDOW = 1_000_000  # never compresses, never omits: every request repeats the whole history
COMPRESSING = CompressionPolicy(min_messages=6, keep_recent=3)


def leaky_turn(step: int) -> dict[str, Any]:
    """A bash step whose output holds a token, among lines of its own."""
    turn = bash_turn(step)
    command = f'echo "deploy key for step {step}: {TOKEN}"; ' + turn["tool_calls"][0]["arguments"]["command"]
    return {"content": f"Step {step}: check the deploy key.", "tool_calls": [tool("bash", command=command)]}


class Task:
    """One task in this process: a store, a held context, a checkout, the replay model and an agent over them."""

    def __init__(self, root: Path, server: ReplayServer, window: int, *, compress: bool = True) -> None:
        self.server = server
        self.store = ContextStore(root / "contexts", fsync="never")
        self.ctx = self.store.create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
        self.ctx.append_message("system", SYSTEM_PROMPT)
        self.ctx.append_message("user", task_message("Check the deploy keys."))
        self.ctx.step_done()
        self.checkout = Checkout(root / "workspace", str(make_buggy_repo(root / "repo")), "tasuki/1-requests")
        self.checkout.prepare()
        self.provider = make_provider("openai", "scripted", window, server.openai_base_url, None, max_retries=0)
        limits = AgentLimits(200, window, tool_output_max_chars=20000, bash_timeout_s=30)
        compressor = self.compress if compress else None
        self.agent = Agent(self.ctx, self.provider, self.checkout, limits, COMPRESSING, compressor)

    def compress(self, ctx: Context) -> None:
        """The inline summary a worker makes when no compression worker is alive (worker/tasks.py's)."""

        def summarizer(previous: str | None, span: list[dict[str, Any]]) -> Summarized:
            text, _usage, sent = summarize(self.provider, previous, span)
            return Summarized(text, request=replace(sent, step=ctx.next_step))

        ctx.compress(summarizer, COMPRESSING)

    def run(self) -> Path:
        self.agent.run()
        return self.ctx.finish("completed")


@pytest.fixture
def run_task(tmp_path: Path) -> Iterator[Any]:
    """``run_task(entries, window)``: the task run to its finish; returns (directory, the model's request log)."""
    servers: list[Any] = []

    def run(entries: list[dict[str, Any]], window: int, name: str = "task") -> tuple[Path, list[dict[str, Any]]]:
        server = model_server(entries)
        started = server.__enter__()
        servers.append(server)
        task = Task(tmp_path / name, started, window)
        return task.run(), started.requests

    yield run
    for server in servers:
        server.__exit__(None, None, None)


def test_every_call_is_recorded_as_sent_even_after_a_summary_changed_the_prompt(run_task: Any) -> None:
    steps = 14
    directory, log = run_task([leaky_turn(n) for n in range(steps)] + [finish_turn()], SMALL_WINDOW)
    recorded = list(recorded_requests(directory))
    chats = [entry for entry in log if entry["kind"] in ("agent", "summary")]

    # One record per model call, in the order they were sent, each the body the server received.
    assert [r.kind for r in recorded] == [entry["kind"] for entry in chats]
    assert [r.wire for r in recorded] == [entry["body"] for entry in chats]
    agent = [r for r in recorded if r.kind == "agent"]
    assert [r.step for r in agent] == list(range(1, steps + 2))
    assert [r.model for r in recorded] == ["scripted"] * len(recorded)
    assert {(r.profile, r.provider) for r in recorded} == {("openai", "openai")}
    lines = read_jsonl_lines(directory / REQUESTS_FILE)
    for line in lines:
        validate_record("request", line)
    assert [line["request_id"] for line in lines] == list(range(1, len(recorded) + 1))

    # After a summary the request is not the history: the summary stands where the oldest messages were.
    summaries = [r for r in recorded if r.kind == "summary"]
    assert len(summaries) >= 2
    after = next(r for r in agent if r.request_id > summaries[0].request_id)
    assert after.step == summaries[0].step  # the summary was made before that step's call
    assert after.messages[2]["content"].startswith("Summary of the work so far")
    messages = [json.loads(line) for line in (directory / "messages.jsonl").read_text().splitlines()]
    assert after.messages != [{"role": m["role"], "content": m["content"]} for m in messages[: len(after.messages)]]
    # Each agent record's neutral prompt is what the wire body carries, and its reply is the message it names.
    for request in agent:
        assert request.tools is not None
        assert next(t["function"]["name"] for t in request.tools) == "bash"
        assert [m["content"] for m in request.messages] == [m["content"] for m in request.wire["messages"]]
        reply = next(m for m in messages if m["seq"] == request.reply_seq)
        assert replayed_turn(reply) == request.step - 1
    assert summaries[0].messages[0]["content"].startswith("You summarize")
    assert summaries[-1].tools is None


def test_the_file_is_0600_and_the_token_a_tool_printed_is_nowhere_in_it(run_task: Any) -> None:
    directory, _ = run_task([leaky_turn(n) for n in range(8)] + [finish_turn()], SMALL_WINDOW)
    path = directory / REQUESTS_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    rebuilt = json.dumps([r.to_json() for r in recorded_requests(directory)])
    assert "[GITHUB_TOKEN]" in rebuilt
    assert "deploy key for step 7" in rebuilt
    assert TOKEN not in rebuilt
    assert TOKEN not in path.read_text()


def test_a_secret_in_what_is_handed_over_is_masked_before_the_disk(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    ctx = store.create(TASK_KEY, {"model": "m"}, heartbeat=False)
    secret = "sk-" + "proj" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    messages = [{"role": "user", "content": f"use {secret}"}]
    ctx.record_request(SentRequest(1, "agent", "p", "openai", "m", messages, None, {"messages": messages}))
    later = [*messages, {"role": "assistant", "content": f"again {secret}"}]
    ctx.record_request(SentRequest(2, "agent", "p", "openai", "m", later, None, {"messages": later}))
    first, second = recorded_requests(ctx.path)
    assert second.messages == [
        {"role": "user", "content": "use [OPENAI_KEY]"},
        {"role": "assistant", "content": "again [OPENAI_KEY]"},
    ]
    assert second.wire == {"messages": second.messages}
    assert secret not in json.dumps([first.to_json(), second.to_json()])
    ctx.detach()


def test_reasoning_items_opaque_fields_are_kept_byte_for_byte(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    ctx = store.create(TASK_KEY, {"model": "m"}, heartbeat=False)
    sealed = "gAAAA" + "sk-" + "Q1w2E3r4T5y6U7i8O9p0A1s2" + "=="  # ciphertext that happens to look like a key
    item = {"type": "reasoning", "id": "rs_1", "encrypted_content": sealed, "summary": []}
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "sk-" + "Q1w2E3r4T5y6U7i8O9p0A1s2",
            "reasoning": {"provider": "x", "items": [item]},
        },
    ]
    ctx.record_request(SentRequest(1, "agent", "p", "x", "m", messages, None, {"input": [item]}))
    (recorded,) = recorded_requests(ctx.path)
    assert recorded.messages[1]["reasoning"]["items"] == [item]
    assert recorded.wire == {"input": [item]}
    assert recorded.messages[1]["content"] == "[OPENAI_KEY]"
    ctx.detach()


def stored_bytes(directory: Path) -> int:
    return sum(r.stored_bytes for r in recorded_requests(directory))


def prompt_bytes(directory: Path) -> int:
    """What storing every request whole would take (its neutral messages and wire body as JSON)."""
    return sum(len(json.dumps([r.messages, r.wire])) for r in recorded_requests(directory))


def test_the_file_grows_with_the_task_not_with_its_square(run_task: Any) -> None:
    short, _ = run_task([bash_turn(n, lines=30) for n in range(10)] + [finish_turn()], LARGE_WINDOW, "short")
    long, _ = run_task([bash_turn(n, lines=30) for n in range(40)] + [finish_turn()], LARGE_WINDOW, "long")
    assert len(list(recorded_requests(long))) == 41
    # Whole requests grow with the square of the steps (about 13x from 10 to 40 steps here); the records about 4x.
    assert prompt_bytes(long) / prompt_bytes(short) > 10
    growth = stored_bytes(long) / stored_bytes(short)
    assert growth < 6, growth
    assert (long / REQUESTS_FILE).stat().st_size < (long / "messages.jsonl").stat().st_size


def test_a_torn_last_record_is_dropped_on_read_and_cut_by_the_next_holder(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never", stale_after_s=60)
    ctx = store.create(TASK_KEY, {"model": "m"}, heartbeat=False)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for step in range(1, 4):
        history = [*history, {"role": "assistant", "content": f"step {step}"}]
        ctx.record_request(SentRequest(step, "agent", "p", "openai", "m", history, None, None))
    ctx.detach()
    path = ctx.path / REQUESTS_FILE
    whole = path.read_bytes()
    torn = whole.rstrip(b"\n").rsplit(b"\n", 1)[1][:40]  # the start of the last record again, cut off
    with open(path, "ab") as handle:
        handle.write(torn)
    assert [r.step for r in recorded_requests(ctx.path)] == [1, 2, 3]

    later = utc_now() + timedelta(seconds=61)
    resumed = ContextStore(tmp_path, fsync="never", stale_after_s=60, hostname="other", clock=lambda: later).open(
        ctx.uuid, heartbeat=False
    )
    history = [*history, {"role": "assistant", "content": "step 4"}]
    resumed.record_request(SentRequest(4, "agent", "p", "openai", "m", history, None, None))
    assert path.read_bytes().startswith(whole)
    assert torn not in path.read_bytes()[len(whole) :]
    assert request_of_step(resumed.path, 4).messages == history  # a new holder's first record stands alone
    assert [r.step for r in recorded_requests(resumed.path)] == [1, 2, 3, 4]
    resumed.detach()


def test_a_gzipped_context_reads_its_requests(run_task: Any) -> None:
    directory, _ = run_task([bash_turn(n) for n in range(3)] + [finish_turn()], SMALL_WINDOW)
    before = [r.to_json() for r in recorded_requests(directory)]
    gzip_context(directory)
    assert not (directory / REQUESTS_FILE).exists()
    assert (directory / f"{REQUESTS_FILE}.gz").exists()
    assert [r.to_json() for r in recorded_requests(directory)] == before


def test_the_fleets_durable_copy_carries_the_requests_byte_for_byte(
    host: HostFactory, fleet_dsn: str, tmp_path: Path
) -> None:
    from fleet.durable import PostgresCopy
    from fleet.store import FleetStore

    store = host("a")
    ctx = store.create(TASK_KEY, {"model": "m"}, heartbeat=False)
    history = [{"role": "user", "content": "task"}]
    for step in range(1, 4):
        history = [*history, {"role": "assistant", "content": f"step {step}"}]
        ctx.record_request(SentRequest(step, "agent", "p", "openai", "m", history, None, {"messages": history}))
        ctx.append_message("assistant", f"step {step}")
        ctx.stage_state(add={"llm_call_count": 1}, status="processing")
        ctx.step_done()
    done = ctx.finish("completed")
    rebuilt = tmp_path / "elsewhere" / ctx.uuid
    with FleetStore(fleet_dsn) as fleet:
        PostgresCopy(fleet).rebuild(ctx.uuid, rebuilt)
    assert (rebuilt / REQUESTS_FILE).read_bytes() == (done / REQUESTS_FILE).read_bytes()
    assert request_of_step(rebuilt, 3).messages == history


# -- tasuki context request ----------------------------------------------------------------------------------------


def other_model_turns(count: int) -> list[dict[str, Any]]:
    return [
        {"content": f"The other model would list the files at turn {n}.", "tool_calls": [tool("bash", command="ls")]}
        for n in range(count)
    ]


@pytest.fixture
def finished_task(run_task: Any) -> tuple[Path, list[dict[str, Any]]]:
    return run_task([leaky_turn(n) for n in range(6)] + [finish_turn()], SMALL_WINDOW)  # type: ignore[no-any-return]


def tasuki(directory: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``tasuki ARGS`` as an operator would, on the store ``directory`` is in, with ``config`` as its file."""
    base = directory.parent.parent
    config_file = base.parent / "config.yaml"
    config_file.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update(TASUKI_CONFIG=str(config_file), TASUKI__CONTEXTS__BASE_DIR=str(base), COLUMNS="100")
    script = Path(sys.executable).with_name("tasuki")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, cwd=base.parent, timeout=60, check=False
    )


def profiles(other_url: str) -> str:
    return (
        "llm:\n  max_retries: 0\n  models:\n"
        f"    other: {{provider: openai, model: other-model, base_url: '{other_url}'}}\n"
        "    gone: {provider: openai, model: nobody, base_url: 'http://127.0.0.1:9/v1'}\n"
    )


def test_the_cli_prints_a_step_its_wire_body_and_json(finished_task: tuple[Path, list[dict[str, Any]]]) -> None:
    directory, log = finished_task
    uuid = directory.name
    step = request_of_step(directory, 4)

    text = ok(tasuki(directory, "", "context", "request", uuid, "4"))
    assert text.splitlines()[0].startswith("step 4 · agent · profile openai (openai scripted) · 8 messages")
    assert "deploy key for step 2: [GITHUB_TOKEN]" in text
    assert TOKEN not in text
    assert "→ bash" in text

    wire = json.loads(ok(tasuki(directory, "", "context", "request", uuid, "4", "--wire")))
    assert wire == step.wire == [e["body"] for e in log if e["kind"] == "agent"][3]
    recorded = json.loads(ok(tasuki(directory, "", "context", "request", uuid, "4", "--json")))
    assert recorded == step.to_json()
    summary = json.loads(
        ok(tasuki(directory, "", "context", "request", uuid, str(summary_step(directory)), "--summary", "--json"))
    )
    assert summary["kind"] == "summary"
    assert summary["messages"][0]["content"].startswith("You summarize")


def summary_step(directory: Path) -> int:
    return next(r.step for r in recorded_requests(directory) if r.kind == "summary")


def test_send_asks_another_profiles_model_and_changes_nothing(
    finished_task: tuple[Path, list[dict[str, Any]]],
) -> None:
    directory, _ = finished_task
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with model_server(other_model_turns(10)) as other:
        text = ok(
            tasuki(
                directory, profiles(other.openai_base_url), "context", "request", directory.name, "5", "--send", "other"
            )
        )
        answered = json.loads(
            ok(
                tasuki(
                    directory,
                    profiles(other.openai_base_url),
                    "context",
                    "request",
                    directory.name,
                    "5",
                    "--send",
                    "other",
                    "--json",
                )
            )
        )
        sent = [e["body"] for e in other.requests]
    assert text.startswith("answer of profile other (other-model):")
    assert "The other model would list the files at turn 4." in text  # the step's history named turns 0-3
    assert 'tool call bash {"command": "ls"}' in text
    assert "prompt tokens" in text
    assert "completion tokens" in text
    assert answered["answer"]["tool_calls"][0]["name"] == "bash"
    assert answered["request"]["step"] == 5
    recorded = request_of_step(directory, 5)
    assert sent[0]["model"] == "other-model"
    assert sent[0]["messages"] == recorded.wire["messages"]  # type: ignore[index]
    assert sent[0]["tools"] == recorded.tools
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["00000000-0000-4000-8000-000000000000", "1"], 1, "no context 00000000-0000-4000-8000-000000000000"),
        (["{uuid}", "99"], 1, "step 99 is out of range: context {uuid} recorded requests of steps 1-7"),
        (["{uuid}", "0"], 2, "steps count from 1"),
        (["{uuid}", "2", "--send", "nonesuch"], 2, "unknown profile 'nonesuch': expected one of other, gone, openai"),
        (
            ["{uuid}", "2", "--send", "gone"],
            2,
            "profile 'gone' (openai nobody at http://127.0.0.1:9/v1) did not answer",
        ),
    ],
)
def test_errors_are_one_line(
    finished_task: tuple[Path, list[dict[str, Any]]], args: list[str], code: int, says: str
) -> None:
    directory, _ = finished_task
    uuid = directory.name
    result = tasuki(
        directory, profiles("http://127.0.0.1:9/v1"), "context", "request", *[a.format(uuid=uuid) for a in args]
    )
    assert says.format(uuid=uuid) in one_line_error(result, code)


@pytest.mark.integration
def test_a_real_worker_records_summaries_made_on_the_compression_queue(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    from tests.helpers.stack import local_request
    from tests.helpers.worker_scenarios import running_stack, worker_logs

    env = {"TASUKI__COMPRESSION__MIN_MESSAGES": "6", "TASUKI__COMPRESSION__KEEP_RECENT": "3"}
    entries = [bash_turn(n) for n in range(16)] + [finish_turn()]
    with running_stack(tmp_path, redis_url, entries, context_length=SMALL_WINDOW, env=env) as (stack, server):
        stack.start_worker("w1", concurrency=2)  # the compression job runs in the other slot
        uuid = stack.send(local_request(make_buggy_repo(tmp_path / "repo"), prompt="Print the log blocks."))
        assert stack.wait_finished(uuid, timeout_s=120)["status"] == "completed"
        logs = worker_logs(stack)
        assert re.search(r"Task tasuki\.compress_context\[[^]]+\] succeeded", logs)  # the queue's job, not inline
        assert "no worker took the compression job in time" not in logs
        chats = [entry for entry in server.requests if entry["kind"] in ("agent", "summary")]
    recorded = list(recorded_requests(stack.contexts_dir / "completed" / uuid))
    assert [r.kind for r in recorded] == [entry["kind"] for entry in chats]
    assert [r.wire for r in recorded] == [entry["body"] for entry in chats]
    assert [r.step for r in recorded if r.kind == "agent"] == list(range(1, 18))
    summaries = [r for r in recorded if r.kind == "summary"]
    assert summaries
    assert all(r.messages[0]["content"].startswith("You summarize") for r in summaries)
