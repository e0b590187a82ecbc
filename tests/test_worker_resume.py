"""Workers killed mid-task (SIGKILL of the whole process group) and the task resumed by a new worker.

The new delivery is sent the way the monitor sends it: ``tasuki.run_task`` again with the same UUID, once
the dead holder's heartbeat is older than ``stale_after_s`` (same contract for both LLM providers); or
earlier, when the delivery defers itself until then.  Also the crash windows around git: right after the
final push, and between the clone and the task branch.
"""

from __future__ import annotations

import uuid as uuid_module
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore, is_stale
from contexts.clock import utc_now
from contexts.lock import process_alive
from contexts.names import MESSAGES_FILE, TOOLS_FILE
from tests.helpers.model_server import wait_for_request
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    PROVIDERS,
    agent_requests,
    bash_turn,
    context_records,
    finish_turn,
    replayed_turn,
    running_stack,
    tool,
    worker_logs,
)

pytestmark = pytest.mark.integration

CONTEXT_LENGTH = 8192
SLOW_TURN = 4
NOTE = "written before the crash\n"


def crash_trajectory() -> list[dict[str, Any]]:
    """Seven turns; the answer to turn 4 is held long enough for the test to kill the worker waiting on it."""
    return [
        {"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
        bash_turn(1),
        bash_turn(2),
        {"content": None, "tool_calls": [tool("bash", command="cat notes.txt")]},
        {"delay_s": 300},
        bash_turn(SLOW_TURN),
        {"content": "Is the note still there?", "tool_calls": [tool("bash", command="cat notes.txt")]},
        finish_turn("Left a note."),
    ]


def note_and_finish() -> list[dict[str, Any]]:
    """Two turns: write notes.txt, finish."""
    return [crash_trajectory()[0], finish_turn("Left a note.")]


def stale(stack: Stack, uuid: str) -> bool:
    """True once the dead holder's lock may be taken over (heartbeat older than stale_after_s)."""
    store = ContextStore(stack.contexts_dir, stale_after_s=float(stack.env()["TASUKI__CONTEXTS__STALE_AFTER_S"]))
    return not store.is_held(uuid)


def resume_on_another_machine(stack: Stack, uuid: str, request: dict[str, Any]) -> dict[str, Any]:
    """Once the dead holder's lock is stale, send the task again as the monitor does, to a new worker that
    shares the contexts root but not the dead one's checkout (SPEC §12); return the final state."""
    stack.wait_until(lambda: stale(stack, uuid), 30, "the dead holder's lock to go stale")
    stack.env_overrides["TASUKI__CONTEXTS__WORKSPACES_DIR"] = str(stack.root / "workspaces-of-w2")
    stack.start_worker("w2")
    stack.send(request, uuid=uuid)
    return stack.wait_finished(uuid)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_killed_worker_task_resumes_on_a_new_worker_from_the_last_step_on_disk(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, provider: str
) -> None:
    turns = crash_trajectory()
    with running_stack(tmp_path, redis_url, turns, provider=provider, context_length=CONTEXT_LENGTH) as (
        stack,
        server,
    ):
        repo = make_buggy_repo(tmp_path / "repo")
        first = stack.start_worker("w1")
        request = local_request(repo, prompt="Leave a note.")
        uuid = stack.send(request)
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == SLOW_TURN and r["status"] is None, 60)

        first.kill()  # the machine died while the model was thinking about turn 4
        running = stack.contexts_dir / "running" / uuid
        before = context_records(running, MESSAGES_FILE)
        assert [replayed_turn(m) for m in before if m["role"] == "assistant"] == list(range(SLOW_TURN))
        state = resume_on_another_machine(stack, uuid, request)

        assert state["status"] == "completed", state
        assert state["attempt"] == 2
        directory = stack.contexts_dir / "completed" / uuid
        validate_context_dir(directory)  # seq is 1, 2, 3... across the crash in every JSONL file
        messages = context_records(directory, MESSAGES_FILE)
        tools = context_records(directory, TOOLS_FILE)
        assert messages[: len(before)] == before  # history before the crash is untouched

        # Each turn answered once on disk; only the call in flight at the kill was asked twice.
        assistant_turns = [replayed_turn(m) for m in messages if m["role"] == "assistant"]
        assert assistant_turns == list(range(7))
        asked = Counter(r["turn"] for r in agent_requests(server.requests))
        assert asked == {turn: 2 if turn == SLOW_TURN else 1 for turn in range(7)}

        assert [t["tool_name"] for t in tools] == ["write_file", "bash", "bash", "bash", "bash", "bash", "finish"]
        assert all(t["status"] == "success" for t in tools)
        assert NOTE in tools[5]["result"]  # the new worker's checkout has the file the dead one wrote
        assert (stack.root / "workspaces" / uuid / "notes.txt").exists()  # w1 died with its checkout; w2 cloned
        assert git(repo, "show", f"tasuki/1-{uuid[:8]}:notes.txt") == NOTE
        # Exactly one completion (the log line follows the final state by a moment).
        finished = '"event": "task finished"'
        stack.wait_until(lambda: finished in worker_logs(stack), 30, "the completion to be logged")
        assert worker_logs(stack).count(finished) == 1

        if provider == "ollama":
            chats = [r for r in server.requests if r["method"] == "POST"]
            assert {r["path"] for r in chats} == {"/api/chat"}
            assert all(r["body"]["options"]["num_ctx"] == CONTEXT_LENGTH for r in chats)


