"""A running task's inbox (SPEC §14) against real Redis and a real context: a comment leaves its Redis list only
once the context holds it, so a worker that dies at any point of taking it loses nothing and repeats nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from contexts import ContextStore
from contexts.names import MESSAGES_FILE
from tests.helpers.context_support import CONFIG, TASK_KEY
from webhooks.followups import inbox_entry
from worker.inbox import Inbox, read_inbox, trim_inbox
from worker.names import INBOX_PREFIX

UUID = "3b1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f14"


def inbox(client: redis.Redis, passes: Any = lambda entry: entry) -> Inbox:
    return Inbox(lambda: read_inbox(client, UUID), lambda count: trim_inbox(client, UUID, count), passes)


def comment(client: redis.Redis, text: str) -> None:
    client.rpush(INBOX_PREFIX + UUID, json.dumps(inbox_entry("alice", text, {})))


def heard(store: ContextStore) -> list[str]:
    lines = (store.running_path(UUID) / MESSAGES_FILE).read_text().splitlines()
    return [m["content"] for m in map(json.loads, lines) if m.get("inbox")]


def test_reading_the_inbox_removes_nothing_and_a_trim_keeps_what_arrived_since(redis_client: redis.Redis) -> None:
    redis_client.rpush(INBOX_PREFIX + UUID, json.dumps({"body": "first"}), "not json", json.dumps({"body": "second"}))
    entries, read = read_inbox(redis_client, UUID)
    assert ([e["body"] for e in entries], read) == (["first", "second"], 3)
    assert read_inbox(redis_client, UUID)[1] == 3  # still there
    redis_client.rpush(INBOX_PREFIX + UUID, json.dumps({"body": "third"}))
    trim_inbox(redis_client, UUID, read)
    assert [e["body"] for e in read_inbox(redis_client, UUID)[0]] == ["third"]


def test_a_worker_dying_before_its_step_is_written_leaves_the_comment_for_the_resume(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    store = ContextStore(tmp_path / "contexts")
    ctx = store.create(TASK_KEY, CONFIG, uuid=UUID, heartbeat=False)
    comment(redis_client, "Keep the old flag.")
    read_inbox(redis_client, UUID)  # the first attempt read it, then died before appending anything

    resumed = inbox(redis_client)
    assert resumed.hear(ctx) == 1
    resumed.taken()
    assert len(heard(store)) == 1
    assert "Keep the old flag." in heard(store)[0]
    assert read_inbox(redis_client, UUID) == ([], 0)


def test_a_worker_dying_between_writing_its_step_and_trimming_is_not_told_twice(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    store = ContextStore(tmp_path / "contexts")
    ctx = store.create(TASK_KEY, CONFIG, uuid=UUID, heartbeat=False)
    comment(redis_client, "Keep the old flag.")
    assert inbox(redis_client).hear(ctx) == 1
    ctx.step_done()  # on disk; the worker dies before its trim
    comment(redis_client, "And update the changelog.")  # arrives meanwhile

    resumed = inbox(redis_client)  # a new attempt: it knows only what the context holds
    assert resumed.hear(ctx) == 1
    resumed.taken()
    assert [text.count("Keep the old flag.") + 2 * text.count("changelog") for text in heard(store)] == [1, 2]
    assert read_inbox(redis_client, UUID) == ([], 0)


def test_a_comment_the_reporter_drops_is_trimmed_and_a_failed_trim_is_redone_without_repeating(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    store = ContextStore(tmp_path / "contexts")
    ctx = store.create(TASK_KEY, CONFIG, uuid=UUID, heartbeat=False)
    comment(redis_client, "from a guest")
    comment(redis_client, "from a developer")
    trims: list[int] = []

    def failing_trim(count: int) -> None:
        trims.append(count)
        if len(trims) == 1:
            raise redis.ConnectionError("Redis restarting")
        trim_inbox(redis_client, UUID, count)

    taker = Inbox(lambda: read_inbox(redis_client, UUID), failing_trim,
                  lambda entry: None if entry["body"] == "from a guest" else entry)
    assert taker.hear(ctx) == 1
    taker.taken()  # fails: both stay in the list
    assert taker.hear(ctx) == 0  # read again, heard already
    taker.taken()
    assert trims == [2, 2]
    assert len(heard(store)) == 1
    assert read_inbox(redis_client, UUID) == ([], 0)
