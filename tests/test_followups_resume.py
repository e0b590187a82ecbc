"""A follow-up whose worker is SIGKILLed and resumed by a new worker (SPEC §4, §14): it goes on from the pull
request's branch, and a comment it heard before the crash is still in its prompt after the resume (it is in
``messages.jsonl`` like any message)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts.names import MESSAGES_FILE
from tests.helpers.model_server import wait_for_request
from tests.helpers.stack import git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import context_records, finish_turn, running_stack, tool
from tests.test_worker_resume import resume_on_another_machine
from worker.names import INBOX_PREFIX

pytestmark = pytest.mark.integration

BRANCH = "tasuki/7-feedbeef"
COMMENT = "Also keep the old behaviour behind a flag."


def trajectory() -> list[dict[str, Any]]:
    return [
        {"content": "Note.", "tool_calls": [tool("bash", command="echo reviewed >> notes.txt")]},
        {"content": None, "tool_calls": [tool("bash", command="cat notes.txt")]},
        {"delay_s": 300},
        {"content": None, "tool_calls": [tool("bash", command="cat calc.py")]},
        finish_turn("Addressed the review."),
    ]


def test_a_killed_follow_up_resumes_on_its_branch_with_the_comment_it_heard(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with running_stack(tmp_path, redis_url, trajectory()) as (stack, server):
        repo = make_buggy_repo(tmp_path / "repo")
        git(repo, "checkout", "-q", "-b", BRANCH)
        (repo / "notes.txt").write_text("first task\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "the first task's work")
        git(repo, "checkout", "-q", "main")
        request = {**local_request(repo, prompt="Address the review."),
                   "followup": {"kind": "comment", "branch": BRANCH}}
        uuid = "5a1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f13"
        redis_client.rpush(INBOX_PREFIX + uuid, json.dumps({"author": "alice", "body": COMMENT}))
        first = stack.start_worker("w1")
        stack.send(request, uuid=uuid)
        wait_for_request(lambda: server.requests, lambda r: r["turn"] == 2 and r["status"] is None, 60)
        assert COMMENT in json.dumps(server.requests[-1]["body"])  # heard after the first step

        first.kill()
        state = resume_on_another_machine(stack, uuid, request)

        assert state["status"] == "completed", state
        assert state["attempt"] == 2
        resumed = [r for r in server.requests if r["turn"] == 2 and r["status"] == 200]
        assert resumed
        assert COMMENT in json.dumps(resumed[-1]["body"])  # still in the prompt after the resume
        messages = context_records(stack.contexts_dir / "completed" / uuid, MESSAGES_FILE)
        assert len([m for m in messages if m.get("inbox")]) == 1
        assert git(repo, "show", f"{BRANCH}:notes.txt") == "first task\nreviewed\n"
        assert git(repo, "log", "--format=%s", BRANCH).splitlines()[1] == "the first task's work"