KILL_AFTER_CHECKPOINTS_DROPPED = """#!/bin/sh
# The remote's hook: the first time a task's checkpoints are deleted (the last git step of a completed task,
# right after its branch was pushed), the machine dies: SIGKILL to the pushing worker's whole process group.
while read old new ref; do
  case "$ref" in
    refs/heads/tasuki-checkpoints/*)
      if [ "$new" = 0000000000000000000000000000000000000000 ] && [ ! -e "{marker}" ]; then
        touch "{marker}"
        kill -9 0
      fi;;
  esac
done
"""


def test_a_worker_killed_right_after_pushing_the_branch_leaves_the_work_on_the_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, note_and_finish()) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        hook = repo / ".git" / "hooks" / "post-receive"
        hook.write_text(KILL_AFTER_CHECKPOINTS_DROPPED.format(marker=tmp_path / "killed"))
        hook.chmod(0o755)
        first = stack.start_worker("w1")
        request = local_request(repo, prompt="Leave a note.")
        uuid = stack.send(request)
        assert first.process is not None
        first.process.wait(timeout=60)  # the hook killed it after the branch was pushed

        assert (stack.contexts_dir / "running" / uuid).is_dir()  # it died before completing the context
        assert git(repo, "show", f"tasuki/1-{uuid[:8]}:notes.txt") == NOTE
        state = resume_on_another_machine(stack, uuid, request)

        assert state["status"] == "completed", state
        assert state["attempt"] == 2
        assert [r["turn"] for r in agent_requests(server.requests)] == [0, 1]  # the finish is not asked again
        assert git(repo, "show", f"tasuki/1-{uuid[:8]}:notes.txt") == NOTE  # the resumed push kept the work


def test_a_delivery_arriving_before_the_dead_holders_lock_is_stale_is_deferred_not_dropped(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    # Room to deliver while the lock is still fresh: starting w2, the kill and the reaping took over 10 s on a busy
    # machine, so the lock must stay fresh for longer than that.
    env = {"TASUKI__CONTEXTS__STALE_AFTER_S": "30"}
    with running_stack(tmp_path, redis_url, crash_trajectory(), env=env) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        first = stack.start_worker("w1")
        request = local_request(repo, prompt="Leave a note.")
        uuid = stack.send(request)
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == SLOW_TURN and r["status"] is None, 60)
        holder = ContextStore(stack.contexts_dir).read_lock(uuid)
        assert holder is not None
        stack.start_worker("w2")  # ready before the crash, so the delivery below comes while the lock is fresh
        first.kill()
        # kill -0 counts a zombie as alive, and an orphaned pool process stays one until init reaps it.
        stack.wait_until(lambda: not process_alive(holder.process_id), 30, "the killed holder to be reaped")

        assert not is_stale(holder, utc_now(), 30, holder.hostname, False)
        stack.send(request, uuid=uuid)  # the holder is gone, its lock still fresh
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        assert state["attempt"] == 2  # a deferred delivery never took the context
        assert "delivery deferred" in worker_logs(stack)
        assert [replayed_turn(m) for m in context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
                if m["role"] == "assistant"] == list(range(7))  # fmt: skip


def test_a_checkout_left_half_made_by_a_crash_is_made_again(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, note_and_finish()) as (stack, _):
        repo = make_buggy_repo(tmp_path / "repo")
        uuid = str(uuid_module.uuid4())
        # A worker died between cloning and creating the task branch: the clone is there, the branch is not.
        git(tmp_path, "clone", "-q", str(repo), str(tmp_path / "workspaces" / uuid))
        stack.start_worker("w1")
        stack.send(local_request(repo, prompt="Leave a note."), uuid=uuid)
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        assert git(repo, "show", f"tasuki/1-{uuid[:8]}:notes.txt") == NOTE


def test_a_context_whose_first_worker_died_before_writing_the_task_gets_the_task_on_resume(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, note_and_finish()) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        request = local_request(repo, prompt="Leave a note.")
        store = ContextStore(stack.contexts_dir, heartbeat_interval_s=3600)
        uuid = str(uuid_module.uuid4())
        # The first worker wrote the system prompt and died before the task message; its lock was released.
        config = {
            "llm_provider": "openai",
            "model": "scripted",
            "context_length": 32768,
            "compression_threshold": 0.7,
            "endpoint": server.openai_base_url,
        }
        ctx = store.create(request["task_key"], config, uuid=uuid, extra_metadata={"request": request})
        ctx.append_message("system", "You are Tasuki.")
        ctx.release()

        stack.start_worker("w1")
        stack.send(request, uuid=uuid)
        state = stack.wait_finished(uuid)

        assert state["status"] == "completed", state
        messages = context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert "Leave a note." in messages[1]["content"]
        first = agent_requests(server.requests)[0]["body"]["messages"]
        assert [m["role"] for m in first[:2]] == ["system", "user"]  # the model saw the task
