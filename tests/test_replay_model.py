"""The replay model: trajectories, the resume-safe turn rule, summaries, scripted faults, both HTTP APIs."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from agent.llm import make_provider
from contexts.tokens import estimate_tokens
from replay import ReplayModel
from replay.http import ReplayHandler, ReplayHTTPServer
from replay.rules import (
    is_summary_request,
    next_turn_index,
    replay_summary,
    turn_marker,
)
from replay.server import main
from replay.trajectory import ScriptedCall, Turn, load_trajectory, turns_from_entries
from tests.helpers.model_server import (
    fetch_requests,
    model_server,
    model_server_process,
    wait_for_request,
    write_trajectory,
)

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in src/calc.py."}
SUMMARIZER_SYSTEM = {"role": "system", "content": "You summarize the work of a coding agent for its successor."}


def bash(command: str) -> dict[str, Any]:
    return {"content": f"Running {command}.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


FOUR_TURNS = [bash("ls"), bash("cat src/calc.py"), bash("pytest -q tests/test_calc.py"), bash("git diff")]


def wait_for(predicate: Any, timeout_s: float = 30.0) -> None:
    """Poll ``predicate`` until it holds (or fail after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def ask(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One OpenAI-style chat completion by hand, to see the raw response."""
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def run_turns(url: str, count: int) -> list[dict[str, Any]]:
    """Drive ``count`` turns like the agent loop does; return the conversation."""
    provider = make_provider("openai", "m", 8192, f"{url}/v1", None, backoff_base_s=0.01)
    messages = [SYSTEM, TASK]
    for _ in range(count):
        reply = provider.chat(messages, None)
        messages.append(reply.to_message())
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"output of {c.name}"} for c in reply.tool_calls]
    return messages


# --- the turn rule -------------------------------------------------------------------------------------


def test_a_fresh_conversation_gets_turn_zero() -> None:
    assert next_turn_index([SYSTEM, TASK]) == 0


def test_the_next_turn_follows_the_latest_marker_or_replayed_call_id() -> None:
    by_marker = [SYSTEM, TASK, {"role": "assistant", "content": f"{turn_marker(4)} hi"}]
    by_call_id: list[dict[str, Any]] = [
        SYSTEM,
        TASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_t6_0", "function": {"name": "x"}}]},
        {"role": "tool", "tool_call_id": "call_t6_0", "content": "ok"},
    ]
    assert next_turn_index(by_marker) == 5
    assert next_turn_index(by_call_id) == 7


def test_markers_quoted_in_tool_output_are_ignored() -> None:
    messages = [SYSTEM, TASK, {"role": "tool", "tool_call_id": "x", "content": f"cat log: {turn_marker(99)}"}]
    assert next_turn_index(messages) == 0


def test_a_resent_request_gets_the_same_turn_again() -> None:
    # A worker that crashed before writing its reply re-sends the same conversation when resumed.
    with model_server(FOUR_TURNS) as server:
        conversation = run_turns(server.url, 2)
        first = ask(server.url, conversation)
        again = ask(server.url, conversation)
    assert first["choices"][0]["message"] == again["choices"][0]["message"]
    assert first["choices"][0]["message"]["content"].startswith(turn_marker(2))


def test_a_restarted_server_continues_where_the_conversation_on_disk_ends() -> None:
    with model_server(FOUR_TURNS) as server:
        conversation = run_turns(server.url, 3)
    with model_server(FOUR_TURNS) as fresh:
        answer = ask(fresh.url, conversation)
    assert answer["choices"][0]["message"]["tool_calls"][0]["id"] == "call_t3_0"


def render_span(messages: list[dict[str, Any]]) -> str:
    """A transcript, as a summarizer might render the span it is given."""
    lines = []
    for m in messages:
        calls = " ".join(json.dumps(c["function"]) for c in m.get("tool_calls") or [])
        lines.append(f"{m['role']}: {m.get('content') or ''} {calls}")
    return "\n".join(lines)


def summarize(url: str, previous: str | None, span: list[dict[str, Any]]) -> str:
    provider = make_provider("ollama", "m", 8192, url, None)
    user = f"Previous summary:\n{previous or '(none)'}\n\nMessages:\n{render_span(span)}"
    reply = provider.chat([SUMMARIZER_SYSTEM, {"role": "user", "content": user}], None)
    assert reply.content
    return reply.content


def test_a_conversation_compressed_into_a_summary_continues_with_the_next_turn() -> None:
    with model_server(FOUR_TURNS) as server:
        conversation = run_turns(server.url, 3)  # turns 0, 1, 2, each followed by its tool result
        summary = summarize(server.url, None, conversation[2:6])  # turns 0 and 1 with their results
        compressed = [SYSTEM, TASK, {"role": "user", "content": f"Summary of earlier work:\n{summary}"}]

        with_tail = ask(server.url, compressed + conversation[6:])
        summary_only = ask(server.url, compressed)

    assert summary.startswith(turn_marker(1))
    assert with_tail["choices"][0]["message"]["tool_calls"][0]["id"] == "call_t3_0"
    assert summary_only["choices"][0]["message"]["tool_calls"][0]["id"] == "call_t2_0"


def test_an_incremental_summary_carries_the_previous_marker_forward() -> None:
    previous = f"{turn_marker(5)} Summary of earlier work."
    span = [{"role": "tool", "tool_call_id": "x", "content": "long output " * 50}]
    messages = [SUMMARIZER_SYSTEM, {"role": "user", "content": f"{previous}\n\n{render_span(span)}"}]
    assert replay_summary(messages).startswith(turn_marker(5))


# --- summaries -----------------------------------------------------------------------------------------


def test_summary_requests_are_recognized_by_their_system_prompt() -> None:
    assert is_summary_request([SUMMARIZER_SYSTEM, {"role": "user", "content": "span"}])
    assert is_summary_request([{"role": "system", "content": "  You summarize things."}])
    assert not is_summary_request([SYSTEM, TASK])
    assert not is_summary_request([{"role": "user", "content": "You summarize"}])
    assert not is_summary_request([])


def test_the_summary_lists_files_and_commands_within_35_percent_of_its_input() -> None:
    span = "\n".join(
        [
            'assistant: Running pytest. {"name": "bash", "arguments": {"command": "pytest -q tests/test_calc.py"}}',
            "tool: FAILED tests/test_calc.py::test_add - assert 3 == 4 " + "x" * 400,
            'assistant: {"name": "edit_file", "arguments": {"path": "src/calc.py"}}',
            "$ git diff --stat",
        ]
    )
    summary = replay_summary([SUMMARIZER_SYSTEM, {"role": "user", "content": span}])

    assert "src/calc.py" in summary
    assert "tests/test_calc.py" in summary
    assert "pytest -q tests/test_calc.py" in summary
    assert "git diff --stat" in summary
    assert len(summary) <= 0.35 * len(span)


def test_the_summary_is_never_empty_and_stays_short_for_huge_spans() -> None:
    tiny = replay_summary([SUMMARIZER_SYSTEM, {"role": "user", "content": "ok"}])
    paths = " ".join(f"src/module_{i}.py" for i in range(2000))
    huge = replay_summary([SUMMARIZER_SYSTEM, {"role": "user", "content": paths}])
    assert tiny.strip()
    assert len(huge) <= 0.35 * len(paths)


def test_summary_requests_do_not_advance_the_turn() -> None:
    with model_server(FOUR_TURNS) as server:
        summarize(server.url, None, [TASK])
        conversation = run_turns(server.url, 1)
        records = server.requests
    assert conversation[2]["tool_calls"][0]["id"] == "call_t0_0"
    assert [(r["kind"], r["turn"]) for r in records] == [("summary", None), ("agent", 0)]


# --- trajectories --------------------------------------------------------------------------------------


def test_a_messages_jsonl_of_an_earlier_run_is_a_trajectory(tmp_path: Path) -> None:
    records = [
        {"seq": 1, "role": "system", "content": "You are a coding agent.", "token_count": 6},
        {"seq": 2, "role": "user", "content": "Fix it.", "token_count": 2},
        {
            "seq": 3,
            "role": "assistant",
            "content": f"{turn_marker(0)} Looking around.",  # recorded from a replayed run
            "tool_calls": [
                {"id": "call_t0_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
            "token_count": 20,
        },
        {"seq": 4, "role": "tool", "tool_call_id": "call_t0_0", "tool_name": "bash", "content": "a.py"},
        {
            "seq": 5,
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "ok"}'}}
            ],
        },
    ]
    path = tmp_path / "messages.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"seq": 6, "role": "assis', encoding="utf-8")

    turns = load_trajectory(path)
    gz = tmp_path / "messages.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))

    assert turns == [
        Turn(content="Looking around.", tool_calls=(ScriptedCall("bash", {"command": "ls"}),)),
        Turn(content=None, tool_calls=(ScriptedCall("finish", {"summary": "ok"}),)),
    ]
    assert load_trajectory(gz) == turns


def test_a_yaml_trajectory_reads_like_the_jsonl_one(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(
        "- content: Let me look.\n"
        "  tool_calls:\n"
        "    - name: read_file\n"
        "      arguments: {path: src/calc.py}\n"
        "- fail: 503\n"
        "- tool_calls: [{name: finish, arguments: {summary: done}}]\n",
        encoding="utf-8",
    )
    jsonl = write_trajectory(
        tmp_path / "demo.jsonl",
        [
            {"content": "Let me look.", "tool_calls": [{"name": "read_file", "arguments": {"path": "src/calc.py"}}]},
            {"fail": 503},
            {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]},
        ],
    )
    assert load_trajectory(path) == load_trajectory(jsonl)
    assert load_trajectory(path)[1].faults == (503,)


def test_faults_and_delays_fold_into_the_turn_after_them() -> None:
    turns = turns_from_entries(
        [
            {"fail": 500, "times": 2},
            {"fail": 429},
            {"fail": 503, "for": "summary"},
            {"delay_s": 1.5},
            bash("ls"),
            {"content": "done", "fail": 502},
        ]
    )
    assert turns[0].faults == (500, 500, 429)
    assert turns[0].summary_faults == (503,)
    assert turns[0].delay_s == 1.5
    assert turns[1].faults == (502,)
    assert turns[1].delay_s == 0.0


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([bash("ls"), {"fail": 500}], "no turn after it"),
        ([{"fail": 200}, bash("ls")], "HTTP status 400-599"),
        ([bash("ls"), {"gate": "g"}], "no turn after it"),
        ([{"gate": ""}, bash("ls")], "non-empty name"),
        ([{"gate": "g", "gate_when": "(("}, bash("ls")], "regular expression"),
        ([{"tool_calls": [{"arguments": {}}]}], "needs a 'name'"),
        (["text"], "not an object"),
    ],
)
def test_malformed_trajectories_are_rejected(entries: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        turns_from_entries(entries)


# --- scripted faults and delays ------------------------------------------------------------------------


def test_a_scripted_fault_is_served_once_per_conversation() -> None:
    model = ReplayModel(turns_from_entries([{"fail": 500}, bash("ls")]))
    other_task = {"role": "user", "content": "Another task."}

    assert model.answer([SYSTEM, TASK]).status == 500
    assert model.answer([SYSTEM, TASK]).status == 200
    assert model.answer([SYSTEM, other_task]).status == 500
    assert model.answer([SYSTEM, other_task]).turn == 0


def test_a_delay_holds_only_the_first_answer_of_its_turn() -> None:
    model = ReplayModel([Turn(content="slow", delay_s=300)])
    held: list[int] = []
    first = threading.Thread(target=lambda: held.append(model.answer([SYSTEM, TASK]).status))
    first.start()

    assert model.answer([SYSTEM, TASK]).content == f"{turn_marker(0)} slow"  # not held: would time out
    model.stop()  # releases the held request, as stopping the server does
    first.join(timeout=30)
    assert held == [200]


def test_a_delayed_request_shows_its_turn_while_it_is_held() -> None:
    # What a crash test waits for before killing the worker that is inside the LLM call.
    with model_server([bash("ls"), {"delay_s": 300}, bash("pwd")]) as server:
        conversation = run_turns(server.url, 1)
        caller = threading.Thread(target=lambda: ask(server.url, conversation), daemon=True)
        caller.start()
        held = wait_for_request(lambda: server.requests, lambda r: r["turn"] == 1)
        assert held["status"] is None
        resumed = ask(server.url, conversation)  # a resumed worker asks again and is not held
    caller.join(timeout=30)
    assert resumed["choices"][0]["message"]["tool_calls"][0]["id"] == "call_t1_0"


def test_a_gated_turn_is_held_for_every_caller_until_the_test_opens_its_gate() -> None:
    model = ReplayModel(turns_from_entries([bash("ls"), {"gate": "mid-task"}, bash("pwd"), bash("id")]))
    assert model.answer([SYSTEM, TASK]).turn == 0  # the turns before the gate are not held
    conversation = [SYSTEM, TASK, {"role": "assistant", "content": turn_marker(0)}]
    answers: list[int | None] = []
    callers = [threading.Thread(target=lambda: answers.append(model.answer(conversation).turn)) for _ in range(2)]
    for caller in callers:
        caller.start()
    wait_for(lambda: model.gates().get("mid-task", {}).get("reached") == 2)
    assert model.gates() == {"mid-task": {"reached": 2, "open": False, "released": []}}
    assert answers == []  # both still held: nothing but the test lets them through
    model.open_gate("mid-task")
    for caller in callers:
        caller.join(timeout=30)
    assert answers == [1, 1]
    assert model.answer(conversation).turn == 1  # once open, it stays open


def test_a_gate_with_a_pattern_holds_each_marked_conversation_until_its_own_marks_are_released() -> None:
    model = ReplayModel(turns_from_entries([{"gate": "g", "gate_when": r"\(hold \d+\)"}, bash("ls")]))
    assert model.answer([SYSTEM, TASK]).turn == 0  # no mark in it: not held
    marked = [
        [SYSTEM, {"role": "user", "content": "Task 1 (hold 1)."}],
        # Task 2 also quotes task 1 (as a memory would): releasing task 1 must not let it through.
        [SYSTEM, {"role": "user", "content": "Task 2 (hold 2). Earlier: Task 1 (hold 1)."}],
    ]
    answers: dict[int, int | None] = {}
    callers = [
        threading.Thread(target=lambda n=n, m=m: answers.__setitem__(n, model.answer(m).turn))
        for n, m in zip((1, 2), marked, strict=True)
    ]
    for caller in callers:
        caller.start()
    wait_for(lambda: model.gate_reached("g", "Task 1") and model.gate_reached("g", "Task 2"))
    model.open_gate("g", containing="(hold 1)")
    callers[0].join(timeout=30)
    assert answers == {1: 0}  # task 2 is still held
    assert model.answer(marked[0]).turn == 0  # a released conversation passes again (a resumed worker)
    model.open_gate("g", containing="(hold 2)")
    callers[1].join(timeout=30)
    assert answers == {1: 0, 2: 0}


def test_a_gate_opens_over_http_and_the_held_request_is_answered() -> None:
    with model_server([{"gate": "first"}, bash("ls")]) as server:
        caller = threading.Thread(target=lambda: ask(server.url, [SYSTEM, TASK]), daemon=True)
        caller.start()
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == 0)
        listed = httpx.get(f"{server.url}/_gates", timeout=10).json()
        assert listed == {"first": {"reached": 1, "open": False, "released": []}}
        opened = httpx.post(f"{server.url}/_gates/first", timeout=10).json()
        caller.join(timeout=30)
        assert not caller.is_alive()
        held = wait_for_request(lambda: server.requests, lambda r: r["turn"] == 0 and r["status"] == 200)
    assert opened == {"first": {"reached": 1, "open": True, "released": []}}
    assert held["kind"] == "agent"


def test_summary_faults_are_answered_to_summary_requests() -> None:
    model = ReplayModel(turns_from_entries([{"fail": 503, "for": "summary"}, bash("ls")]))
    summary_request = [SUMMARIZER_SYSTEM, {"role": "user", "content": "span"}]

    assert model.answer([SYSTEM, TASK]).status == 200
    assert model.answer(summary_request).status == 503
    assert model.answer(summary_request).kind == "summary"
    assert model.answer(summary_request).status == 200


# --- HTTP ----------------------------------------------------------------------------------------------


def test_requests_are_recorded_with_a_prompt_token_estimate() -> None:
    japanese = {"role": "user", "content": "テストを直してください。"}
    with model_server(FOUR_TURNS) as server:
        ask(server.url, [SYSTEM, japanese])
        records = fetch_requests(server.url)

    assert len(records) == 1
    record = records[0]
    assert (record["method"], record["path"], record["status"], record["turn"]) == (
        "POST",
        "/v1/chat/completions",
        200,
        0,
    )
    assert record["body"]["messages"][1] == japanese
    # Like a real provider, the estimate counts each message's framing (4 tokens) besides its UTF-8 bytes / 4.
    expected = estimate_tokens(SYSTEM["content"]) + 4 + -(-len(japanese["content"].encode()) // 4) + 4
    assert record["prompt_tokens"] == expected


@pytest.mark.parametrize(
    ("path", "key"), [("/v1/models", "data"), ("/api/tags", "models"), ("/api/version", "version")]
)
def test_model_listings_answer_like_the_real_apis(path: str, key: str) -> None:
    with model_server([]) as server:
        response = httpx.get(f"{server.url}{path}", timeout=10)
    assert response.status_code == 200
    assert key in response.json()


def test_ollama_streaming_requests_get_one_final_chunk() -> None:
    with model_server(FOUR_TURNS) as server:
        chunks = list(ollama.Client(host=server.url).chat(model="m", messages=[SYSTEM, TASK], stream=True))
    assert len(chunks) == 1
    assert chunks[0].done
    assert chunks[0].message.tool_calls is not None
    assert chunks[0].message.tool_calls[0].function.arguments == {"command": "ls"}


def test_the_subprocess_server_prints_its_url_serves_and_stops_cleanly(tmp_path: Path) -> None:
    trajectory = write_trajectory(tmp_path / "t.jsonl", FOUR_TURNS)
    with model_server_process(trajectory) as server:
        conversation = run_turns(server.url, 2)
        assert [r["turn"] for r in server.requests()] == [0, 1]
    assert server.process.returncode == 0
    assert conversation[-1]["tool_call_id"] == "call_t1_0"


def test_main_reports_a_missing_trajectory_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--trajectory", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tasuki replay-model:")
    assert err.count("\n") == 1


def test_a_marker_quoted_in_the_pinned_task_does_not_move_a_new_conversation_ahead() -> None:
    # The task message carries memory of an earlier task, whose summary quoted that task's markers.
    task = f"Fix the tests.\n\nMemory of this thread:\n> {turn_marker(7)} Summary of earlier work (replay)."
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": task}]

    assert next_turn_index(messages) == 0
    assert next_turn_index([*messages, {"role": "assistant", "content": f"{turn_marker(0)} Looking."}]) == 1


class CountingSocket(socket.socket):
    """The server's end of a connection, counting the writes it is asked for."""

    writes = 0

    def send(self, data: Any, *args: Any) -> int:
        CountingSocket.writes += 1
        return super().send(data, *args)

    def sendall(self, data: Any, *args: Any) -> None:
        CountingSocket.writes += 1
        super().sendall(data, *args)


def test_an_answer_leaves_in_one_write_so_no_delayed_ack_splits_headers_from_body() -> None:
    model = ReplayModel(turns_from_entries([{"content": "Hi."}]))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client_end = socket.create_connection(listener.getsockname())
        server_end, _ = listener.accept()
    body = json.dumps({"model": "m", "messages": [SYSTEM, TASK]}).encode()
    client_end.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    counting = CountingSocket(fileno=server_end.detach())
    server = ReplayHTTPServer.__new__(ReplayHTTPServer)
    server.replay_model = model
    ReplayHandler(counting, ("127.0.0.1", 0), server)
    counting.close()
    response = client_end.makefile("rb").read()
    client_end.close()

    assert response.startswith(b"HTTP/1.1 200")
    assert b"Hi." in response
    assert CountingSocket.writes == 1
