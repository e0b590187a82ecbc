"""Failures with real processes: workers killed, redelivered, OOM-killed and stopped mid-task, the monitor and
beat running beside them, real Redis and the scripted model at test timings (heartbeat 1 s, stale 3 s,
monitor 1 s).  Every task ends exactly once, with its history intact."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from contexts.names import TOOLS_FILE
from replay import ReplayServer
from replay.rules import conversation_key
from tests.helpers.beat_process import BeatProcess, children_of
from tests.helpers.celery_worker import WorkerProcess
from tests.helpers.ci import cannot_run
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import Stack, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    agent_requests,
    context_records,
    finish_turn,
    replayed_turn,
    running_stack,
    tool,
    worker_logs,
)
from worker.forges.reporter import MARKER

pytestmark = pytest.mark.integration

FORGE_TOKEN = "chaos-forge-token-3b7a"
FAILED_LABEL = "coding agent failed"

MONITOR_ENV = {"TASUKI__MONITOR__INTERVAL_S": "1", "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2"}
FINISH_TIMEOUT_S = 120.0
# The tests of a tool call that kills its worker: only possible without the sandbox, where $PPID is the worker.
UNSANDBOXED = {"TASUKI__SANDBOX__BACKEND": "none"}


def sleepy_turns(steps: int, sleep_s: float = 0.4) -> list[dict[str, Any]]:
    """A slow task: ``steps`` bash steps that each take ``sleep_s``, then ``finish``."""
    return [
        {"content": f"Step {n}.", "tool_calls": [tool("bash", command=f"sleep {sleep_s}; echo step {n}")]}
        for n in range(steps)
    ] + [finish_turn()]


def gated(entries: list[dict[str, Any]], gates: dict[int, str]) -> list[dict[str, Any]]:
    """``entries`` with turn N held at gate ``gates[N]`` until the test opens it: the test, not the machine's
    speed, decides that a kill or a stop lands mid-task."""
    return [{**entry, "gate": gates[n]} if n in gates else entry for n, entry in enumerate(entries)]


@contextmanager
def chaos_stack(tmp_path: Path, redis_url: str, entries: list[dict[str, Any]], *, beat: bool = True,
                **env: str) -> Iterator[tuple[Stack, ReplayServer]]:
    """A stack with the monitor's test timings, a maintenance worker and (unless ``beat=False``) a beat."""
    with running_stack(tmp_path, redis_url, entries, env={**MONITOR_ENV, **env}) as (stack, server):
        beats = []
        if beat:
            stack.start_worker("maint", queues="maintenance,compression", pool="solo")
            beats.append(BeatProcess("beat", stack.env(), tmp_path).start())
        try:
            yield stack, server
        finally:
            for process in beats:
                process.stop()


def send_tasks(stack: Stack, root: Path, count: int) -> list[str]:
    """``count`` tasks, each on its own repository and with its own prompt (so its own conversation)."""
    return [
        stack.send(local_request(make_buggy_repo(root / f"repo{n}"), prompt=f"Task {n}: fix calc.", task_id=str(n)))
        for n in range(count)
    ]


