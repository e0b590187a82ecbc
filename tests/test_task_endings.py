"""How a task ends and what it leaves (docs/endings.md): a task stopped by a limit — its steps, its time, its budget, a
model that stays down — delivers what it changed as a draft pull/merge request that says why, and tells its issue;
a task that ends with nothing to deliver leaves no branch behind.

Real celery worker processes, the replay model over HTTP, bare git remotes (local tasks) and the fake forge over
real HTTP and git (GitHub, GitLab, Gitea)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore
from contexts.names import MESSAGES_FILE
from replay import ReplayModel, ReplayServer, serve
from replay.trajectory import turns_from_entries
from tests.helpers.celery_worker import celery_client
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.model_server import wait_for_request
from tests.helpers.stack import Stack, git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import (
    agent_requests,
    bash_turn,
    context_records,
    finish_turn,
    provider_env,
    replayed_turn,
    running_stack,
    tool,
)
from worker.settings_models import LabelSettings
from worker.submit import request_cancel
from worker.threads import find_branch_thread, followup_of

pytestmark = pytest.mark.integration


def bare_repo(tmp_path: Path) -> Path:
    """A bare repository holding the buggy calc project: the remote a local task clones and pushes to."""
    bare = tmp_path / "calc.git"
    source = make_buggy_repo(tmp_path / "calc-source")
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True, capture_output=True)
    return bare


def heads(bare: Path) -> set[str]:
    """Every branch of a bare remote."""
    return set(git(bare, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def test_a_local_task_stopped_at_its_step_limit_without_a_change_leaves_no_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(step) for step in range(3)]
    env = {"TASUKI__AGENT__MAX_STEPS": "2"}
    with running_stack(tmp_path, redis_url, turns, env=env) as (stack, _server):
        bare = bare_repo(tmp_path)
        stack.start_worker("w1")
        uuid = stack.send(local_request(bare, prompt="Print the log."))
        state = stack.wait_finished(uuid)

    assert state["status"] == "failed", state
    assert state["reason"] == "steps"
    assert state["llm_call_count"] == 2
    assert heads(bare) == {"main"}  # no task branch, no checkpoint branch
    assert not (state.get("result") or {}).get("branch")



def test_a_failed_and_a_cancelled_local_task_without_a_change_leave_no_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    # The first task's model has nothing after its third turn (a 400 that is no limit: the task fails); the second is
    # held at its second turn and cancelled there.
    turns = [bash_turn(0), {"gate": "held", "gate_when": r"\(hold me\)"}, bash_turn(1), bash_turn(2)]
    with running_stack(tmp_path, redis_url, turns) as (stack, server):
        failing, cancelled = bare_repo(tmp_path / "a"), bare_repo(tmp_path / "b")
        stack.start_worker("w1")
        failed = stack.wait_finished(stack.send(local_request(failing, prompt="Print the log.")))
        uuid = stack.send(local_request(cancelled, prompt="Print the log (hold me).", task_id="2"))
        stack.wait_until(lambda: server.model.gate_reached("held"), 60, "the second turn's request")
        with celery_client(redis_url) as app:
            request_cancel(app, redis_client, ContextStore(stack.contexts_dir), uuid)
        server.model.open_gate("held")
        stopped = stack.wait_finished(uuid)

    assert failed["status"] == "failed", failed
    assert "replay trajectory exhausted" in failed["error"]
    assert failed.get("reason") is None  # no limit: a failure like any other
    assert heads(failing) == {"main"}
    assert stopped["status"] == "cancelled", stopped["error"]
    assert heads(cancelled) == {"main"}


# -- on the forges ------------------------------------------------------------------------------------------------

TOKEN = "endings-forge-token-5e1a"
REPOS = {"github": ("octo", "calc"), "gitlab": ("group", "calc"), "gitea": ("team", "calc")}
NOTE = "work so far\n"
LABELS = LabelSettings()


@contextmanager
def forge_stack(
    tmp_path: Path, redis_url: str, entries: list[dict[str, Any]], env: dict[str, str] | None = None,
    *, context_window: int | None = None,
) -> Iterator[tuple[Stack, ReplayServer, FakeForge]]:
    """The replay model answering ``entries``, the fake forge with the calc repository on each of its forges, and a
    stack whose workers use both."""
    server = serve(ReplayModel(turns_from_entries(entries), context_window=context_window))
    try:
        with FakeForge(tmp_path / "forge", TOKEN).serve() as forge:
            for source, (owner, repo) in REPOS.items():
                forge.add_repo(owner, repo, make_buggy_repo(tmp_path / f"{source}-source"))
            stack = Stack(tmp_path, redis_url, server.url, {
                **provider_env("openai", server.url, 32768),
                "TASUKI__GITHUB__API_URL": forge.github_api_url,
                "TASUKI__GITLAB__API_URL": forge.gitlab_api_url,
                "TASUKI__GITEA__API_URL": forge.gitea_api_url,
                "GITHUB_TOKEN": TOKEN,
                "GITLAB_TOKEN": TOKEN,
                "GITEA_TOKEN": TOKEN,
                **(env or {}),
            })
            try:
                yield stack, server, forge
            finally:
                stack.stop()
    finally:
        server.stop()


def start_issue(stack: Stack, forge: FakeForge, source: str = "github") -> str:
    """Issue 1 of the source's calc repository, labelled, and a worker: its task's UUID."""
    owner, repo = REPOS[source]
    forge.add_item(owner, repo, 1, "Leave a note", "Write what you find to notes.txt.", labels=[LABELS.trigger])
    key = {"task_source": source, "owner": owner, "repo": repo, "task_type": "issue", "task_id": "1"}
    stack.start_worker("w1")
    return stack.send({"task_key": key, "prompt": "", "user": "alice", "trigger": {"kind": "label", "user": "alice"}})


def told(stack: Stack, forge: FakeForge, uuid: str, source: str = "github", timeout_s: float = 90.0) -> dict[str, Any]:
    """The task's final state once its issue was told how it ended (the final comment comes after the context is
    finished)."""
    state = stack.wait_finished(uuid, timeout_s=timeout_s)
    item = forge.item(*REPOS[source], 1)
    stack.wait_until(lambda: any(c.body.startswith("**Tasuki stopped") for c in item.comments), 30,
                     "the issue's final comment")
    return state


def run_issue(
    stack: Stack, forge: FakeForge, source: str = "github", timeout_s: float = 90.0
) -> tuple[str, dict[str, Any]]:
    """Issue 1's task, run to its end: its UUID and final state."""
    uuid = start_issue(stack, forge, source)
    return uuid, told(stack, forge, uuid, source, timeout_s)


