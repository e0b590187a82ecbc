"""A burst of tasks on one repository costs one repository merge, not one per task: real worker processes, Redis,
replay model (SPEC §13; issue 13 §3)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from memory.sqlite import SQLiteMemoryStore
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, local_request, make_buggy_repo
from worker.names import MAINTENANCE_QUEUE, MERGE_WAITING_PREFIX

pytestmark = pytest.mark.integration

FINISH_AT_ONCE = [{"content": "Nothing to do.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Done."}}]}]
REPOSITORY_PROMPT = "You keep the memory of one software repository"
PROMPTS = [  # distinct tasks: the replay model's condensed answer must not read as an echo of near-identical threads
    "Rename the add helper to plus and update every caller in the calculator module accordingly.",
    "Document why subtraction was used in add, with a docstring quoting the failing unittest output.",
    "Add a command line entry point that reads two integers from argv and prints their sum.",
    "Configure continuous integration to run python -m unittest on every push to the main branch.",
    "Explain in the README how contributors should run the tests before opening a pull request.",
]


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[Stack]:
    with model_server(FINISH_AT_ONCE) as server:
        s = Stack(tmp_path, redis_url, server.url)  # no embedding model: first thread memories need no job
        s.model = server  # type: ignore[attr-defined]
        try:
            yield s
        finally:
            s.stop()


def memory_requests(stack: Stack) -> list[dict[str, Any]]:
    return [r for r in stack.model.requests if r["kind"] == "memory"]  # type: ignore[attr-defined]


def repository_memory(path: Path, repository: str) -> Any:
    store = SQLiteMemoryStore(path)
    try:
        return store.memory("repository", repository)
    finally:
        store.close()


def queued_job(raw: bytes) -> tuple[str, list[Any]]:
    """A Celery message on a Redis list: its task name and positional arguments."""
    message = json.loads(raw)
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return message["headers"]["task"], args


def metered_memory_calls(stack: Stack, uuid: str) -> int:
    state = json.loads((stack.contexts_dir / "completed" / uuid / "state.json").read_text())
    return sum(b["calls"] for b in state["usage"]["by_call"].values() if b["kind"] == "memory")


def test_a_burst_of_tasks_on_one_repository_makes_one_merge_that_names_every_task(
    stack: Stack, tmp_path: Path, redis_client: redis.Redis
) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    stack.start_worker("tasks", concurrency=2, queues="tasks,compression")
    uuids = [stack.send(local_request(repo, prompt, task_id=str(n))) for n, prompt in enumerate(PROMPTS)]
    for uuid in uuids:
        assert stack.wait_finished(uuid)["status"] == "completed"
    repository = str(repo)

    # Every task wrote its thread's first memory itself and flagged the merge: one merge job waits, no update job.
    waiting = stack.wait_until(
        lambda: len(redis_client.hgetall(MERGE_WAITING_PREFIX + repository)) == len(uuids),
        30,
        "every thread flagged for the merge",
    )
    assert waiting
    # The database is shared with the tests before this one on the same xdist worker: only this repository's jobs.
    queued = [queued_job(m) for m in redis_client.lrange(MAINTENANCE_QUEUE, 0, -1)]
    assert [name for name, args in queued if repository in args or name != "tasuki.merge_memory"] == [
        "tasuki.merge_memory"
    ]
    assert memory_requests(stack) == []  # no model call so far

    stack.start_worker("maintenance", queues="maintenance")
    memory = stack.wait_until(lambda: repository_memory(tmp_path / "memory.db", repository), 60, "the repository merge")
    assert set(memory.sources) == set(uuids)
    for uuid in uuids:
        assert uuid in memory.text
    calls = memory_requests(stack)
    assert len(calls) == 1 < len(uuids)
    assert calls[0]["body"]["messages"][0]["content"].startswith(REPOSITORY_PROMPT)
    # The one call is metered for one task (the newest it merged), in one write.
    stack.wait_until(lambda: sum(metered_memory_calls(stack, u) for u in uuids) == 1, 30, "the merge metered")
    # The job meters, closes its store, and only then takes the merged threads off the waiting list (run 4 of a CI
    # series read the list in between).
    stack.wait_until(lambda: redis_client.hgetall(MERGE_WAITING_PREFIX + repository) == {}, 30, "the threads unflagged")