def running_state(stack: Stack, uuid: str) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((stack.contexts_dir / "running" / uuid / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state


def holder_pid(state: dict[str, Any] | None) -> int:
    return int(str((state or {}).get("worker") or ":0").rsplit(":", 1)[1])


def mid_task_on(stack: Stack, uuids: list[str], worker: WorkerProcess, min_steps: int = 1) -> list[str]:
    """The tasks a pool child of ``worker`` holds that have made ``min_steps`` LLM calls and are not done."""
    kids = children_of(worker.pid) | {worker.pid}
    found = []
    for uuid in uuids:
        state = running_state(stack, uuid)
        busy = state and state["status"] == "processing" and state["llm_call_count"] >= min_steps
        if busy and holder_pid(state) in kids:
            found.append(uuid)
    return found


def assert_one_history(stack: Stack, server: ReplayServer, uuid: str, turns: int) -> dict[str, Any]:
    """Finished exactly once, nothing lost or doubled: seq continuous, every turn's reply written once, at most
    one LLM call repeated (the one a crash cut off before its reply was on disk); returns the final state."""
    directory = stack.contexts_dir / "completed" / uuid
    assert not (stack.contexts_dir / "running" / uuid).exists()
    state: dict[str, Any] = json.loads((directory / "state.json").read_text())
    messages = context_records(directory, "messages.jsonl")
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    assert [replayed_turn(m) for m in messages if m["role"] == "assistant"] == list(range(turns))
    answered = Counter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    assert set(answered.values()) == {1}, answered
    tools = context_records(directory, "tools.jsonl")
    assert [t["seq"] for t in tools] == list(range(1, len(tools) + 1))
    key = conversation_key(messages[:2])
    requests = agent_requests(server.requests)
    asked = Counter(r["turn"] for r in requests if conversation_key(r["body"]["messages"]) == key)
    repeats = sum(n - 1 for n in asked.values())
    assert repeats <= state["attempt"] - 1, asked
    return state


# -- the worker dies -----------------------------------------------------------------------------------


def test_killed_worker_tasks_resume_elsewhere_and_every_task_completes_once(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = gated(sleepy_turns(6), {2: "w1-killed"})  # every task waits at turn 2 until w1 is dead
    with chaos_stack(tmp_path, redis_url, entries) as (stack, server):
        w1 = stack.start_worker("w1", queues="tasks", concurrency=2)
        stack.start_worker("w2", queues="tasks", concurrency=2)
        uuids = send_tasks(stack, tmp_path, 5)
        # Both of w1's slots busy mid-task: nothing it fetched is left unstarted when it dies.
        victims = stack.wait_until(lambda: (v := mid_task_on(stack, uuids, w1, min_steps=2)) and len(v) == 2 and v,
                                   what="w1 busy")
        w1.kill()
        server.model.open_gate("w1-killed")
        states = {uuid: assert_one_history(stack, server, uuid, len(entries))
                  for uuid in uuids if stack.wait_finished(uuid, FINISH_TIMEOUT_S)}
    assert {uuid: s["status"] for uuid, s in states.items()} == dict.fromkeys(uuids, "completed")
    assert {uuid: s["attempt"] for uuid, s in states.items()} == {u: 2 if u in victims else 1 for u in uuids}
    assert "lock taken over" not in worker_logs(stack)  # never two holders: nobody was ever fenced


def test_task_whose_worker_is_killed_max_attempts_times_fails_and_its_issue_says_so(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    """The monitor, not a worker, ends this task: the issue still gets its failed label and the reason."""
    with FakeForge(tmp_path / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo("team", "calc", make_buggy_repo(tmp_path / "source"))
        forge.add_item("team", "calc", 7, "add() subtracts")
        forge_env = {"TASUKI__GITHUB__API_URL": forge.github_api_url, "GITHUB_TOKEN": FORGE_TOKEN}
        # Attempt N is killed while it waits at turn 2N: each attempt gets further than the last.
        entries = gated(sleepy_turns(10, sleep_s=0.2), {2: "attempt-1", 4: "attempt-2", 6: "attempt-3"})
        with chaos_stack(tmp_path, redis_url, entries, **forge_env) as (stack, server):
            uuid = stack.send({"task_key": {"task_source": "github", "owner": "team", "repo": "calc",
                                            "task_type": "issue", "task_id": "7"}, "user": "octocat"})
            worker = stack.start_worker("w1", queues="tasks")
            for attempt in (1, 2, 3):

                def held(worker: WorkerProcess = worker, attempt: int = attempt) -> bool:
                    state = running_state(stack, uuid)
                    return bool(server.model.gate_reached(f"attempt-{attempt}") and state
                                and state["attempt"] == attempt and mid_task_on(stack, [uuid], worker))

                stack.wait_until(held, what=f"attempt {attempt} running")
                # The next worker is up before this one dies: the monitor gives up on re-enqueued deliveries no
                # worker takes (monitor.max_attempts of them), and a slow start must not look like that.
                following = stack.start_worker(f"w{attempt + 1}", queues="tasks") if attempt < 3 else None
                worker.kill()
                server.model.open_gate(f"attempt-{attempt}")
                worker = following or worker
            state = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
            issue = forge.item("team", "calc", 7)
            stack.wait_until(lambda: issue.labels == [FAILED_LABEL], what="the issue's failed label")
    assert state["status"] == "failed"
    assert state["error"].startswith("worker lost: heartbeat stale since ")
    assert state["attempt"] == 3
    assert not (stack.contexts_dir / "running" / uuid).exists()
    progress = [c.body for c in issue.comments if MARKER.format(uuid=uuid) in c.body]
    assert len(progress) == 1  # the one progress comment, edited in place to its final state
    assert "worker lost: heartbeat stale since" in progress[0]
    assert "failed" in progress[0]


# -- Celery redelivers ---------------------------------------------------------------------------------


def redeliver(redis_url: str, uuid: str) -> int:
    """What Redis does once a message's visibility timeout passes: put the unacknowledged message of task
    ``uuid`` back on its queue while the worker still runs it (only that message: the database is shared)."""
    restored = 0
    with Connection(redis_url) as connection:
        channel: Any = connection.default_channel
        for tag, raw in channel.client.hgetall(channel.qos.unacked_key).items():
            if json.loads(raw)[0]["headers"].get("id") == uuid:
                channel.qos.restore_by_tag(tag, channel.client)
                restored += 1
    return restored


def test_redelivery_while_the_task_runs_is_dropped_and_the_task_runs_once(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = gated(sleepy_turns(8), {2: "redelivered"})  # the task waits at turn 2 until the redelivery is seen
    with chaos_stack(tmp_path, redis_url, entries, beat=False) as (stack, server):
        worker = stack.start_worker("w1", queues="tasks", concurrency=2)  # a free slot takes the redelivery
        [uuid] = send_tasks(stack, tmp_path, 1)
        stack.wait_until(lambda: server.model.gate_reached("redelivered"), what="the task running")
        assert redeliver(redis_url, uuid) == 1
        stack.wait_until(lambda: "delivery dropped: context held by a live worker" in worker.log_text(),
                         what="the redelivery dropped")
        server.model.open_gate("redelivered")
        state = assert_one_history(stack, server, uuid, len(entries)) if stack.wait_finished(uuid) else {}
    assert (state["status"], state["attempt"]) == ("completed", 1)
    asked = Counter(r["turn"] for r in agent_requests(server.requests))
    assert set(asked.values()) == {1}  # every LLM call exactly once


# -- a pool child is killed (the OOM case) ---------------------------------------------------------------


def test_killed_pool_child_is_requeued_and_the_requeue_resumes_the_task(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = gated(sleepy_turns(8), {2: "child-killed"})  # the task waits at turn 2 until its process is killed
    with chaos_stack(tmp_path, redis_url, entries, beat=False) as (stack, server):  # no monitor: Celery alone
        worker = stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        stack.wait_until(lambda: server.model.gate_reached("child-killed"), what="the task running")
        assert mid_task_on(stack, [uuid], worker, min_steps=2)
        child = holder_pid(running_state(stack, uuid))
        assert child in children_of(worker.pid)
        os.kill(child, signal.SIGKILL)
        server.model.open_gate("child-killed")
        state = assert_one_history(stack, server, uuid, len(entries)) if stack.wait_finished(uuid) else {}
        assert worker.process is not None
        assert worker.process.poll() is None  # the worker itself lived on
    assert (state["status"], state["attempt"]) == ("completed", 2)


def test_a_tool_call_that_killed_its_worker_is_not_run_again_and_the_task_goes_on(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = [{"content": "Use all the memory.", "tool_calls": [tool("bash", command="kill -9 $PPID")]}, finish_turn()]
    with chaos_stack(tmp_path, redis_url, entries, beat=False, **UNSANDBOXED) as (stack, _server):
        stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        state = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
        tools = context_records(stack.contexts_dir / "completed" / uuid, TOOLS_FILE)
    assert (state["status"], state["attempt"]) == ("completed", 2)
    assert [(t["tool_name"], t["status"]) for t in tools] == [("bash", "error"), ("finish", "success")]
    assert tools[0]["error"].startswith("not run: the worker running attempt 1 stopped")


def test_task_that_kills_its_pool_child_at_every_step_stops_at_max_attempts(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    kill = {"content": "Use all the memory.", "tool_calls": [tool("bash", command="kill -9 $PPID")]}
    with chaos_stack(tmp_path, redis_url, [kill, kill, kill, finish_turn()], beat=False, **UNSANDBOXED) as (
        stack,
        server,
    ):
        stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        state = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
        asked = Counter(r["turn"] for r in agent_requests(server.requests))
    assert state["status"] == "failed"
    assert state["error"] == "gave up after 3 attempts"
    assert state["tool_call_count"] == 2  # attempts 2 and 3 each answered the call that killed the one before
    assert asked == {0: 1, 1: 1, 2: 1}  # each deadly call was asked for, and run, once


def test_in_the_sandbox_a_tool_call_cannot_kill_its_worker(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = [{"content": "Kill my parent.", "tool_calls": [tool("bash", command="kill -9 $PPID; echo still here")]},
               finish_turn()]
    with chaos_stack(tmp_path, redis_url, entries, beat=False) as (stack, _server):
        if stack.env().get("TASUKI__SANDBOX__BACKEND") == "none" or shutil.which("bwrap") is None:
            cannot_run("bubblewrap is not installed")
        stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        state = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
    assert (state["status"], state["attempt"]) == ("completed", 1)  # $PPID is the sandbox's init, not the worker


# -- a worker is stopped (rolling restart) -------------------------------------------------------------


def test_sigterm_hands_the_task_back_at_the_next_step_and_another_worker_resumes_it(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    # Turn 3 is held until w1 has been told to stop, so the SIGTERM lands mid-task however slow the machine
    # is (a loaded machine once let the whole task finish on w1 before the test got to send it).
    entries = gated(sleepy_turns(10), {3: "w1-stopping"})
    with chaos_stack(tmp_path, redis_url, entries, beat=False) as (stack, server):
        first = stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        stack.wait_until(lambda: server.model.gate_reached("w1-stopping"), what="turn 3 asked for (on w1)")
        assert mid_task_on(stack, [uuid], first, min_steps=3)
        second = stack.start_worker("w2", queues="tasks")
        first.ask_to_stop()
        stack.wait_until(lambda: "worker shutting down" in first.log_text(), what="w1's warm shutdown begun")
        server.model.open_gate("w1-stopping")
        assert first.wait(timeout_s=60) == 0  # warm shutdown, well within the grace period
        assert "task handed back on shutdown" in first.log_text()
        state = assert_one_history(stack, server, uuid, len(entries)) if stack.wait_finished(uuid) else {}
        assert holder_pid(state) in children_of(second.pid)  # resumed by w2's pool
    assert (state["status"], state["attempt"]) == ("completed", 2)


def test_a_task_handed_back_by_more_rolling_restarts_than_max_attempts_still_completes(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    """Found by the compose test: `docker compose stop` of three workers bounced a task from one stopping
    worker to the next until its attempts ran out, and it failed. A hand-back is not a lost attempt."""
    # The worker of stop N is told to stop while the task waits at turn 2 + 3N: each stop lands mid-task.
    entries = gated(sleepy_turns(12), {2: "stop-0", 5: "stop-1", 8: "stop-2"})
    with chaos_stack(tmp_path, redis_url, entries, beat=False, TASUKI__MONITOR__MAX_ATTEMPTS="2") as (stack, server):
        [uuid] = send_tasks(stack, tmp_path, 1)
        for n in range(3):  # three warm shutdowns mid-task, each handing the task back
            worker = stack.start_worker(f"w{n}", queues="tasks")

            def held(worker: WorkerProcess = worker, n: int = n) -> bool:
                return server.model.gate_reached(f"stop-{n}") and bool(mid_task_on(stack, [uuid], worker))

            stack.wait_until(held, what=f"the task running on w{n}")
            worker.ask_to_stop()
            stack.wait_until(lambda worker=worker: "worker shutting down" in worker.log_text(),
                             what=f"w{n}'s warm shutdown begun")
            server.model.open_gate(f"stop-{n}")
            assert worker.wait(timeout_s=30) == 0
        stack.start_worker("last", queues="tasks")
        state = assert_one_history(stack, server, uuid, len(entries)) if stack.wait_finished(uuid) else {}
    assert (state["status"], state["attempt"], state["handbacks"]) == ("completed", 4, 3)