def note_then_steps(count: int) -> list[dict[str, Any]]:
    """A note written at once, then ``count`` steps that print the log."""
    return [{"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
            *(bash_turn(step) for step in range(1, count + 1)), finish_turn("Left a note.")]


def assert_a_draft(forge: FakeForge, source: str, uuid: str, state: dict[str, Any], why: str) -> FakeChange:
    """The task delivered its note as a draft that says ``why`` it stopped, its result names it, its issue was told,
    and no checkpoint branch is left."""
    owner, repo = REPOS[source]
    branch = f"tasuki/1-{uuid[:8]}"
    change = forge.change(owner, repo, branch)
    assert change.draft, change
    assert why in change.body
    assert "Closes #1" in change.body
    assert forge.branch_file(owner, repo, branch, "notes.txt") == NOTE
    bare = forge.git_root / owner / f"{repo}.git"
    assert heads(bare) == {"main", branch}  # the checkpoint branch went with the push
    result = state["result"]
    assert result["pull_request_url"] == change.url
    assert result["draft"] is True
    assert result["branch"] == branch
    assert result["commit"] == git(bare, "rev-parse", branch).strip()
    assert git(bare, "log", "-1", "--format=%s", branch).startswith("tasuki: unfinished, ")
    issue = forge.item(owner, repo, 1)
    assert issue.labels == [LABELS.failed]
    last = issue.comments[-1].body
    assert last.startswith(f"**Tasuki stopped: {state['status']}.**"), last
    assert why in last
    assert f"What it changed so far is in a draft: {change.url}" in last
    return change


def test_a_task_at_its_step_limit_delivers_its_work_as_a_draft_pull_request_and_tells_its_issue(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with forge_stack(tmp_path, redis_url, note_then_steps(5), {"TASUKI__AGENT__MAX_STEPS": "3"}) as (stack, _, forge):
        uuid, state = run_issue(stack, forge)

    assert state["status"] == "failed", state
    assert state["reason"] == "steps"
    assert state["error"] == "step limit of 3 reached without finish"
    assert state["llm_call_count"] == 3
    change = assert_a_draft(forge, "github", uuid, state, "used all of its 3 steps (agent.max_steps)")
    assert "Step 2: print the log block." in change.body  # what it was doing last
    assert change.title == "Leave a note (#1)"
    bare = forge.git_root / "octo" / "calc.git"
    message = git(bare, "log", "-1", "--format=%B", f"tasuki/1-{uuid[:8]}")
    assert message.startswith("tasuki: unfinished, stopped at its step limit\n\n")
    assert "Step 2: print the log block." in message


@pytest.mark.parametrize(("source", "marker"), [("gitlab", "Draft: "), ("gitea", "WIP: ")])
def test_gitlab_and_gitea_get_their_own_draft_marker(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, source: str, marker: str
) -> None:
    with forge_stack(tmp_path, redis_url, note_then_steps(5), {"TASUKI__AGENT__MAX_STEPS": "2"}) as (stack, _, forge):
        uuid, state = run_issue(stack, forge, source)

    assert state["status"] == "failed", state
    assert state["reason"] == "steps"
    change = assert_a_draft(forge, source, uuid, state, "used all of its 2 steps (agent.max_steps)")
    assert change.title == f"{marker}Leave a note (#1)"


def test_a_task_at_its_budget_delivers_a_draft(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    env = {"TASUKI__LIMITS__TASK_TOKENS": "6000"}
    with forge_stack(tmp_path, redis_url, note_then_steps(11), env) as (stack, _, forge):
        uuid, state = run_issue(stack, forge)

    assert state["status"] == "failed", state
    assert state["reason"] == "budget"
    assert state["error"].startswith("budget: the task used ")
    assert_a_draft(forge, "github", uuid, state, "reached its budget (the task used ")
    assert "limits.task_tokens is 6000" in forge.change("octo", "calc", f"tasuki/1-{uuid[:8]}").body


def test_a_task_past_its_time_limit_delivers_a_draft_and_ends_as_timeout(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [{"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
             {"delay_s": 300}, bash_turn(1), finish_turn()]
    env = {"TASUKI__AGENT__SOFT_TIME_LIMIT_S": "12", "TASUKI__AGENT__TIME_LIMIT_S": "120"}
    with forge_stack(tmp_path, redis_url, turns, env) as (stack, server, forge):
        uuid, state = run_issue(stack, forge, timeout_s=60)
        server.model.stop()  # release the held answer so the server can stop

    assert state["status"] == "timeout", state["error"]
    assert state["reason"] == "time"
    assert state["error"] == "soft time limit reached"
    assert state["llm_call_count"] == 1
    assert_a_draft(forge, "github", uuid, state, "ran past its time limit of 12 s (agent.soft_time_limit_s)")


def test_a_task_whose_model_stays_down_delivers_a_draft(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [{"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
             {"fail": 503, "times": 1000}, bash_turn(1), finish_turn()]
    env = {"TASUKI__LLM__RETRY_FOR_S": "1", "TASUKI__LLM__BACKOFF_BASE_S": "0.05"}
    with forge_stack(tmp_path, redis_url, turns, env) as (stack, server, forge):
        uuid, state = run_issue(stack, forge)
        refused = [r for r in agent_requests(server.requests) if r["turn"] == 1]

    assert state["status"] == "failed", state
    assert state["reason"] == "model"
    assert "HTTP 503" in state["error"]
    assert len(refused) > 1  # retried, then given up
    assert {r["status"] for r in refused} == {503}
    assert state["llm_call_count"] == 1
    assert_a_draft(forge, "github", uuid, state, "model stayed unavailable (")


def test_a_task_whose_model_stops_writing_calls_delivers_a_draft(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    prose = {"content": "The note is there; I believe everything works now."}
    turns = [{"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
             prose, prose, prose, bash_turn(1), finish_turn()]
    with forge_stack(tmp_path, redis_url, turns, {"TASUKI__AGENT__MAX_FORMAT_ERRORS": "3"}) as (stack, _, forge):
        uuid, state = run_issue(stack, forge)

    assert state["status"] == "failed", state
    assert state["reason"] == "model"
    assert state["error"] == "the model answered 3 times in a row without a tool call Tasuki could run"
    assert state["llm_call_count"] == 4  # the note's reply and the three without a call: nothing after them
    assert_a_draft(forge, "github", uuid, state, "model stopped writing tool calls (the model answered 3 times")


def test_a_forge_task_stopped_without_a_change_opens_nothing_and_leaves_no_branch(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [bash_turn(step) for step in range(4)]
    with forge_stack(tmp_path, redis_url, turns, {"TASUKI__AGENT__MAX_STEPS": "2"}) as (stack, _, forge):
        _uuid, state = run_issue(stack, forge)

    assert state["status"] == "failed", state
    assert state["reason"] == "steps"
    assert not forge.changes
    assert heads(forge.git_root / "octo" / "calc.git") == {"main"}
    issue = forge.item("octo", "calc", 1)
    assert issue.labels == [LABELS.failed]
    assert issue.comments[-1].body.startswith("**Tasuki stopped: failed.**\n\nstep limit of 2 reached without finish")


def test_a_follow_up_on_a_draft_continues_its_pull_request(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    append = {"content": "Note it.", "tool_calls": [tool("bash", command="echo change >> notes.txt")]}
    turns = [append, *(bash_turn(step) for step in range(1, 4)), finish_turn("Noted it twice.")]
    with forge_stack(tmp_path, redis_url, turns, {"TASUKI__AGENT__MAX_STEPS": "3"}) as (stack, _, forge):
        first, state = run_issue(stack, forge)
        branch = f"tasuki/1-{first[:8]}"
        change = forge.change("octo", "calc", branch)
        thread = stack.wait_until(lambda: find_branch_thread(redis_client, "github", "octo", "calc", branch), 30,
                                  "the draft's thread")
        # What the intake sends for a comment mentioning Tasuki on the draft (tests/test_followups_e2e.py goes
        # through the intake); this follow-up stops at its step limit too.
        request = {"task_key": thread.task_key, "prompt": "Note it once more.", "user": "alice",
                   "issue": {"number": change.number, "title": change.title, "body": ""},
                   "trigger": {"kind": "comment", "user": "alice"}, "followup": followup_of(thread, "comment")}
        second = stack.send(request)
        again = stack.wait_finished(second)
        pull = forge.item("octo", "calc", change.number)
        stack.wait_until(lambda: any(c.body.startswith("**Tasuki stopped") for c in pull.comments), 30,
                         "the pull request's final comment")

    assert state["status"] == again["status"] == "failed", again["error"]
    assert thread.pull == change.number
    assert thread.last_uuid == first
    assert [c.head for c in forge.changes] == [branch]  # no second pull request
    assert forge.branch_file("octo", "calc", branch, "notes.txt") == "change\nchange\n"
    assert again["result"]["pull_request_url"] == change.url
    assert again["result"]["branch"] == branch
    assert heads(forge.git_root / "octo" / "calc.git") == {"main", branch}
    assert pull.comments[-1].body.startswith("**Tasuki stopped: failed.** It used all of its 3 steps")


# -- a prompt too long for the model's window -------------------------------------------------------------------

WINDOW_GATE = "set-the-window"


def refused_as_too_long(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat requests the replay model refused for a prompt over its window."""
    return [r for r in requests if r["status"] == 400 and r["path"].endswith("/chat/completions")]


def test_a_prompt_over_the_model_window_is_compressed_and_the_step_sent_again(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    # A long log first (summarized away once compressed), then steps of a few hundred tokens each; the window is set
    # while turn 3 is held, just above that turn's prompt: turn 4's prompt is over it, and fits once compressed.
    turns = [bash_turn(0, lines=300), bash_turn(1), bash_turn(2), {"gate": WINDOW_GATE}, bash_turn(3), bash_turn(4),
             finish_turn()]
    with running_stack(tmp_path, redis_url, turns) as (stack, server):
        stack.start_worker("w1")
        uuid = stack.send(local_request(bare_repo(tmp_path), prompt="Print the logs."))
        held = wait_for_request(lambda: server.requests, lambda r: r["turn"] == 3, 60)
        window = int(held["prompt_tokens"]) + 150
        server.model.context_window = window
        server.model.open_gate(WINDOW_GATE)
        state = stack.wait_finished(uuid)
        requests = server.requests

    assert state["status"] == "completed", state["error"]
    refused = refused_as_too_long(requests)
    assert len(refused) == 1, [(r["turn"], r["status"], r["prompt_tokens"]) for r in requests]
    after = requests[requests.index(refused[0]) + 1:]
    assert after[0]["kind"] == "summary"  # compressed at once, below the threshold
    assert after[0]["status"] == 200
    resent = next(r for r in after if r["kind"] == "agent")
    assert resent["turn"] == 4  # the same step, sent again
    assert resent["status"] == 200
    assert resent["prompt_tokens"] <= window < refused[0]["prompt_tokens"]
    assert state["compression_count"] >= 1
    directory = stack.contexts_dir / "completed" / uuid
    replies = [m for m in context_records(directory, MESSAGES_FILE) if m["role"] == "assistant"]
    assert state["llm_call_count"] == len(replies) == len(turns) - 1  # every turn once: the refusal is no step
    assert [replayed_turn(m) for m in replies] == list(range(len(turns) - 1))


def test_a_prompt_that_never_fits_stops_the_task_with_reason_model_and_a_draft(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    turns = [{"content": "Leave a note.", "tool_calls": [tool("write_file", path="notes.txt", content=NOTE)]},
             {"gate": WINDOW_GATE}, bash_turn(1), finish_turn()]
    with forge_stack(tmp_path, redis_url, turns) as (stack, server, forge):
        uuid = start_issue(stack, forge)
        stack.wait_until(lambda: server.model.gate_reached(WINDOW_GATE), 60, "turn 1's request")
        # Turn 1's request is past the window's check: it is answered; turn 2's meets the window, which is less than
        # the pinned task and the tool schemas alone.
        server.model.context_window = 200
        server.model.open_gate(WINDOW_GATE)
        state = told(stack, forge, uuid)
        requests = server.requests

    assert state["status"] == "failed", state["error"]
    assert state["reason"] == "model"
    assert "did not fit the model's window after 3 tries to shrink it" in state["error"]
    refused = refused_as_too_long(requests)
    assert len(refused) == 4  # the step sent, then sent smaller three times: bounded
    sizes = [r["prompt_tokens"] for r in refused]
    assert sizes == sorted(sizes, reverse=True), sizes  # the emergency rule cut it down each time it could
    assert sizes[-1] < sizes[0]
    assert state["llm_call_count"] == 2  # the two answered steps; the refused one is no step
    assert_a_draft(forge, "github", uuid, state, "prompt did not fit the model's context window")
