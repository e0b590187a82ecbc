"""The agent loop in-process: a real context store and git checkout in tmp_path, the replay model over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent import loop as agent_module
from agent.llm import make_provider
from agent.loop import Agent, AgentLimits, Cancelled, Finished, Repeating, StepLimit
from agent.prompts import NUDGE, SYSTEM_PROMPT, task_message
from contexts import Context, ContextStore
from contexts import context as context_module
from contexts.clock import utc_now
from contexts.compression import CompressionPolicy
from contexts.names import MESSAGES_FILE, TOOLS_FILE
from replay import ReplayServer
from tests.helpers.model_server import model_server
from tests.helpers.stack import git, make_buggy_repo
from tests.helpers.worker_scenarios import agent_requests, context_records, finish_turn, replayed_turn, tool
from worker import checkout as checkout_module
from worker.checkout import Checkout
from worker.inbox import Inbox
from worker.run import ReportingAgent
from worker.stops import stop_of

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}
CONTEXT_LENGTH = 32768
STALE_AFTER_S = 60


class Workbench:
    """One task's pieces: store, held context, checkout, model; ``agent()`` builds a loop over them."""

    def __init__(self, root: Path, server: ReplayServer) -> None:
        self.root = root
        self.server = server
        self.store = ContextStore(root / "contexts", stale_after_s=STALE_AFTER_S)
        self.ctx = self.store.create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
        self.ctx.append_message("system", SYSTEM_PROMPT)
        self.ctx.append_message("user", task_message("Do the thing."))
        self.ctx.step_done()
        repo = make_buggy_repo(root / "repo")
        self.checkout = Checkout(root / "workspace", str(repo), "tasuki/1-unit")
        self.checkout.prepare()

    def agent(self, *, max_steps: int = 20, tool_output_max_chars: int = 20000) -> Agent:
        return Agent(*self.agent_parts(max_steps=max_steps, tool_output_max_chars=tool_output_max_chars))

    def agent_parts(self, *, max_steps: int = 20, tool_output_max_chars: int = 20000) -> tuple[Any, ...]:
        """The positional arguments of an :class:`Agent` over this bench."""
        provider = make_provider("openai", "scripted", CONTEXT_LENGTH, self.server.openai_base_url, None, max_retries=0)
        limits = AgentLimits(max_steps, CONTEXT_LENGTH, tool_output_max_chars, bash_timeout_s=30)
        return self.ctx, provider, self.checkout, limits, CompressionPolicy()

    def resume_elsewhere(self) -> None:
        """Leave the context as a crashed worker would; another host takes it over once it is stale."""
        self.ctx.detach()
        later = utc_now() + timedelta(seconds=STALE_AFTER_S + 1)
        store = ContextStore(
            self.store.base_dir, stale_after_s=STALE_AFTER_S, hostname="other-host", clock=lambda: later
        )
        self.ctx = store.open(self.ctx.uuid, heartbeat=False)

    def messages(self) -> list[dict[str, Any]]:
        return context_records(self.ctx.path, MESSAGES_FILE)

    def tools(self) -> list[dict[str, Any]]:
        return context_records(self.ctx.path, TOOLS_FILE)

    def asked(self) -> list[int]:
        return [r["turn"] for r in agent_requests(self.server.requests)]


@pytest.fixture
def workbench(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workbench]:
    with model_server(request.param) as server:
        b = Workbench(tmp_path, server)
        yield b
        if not b.ctx.closed:
            b.ctx.detach()


def turns(*entries: dict[str, Any]) -> pytest.MarkDecorator:
    """Parametrize the ``workbench`` fixture with a trajectory."""
    return pytest.mark.parametrize("workbench", [list(entries)], indirect=True)


def _crash(*_: Any, **__: Any) -> Any:
    raise RuntimeError("the worker died while the tool ran")


@turns(
    {"content": "Write it.", "tool_calls": [tool("write_file", path="a.txt", content="A\n")]},
    finish_turn("Wrote a.txt."),
)
def test_the_reply_is_on_disk_before_its_tool_calls_run(workbench: Workbench, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "run_tool", _crash)

    with pytest.raises(RuntimeError, match="worker died"):
        workbench.agent().step()

    last = workbench.messages()[-1]
    assert last["role"] == "assistant"
    assert replayed_turn(last) == 0
    assert [c["function"]["name"] for c in last["tool_calls"]] == ["write_file"]
    assert workbench.tools() == []
    workbench.resume_elsewhere()  # the step's state write never happened: the resume counts the reply on disk
    assert workbench.ctx.read_state()["llm_call_count"] == 1


@turns(
    {"content": "Log it.", "tool_calls": [tool("bash", command="echo step >> side.log")]},
    finish_turn("Logged."),
)
def test_a_resumed_agent_never_runs_an_interrupted_call_twice_and_tells_the_model(
    workbench: Workbench, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_then_die(*args: Any, **kwargs: Any) -> Any:
        agent_module_run_tool(*args, **kwargs)  # the side effect happens ...
        raise RuntimeError("the worker died right after the tool ran")  # ... but its result is never written

    agent_module_run_tool = agent_module.run_tool
    with monkeypatch.context() as patch:
        patch.setattr(agent_module, "run_tool", run_then_die)
        with pytest.raises(RuntimeError):
            workbench.agent().step()
    assert (workbench.checkout.path / "side.log").read_text() == "step\n"
    call_id = workbench.messages()[-1]["tool_calls"][0]["id"]
    workbench.resume_elsewhere()
    agent = workbench.agent()

    agent.step()

    assert workbench.asked() == [0]  # answered without a model call
    answer = workbench.messages()[-1]
    assert (answer["role"], answer["tool_call_id"]) == ("tool", call_id)
    assert answer["content"].startswith("error: not run: the worker running attempt 1 stopped")
    assert workbench.tools()[-1]["status"] == "error"
    assert not (workbench.checkout.path / "side.log").exists()  # back at the last checkpoint, not run twice
    assert agent.run() == "Logged."
    assert workbench.asked() == [0, 1]


@turns(
    {"content": "Read it.", "tool_calls": [tool("read_file", path="calc.py")]},
    finish_turn("Read calc.py."),
)
def test_a_resumed_agent_runs_pending_read_only_calls_without_asking_the_model_again(
    workbench: Workbench, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(agent_module, "run_tool", _crash)
        with pytest.raises(RuntimeError):
            workbench.agent().step()
    workbench.resume_elsewhere()
    agent = workbench.agent()

    assert [c.name for c in agent.unanswered() or []] == ["read_file"]
    agent.step()
    assert workbench.asked() == [0]
    assert workbench.tools()[-1]["status"] == "success"
    assert agent.run() == "Read calc.py."


@turns(finish_turn("All done."))
def test_a_finish_already_answered_ends_the_task_without_an_llm_call(workbench: Workbench) -> None:
    assert workbench.agent().run() == "All done."
    workbench.resume_elsewhere()
    agent = workbench.agent()

    with pytest.raises(Finished):
        agent.unanswered()
    assert agent.run() == "All done."
    assert workbench.asked() == [0]


@turns(*[{"content": None, "tool_calls": [tool("bash", command=f"echo {n}")]} for n in range(5)])
def test_a_task_that_never_finishes_stops_at_the_step_limit(workbench: Workbench) -> None:
    with pytest.raises(StepLimit, match="step limit of 3"):
        workbench.agent(max_steps=3).run()

    assert workbench.asked() == [0, 1, 2]
    assert workbench.ctx.read_state()["llm_call_count"] == 3
    assert len(workbench.tools()) == 3


@turns({"content": None, "tool_calls": [tool("bash", command="seq 1 2000")]}, finish_turn())
def test_a_long_tool_output_is_cut_for_the_prompt_and_points_to_the_full_record(workbench: Workbench) -> None:
    workbench.agent(tool_output_max_chars=300).run()

    full = workbench.tools()[0]
    assert full["result"].startswith("1\n2\n3\n")
    assert full["result"].endswith("\n2000\nexit code: 0")
    cut = next(m for m in workbench.messages() if m["role"] == "tool")
    assert cut["truncated_from"] == len(full["result"])
    assert cut["content"].startswith("1\n2\n3\n")
    assert cut["content"].endswith(f"exit code: 0\n[full output: tools.jsonl seq {full['seq']}]")
    assert "characters omitted" in cut["content"]
    assert len(cut["content"]) < 500
    sent = agent_requests(workbench.server.requests)[1]["body"]["messages"]
    assert [m["content"] for m in sent if m["role"] == "tool"] == [cut["content"]]  # the model saw the cut copy


@turns({"content": "Let me think about it."}, finish_turn("Thought."))
def test_a_reply_without_tool_calls_is_answered_with_a_nudge(workbench: Workbench) -> None:
    assert workbench.agent().run() == "Thought."

    roles = [(m["role"], m["content"] if m["role"] == "user" else None) for m in workbench.messages()[2:]]
    assert roles == [("assistant", None), ("user", NUDGE), ("assistant", None), ("tool", None)]


@turns({"content": "Let me think about it."}, finish_turn("Thought."))
def test_a_nudge_lost_in_a_crash_is_written_on_resume_without_an_llm_call(workbench: Workbench) -> None:
    workbench.ctx.append_message("assistant", "[tasuki-replay turn=0] Let me think about it.")  # then the crash
    agent = workbench.agent()

    assert agent.unanswered() == []
    assert workbench.messages()[-1]["content"] == NUDGE
    assert workbench.asked() == []
    assert agent.run() == "Thought."
    assert workbench.asked() == [1]


@turns(finish_turn())
def test_a_cancel_request_stops_the_loop_before_the_next_model_call(workbench: Workbench) -> None:
    workbench.ctx.update_state(cancel_requested=True)

    with pytest.raises(Cancelled):
        workbench.agent().run()
    assert workbench.asked() == []


@turns(finish_turn("Done."))
def test_a_command_left_running_by_a_dead_attempt_is_killed_before_the_resume_goes_on(workbench: Workbench) -> None:
    """Without a sandbox a command outlives its killed worker (its own session): the next attempt on the same
    host stops it first, and only when its leader is provably that command (same start time)."""
    leftover = subprocess.Popen(["sleep", "600"], start_new_session=True)
    unrelated = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        workbench.agent()._command_started(leftover.pid)  # what the dead attempt recorded
        workbench.resume_elsewhere()
        agent = workbench.agent()

        agent.stop_leftover_command()

        assert leftover.wait(timeout=10) == -signal.SIGKILL
        recorded = workbench.ctx.read_state()["running_command"]
        stale = {**recorded, "pgid": unrelated.pid, "started": recorded["started"] - 1}
        workbench.ctx.update_state(running_command=stale)  # a pid reused by another process: left alone
        agent.stop_leftover_command()
        assert unrelated.poll() is None
    finally:
        for process in (leftover, unrelated):
            process.kill()
            process.wait()


@turns(
    {"content": "Done?", "tool_calls": [tool("finish", summary="   ")]},
    {"content": "Forgot it.", "tool_calls": [tool("finish")]},
    finish_turn("Fixed add()."),
)
def test_a_blank_or_missing_finish_summary_goes_back_to_the_model_as_the_tool_s_error(workbench: Workbench) -> None:
    assert workbench.agent().run() == "Fixed add()."

    assert workbench.asked() == [0, 1, 2]
    finishes = [t for t in workbench.tools() if t["tool_name"] == "finish"]
    assert [t["status"] for t in finishes] == ["error", "error", "success"]
    assert "summary is empty" in finishes[0]["error"]
    assert "missing required argument(s) summary" in finishes[1]["error"]


@turns(
    {"content": "Done?", "tool_calls": [tool("finish", summary="")]},
    finish_turn("Fixed add()."),
)
def test_a_resumed_agent_does_not_end_on_a_finish_that_was_refused(workbench: Workbench) -> None:
    agent = workbench.agent()
    agent.step()  # the blank finish is answered with an error; the task goes on
    workbench.resume_elsewhere()
    agent = workbench.agent()

    assert agent.unanswered() is None  # ask the model again, rather than end with an empty summary
    assert agent.run() == "Fixed add()."


CRASH_TURNS = [
    {"content": "Write a.", "tool_calls": [tool("write_file", path="a.txt", content="A\n")]},
    {"content": "Write b.", "tool_calls": [tool("bash", command="echo B > b.txt")]},
    finish_turn("Wrote a and b."),
    finish_turn("Told that steps were lost, finishing anyway."),
]


def kill_at_point(point: int) -> None:
    """In this (forked) process: SIGKILL just before the ``point``-th thing a step does on disk — a record
    appended, state.json written, a git process (a checkpoint's add, commit, push; the final commit and push)."""
    seen = [0]

    def before(function: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen[0] += 1
            if seen[0] == point:  # the machine dies: the worker and any git it runs (a push in the background)
                os.killpg(0, signal.SIGKILL)
            return function(*args, **kwargs)
        return wrapped

    Context.append_message = before(Context.append_message)  # type: ignore[method-assign]
    Context.append_tool = before(Context.append_tool)  # type: ignore[method-assign]
    context_module.update_state = before(context_module.update_state)
    checkout_module.run_git = before(checkout_module.run_git)


def run_task_to_the_end(bench: Workbench, checkout: Checkout) -> None:
    bench.checkout = checkout
    summary = bench.agent().run()
    checkout.commit(summary)
    checkout.push()
    bench.ctx.update_state()  # as the worker's finish does: the finishing step's state was left staged for it


def crashed_at(bench: Workbench, point: int) -> bool:
    """Run the task in a child killed at ``point``; False when the task ended before reaching it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setpgid(0, 0)
            kill_at_point(point)
            run_task_to_the_end(bench, bench.checkout)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, status
    return os.WIFSIGNALED(status)


@turns(finish_turn("Fixed add()."), finish_turn("Fixed add() and documented it."))
def test_a_comment_arriving_while_the_model_decides_to_finish_is_answered_before_the_task_ends(
    workbench: Workbench,
) -> None:
    said: list[dict[str, Any]] = []  # the task's inbox: the comment comes in during the finishing model call
    read = lambda: (said[:], len(said)) if workbench.asked() else ([], 0)  # noqa: E731
    said.append({"id": "c1", "author": "alice", "body": "Please document it too."})
    agent = ReportingAgent(
        *workbench.agent_parts(), after_step=lambda: None,
        inbox=Inbox(read, lambda count: said.__delitem__(slice(0, count)), lambda entry: entry),
    )

    assert agent.run() == "Fixed add() and documented it."

    assert workbench.asked() == [0, 1]
    roles = [(m["role"], m.get("inbox_id")) for m in workbench.messages()[-5:]]
    assert roles == [("assistant", None), ("tool", None), ("user", "c1"), ("assistant", None), ("tool", None)]
    assert said == []  # taken from the inbox once the context held it


@turns(finish_turn("Fixed add()."), finish_turn("Never asked."))
def test_a_finish_with_no_new_comment_ends_the_task(workbench: Workbench) -> None:
    agent = ReportingAgent(*workbench.agent_parts(), after_step=lambda: None,
                           inbox=Inbox(lambda: ([], 0), lambda count: None, lambda entry: entry))

    assert agent.run() == "Fixed add()."
    assert workbench.asked() == [0]


def test_a_worker_killed_at_any_point_of_a_step_resumes_with_nothing_repeated_and_nothing_silently_lost(
    tmp_path: Path,
) -> None:
    with model_server(CRASH_TURNS) as server:
        for point in range(1, 200):
            # Resumed on this host (its own tree, an unpushed checkpoint still in it) or on another one (only
            # what reached the remote), in turn: each git step is a point, so both meet every kind of point.
            host = "same" if point % 2 else "another"
            bench = Workbench(tmp_path / str(point), server)
            if not crashed_at(bench, point):
                break  # every point before this one was a crash
            # The remote is another machine, which lives on: a push killed mid-way leaves no ref locked there.
            for lock in (tmp_path / str(point) / "repo" / ".git").rglob("*.lock"):
                lock.unlink()
            on_disk = {replayed_turn(m) for m in bench.messages() if m["role"] == "assistant"}
            asked_before = len(bench.asked())
            bench.resume_elsewhere()
            where = bench.checkout.path if host == "same" else tmp_path / str(point) / "host2"
            resumed = Checkout(where, bench.checkout.remote, bench.checkout.branch)
            resumed.prepare(fresh=False)
            run_task_to_the_end(bench, resumed)

            messages = bench.messages()
            notes = " ".join(m["content"] for m in messages if m["role"] == "user" and "note: " in m["content"])
            assistant = [replayed_turn(m) for m in messages if m["role"] == "assistant"]
            assert assistant in ([0, 1, 2], [0, 1, 2, 3] if notes else None), point  # every reply once
            assert not on_disk & set(bench.asked()[asked_before:]), point  # none asked again
            state = bench.ctx.read_state()
            assert state["llm_call_count"] == len(assistant), point
            assert state["tool_call_count"] == sum(m["role"] == "tool" for m in messages), point
            spent = [m["usage"] for m in messages if m["role"] == "assistant"]  # what each kept reply recorded
            assert state["usage"]["calls"] == len(spent), point
            assert state["total_tokens_used"] == sum(u["prompt_tokens"] + u["completion_tokens"] for u in spent), point
            for step, name in ((1, "a.txt"), (2, "b.txt")):
                call = next(m for m in messages if m["role"] == "assistant" and replayed_turn(m) == step - 1)
                result = next(m for m in messages if m.get("tool_call_id") == call["tool_calls"][0]["id"])
                told_lost = f"step(s) {step}" in notes or f", {step}" in notes
                on_branch = name in git(tmp_path / str(point) / "repo", "ls-tree", "--name-only", bench.checkout.branch)
                ran = not result["content"].startswith("error")
                assert on_branch == (ran and not told_lost), (point, name, result["content"], notes)
            bench.ctx.detach()
        else:
            pytest.fail("the task never ended without a crash")
    assert point > 20  # the crash points really were reached


STATUS = {"content": "Check.", "tool_calls": [tool("bash", command="git status --short")]}


@turns(*[STATUS] * 8, finish_turn())
def test_a_model_caught_in_a_loop_is_told_from_the_third_repeat_and_stopped_at_max_repeats(
    workbench: Workbench,
) -> None:
    # A small model ran `git status` 28 times in a row until its step limit (agent/repeats.py).
    agent = Agent(*workbench.agent_parts())
    with pytest.raises(Repeating, match="same call with the same result 6 times in a row"):
        agent.run()

    results = [m["content"] for m in workbench.messages() if m["role"] == "tool"]
    assert len(results) == 6  # six identical answers, then the task stops: no seventh model call
    assert workbench.asked() == [0, 1, 2, 3, 4, 5]
    told = ["this exact call has now given this exact result" in r for r in results]
    assert told == [False] * 2 + [True] * 3 + [False]  # the sixth ends the task: nothing more to tell
    assert "3 more identical repeats and the task stops" in results[2]
    assert "1 more identical repeat and the task stops" in results[4]
    assert all("[Tasuki:" not in str(record["result"]) for record in workbench.tools())  # told, never recorded
    assert workbench.ctx.read_state()["repeat"]["count"] == 6


@turns(
    *[STATUS] * 4,
    {"content": "Change it.", "tool_calls": [tool("write_file", path="new.txt", content="x\n")]},
    *[STATUS] * 4,
    finish_turn("Done."),
)
def test_another_result_starts_the_count_again_and_a_resume_goes_on_counting(workbench: Workbench) -> None:
    agent = workbench.agent()
    for _ in range(7):  # four repeats, the write, two `git status` that now show new.txt
        agent.step()
    assert workbench.ctx.read_state()["repeat"]["count"] == 2
    workbench.resume_elsewhere()

    assert workbench.agent().run() == "Done."  # counts 3 and 4 after the resume: told, never stopped

    results = [m["content"] for m in workbench.messages() if m["role"] == "tool"]
    told = ["this exact call has now given" in r for r in results]
    assert told == [False, False, True, True, False, False, False, True, True, False]


def test_a_model_caught_in_a_loop_ends_as_a_model_stop_with_a_draft(make_settings: Any) -> None:
    stop = stop_of(Repeating("the model made the same call with the same result 6 times in a row"), make_settings())
    assert stop is not None
    assert (stop.reason, stop.status) == ("model", "failed")
    assert stop.why == ("its model was caught in a loop (the model made the same call with the same result 6 times in "
                        "a row; agent.max_repeats)")
