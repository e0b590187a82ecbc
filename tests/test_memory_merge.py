"""Cheap memory updates: a thread's first episode needs no model, and repository merges are coalesced in Redis
(at most one merge job queued per repository; a thread flagged again while a merge runs stays for the next)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from contexts.tokens import estimate_tokens
from memory import Memory
from memory.prompt import CUT, memory_block
from memory.sqlite import SQLiteMemoryStore
from memory.update import (
    MERGE_BATCH_BOUNDS,
    episode_material,
    judge,
    merge_batch,
    thread_without_model,
    threads_material,
)
from tests.helpers.memory_support import NOW, episode
from worker.merging import finish_merge, release_merge, request_merge, start_merge
from worker.names import MERGE_QUEUED_PREFIX, MERGE_RUNNING_PREFIX, MERGE_WAITING_PREFIX
from worker.remembering import merge_repository, next_merge, record_episode, update_memories
from worker.settings_models import Settings

REPO = "github:acme/web"
LEARNED = episode(
    "u1",
    REPO,
    task="Fix the login ImportError",
    thread=f"{REPO}#issue/1",
    final_summary="Fixed the import in auth/login.py",
    files_changed=("auth/login.py",),
)


def settings_for(tmp_path: Path, **memory: object) -> Settings:
    return Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}, "memory": memory})


# -- the pure decision -----------------------------------------------------------------------------


def test_a_threads_first_episode_within_the_bound_is_its_memory_as_written() -> None:
    assert thread_without_model(None, LEARNED, max_tokens=2000) == episode_material(LEARNED)


def test_a_thread_with_memory_asks_the_model_to_merge() -> None:
    existing = Memory("thread", LEARNED.thread, "- earlier work", NOW, ("u0",))
    assert thread_without_model(existing, LEARNED, max_tokens=2000) is None


def test_a_first_episode_longer_than_the_bound_asks_the_model() -> None:
    bound = estimate_tokens(episode_material(LEARNED)) - 1
    assert thread_without_model(None, LEARNED, max_tokens=bound) is None
    assert thread_without_model(None, LEARNED, max_tokens=bound + 1) == episode_material(LEARNED)


def test_an_answer_keeping_a_first_episode_memory_is_not_an_echo_of_a_similar_episode() -> None:
    first = episode_material(LEARNED)
    again = episode_material(replace(LEARNED, uuid="u2"))  # the same task retried: nearly the same material
    answer = first + "\n- " + again[: len(again) // 3]  # the replay model's way: the memory, a bullet of the new
    assert not judge(answer, again, 2000).accepted  # without the existing memory it reads as an echo
    assert judge(answer, again, 2000, existing=first).accepted
    other = Memory("thread", LEARNED.thread, "- the parser needs python 3.11 (u0)", NOW)
    assert not judge(again, again, 2000, existing=other.text).accepted  # a verbatim echo is still refused
    assert not judge(other.text + "\n" + again, again, 2000, existing=other.text).accepted  # kept + the echo
    assert judge(first, again, 2000, existing=first).accepted  # the memory kept as it was: nothing echoed


def test_threads_material_names_every_task_first() -> None:
    threads = [Memory("thread", "t1", "- one", NOW, ("a", "b")), Memory("thread", "t2", "- two", NOW, ("c",))]
    text = threads_material(threads)
    assert text.splitlines()[0] == "Thread memories of tasks a, b, c:"
    assert "Thread t1 (tasks a, b):\n- one" in text
    assert "Thread t2 (tasks c):\n- two" in text


def test_a_first_episode_thread_memory_longer_than_the_room_is_cut_not_left_out() -> None:
    thread = Memory("thread", LEARNED.thread, episode_material(LEARNED) + "\n" + "more detail " * 200, NOW, ("u1",))
    text, use = memory_block([], None, thread, [], 150)
    assert use.thread_memory
    assert "Task u1 (completed" in text
    assert text.endswith(CUT)
    assert estimate_tokens(text) <= 150


# -- the task process: record the episode and write the thread memory with one open store -----------


def recorded_in(settings: Settings, e: Any) -> Any:
    """record_episode for an episode of a task that had no context (built from the request)."""
    request = {
        "task_key": {
            "task_source": "github",
            "owner": "acme",
            "repo": "web",
            "task_type": "issue",
            "task_id": e.thread.rsplit("/", 1)[1],
        },
        "prompt": e.task,
    }
    return record_episode(settings, e.uuid, request, "failed", None, NOW)


def test_without_an_embedding_model_the_task_process_writes_a_first_thread_memory(tmp_path: Path) -> None:
    recorded = recorded_in(settings_for(tmp_path), LEARNED)
    assert recorded.next == "merge"  # no update_memory job: only the repository merge is flagged
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    thread = store.memory("thread", recorded.episode.thread)
    assert thread is not None
    assert thread.text == episode_material(recorded.episode)
    assert thread.sources == (LEARNED.uuid,)
    store.close()


def test_a_thread_with_memory_or_an_embedding_model_leaves_the_update_to_the_job(tmp_path: Path) -> None:
    assert recorded_in(settings_for(tmp_path / "a", embedding_model="e"), LEARNED).next == "update"
    second = replace(LEARNED, uuid="u2")
    assert recorded_in(settings_for(tmp_path / "b"), LEARNED).next == "merge"
    assert recorded_in(settings_for(tmp_path / "b"), second).next == "update"


def test_the_job_writes_a_first_thread_memory_without_asking_the_model(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    store.add_episode(LEARNED)
    asked: list[object] = []
    outcome = update_memories(settings_for(tmp_path), store, "u1", lambda m: asked.append(m) or "x", NOW)
    assert outcome["thread"] == "first episode, as written"
    assert outcome["merge"] == [REPO, LEARNED.thread]
    assert asked == []
    store.close()


# -- the merge: one call for every waiting thread, sources the union of theirs -------------------------


def test_one_model_call_merges_every_waiting_thread_and_the_sources_are_their_union(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    older = replace(LEARNED, uuid="u1", ended_at=NOW - timedelta(hours=2))
    newer = replace(LEARNED, uuid="u3", thread=f"{REPO}#issue/2", ended_at=NOW - timedelta(hours=1))
    for e in (older, newer):
        store.add_episode(e)
    store.put_memory(Memory("thread", older.thread, "- login fixed", NOW, ("u0", "u1")), REPO)
    store.put_memory(Memory("repository", REPO, "- run pytest -q (u0)", NOW, ("u0",)), REPO)
    asked: list[list[dict[str, str]]] = []

    def chat(messages: list[dict[str, str]]) -> str:
        asked.append(messages)
        return "- run pytest -q (u0)\n- auth lives in auth/login.py (u1, u3)"

    batch = next_merge(settings_for(tmp_path), store, REPO, {older.thread: "u1", newer.thread: "u3"}, NOW)
    threads = batch.threads
    assert [t.key for t in threads] == [older.thread, newer.thread]  # oldest task first
    assert threads[1].text == episode_material(newer)  # a thread without memory is merged from its episode
    assert batch.newest == "u3"  # the merge's call is metered for the newest task it covers
    assert (batch.merged, batch.left) == ({older.thread: "u1", newer.thread: "u3"}, 0)
    assert merge_repository(settings_for(tmp_path), store, REPO, threads, chat, NOW) == "updated"
    assert len(asked) == 1
    repo = store.memory("repository", REPO)
    assert repo is not None
    assert repo.sources == ("u0", "u1", "u3")
    store.close()


# -- coalescing in Redis ---------------------------------------------------------------------------


def test_a_merge_takes_the_oldest_threads_that_fit_one_request() -> None:
    threads = [Memory("thread", f"t{n}", "word " * 400, NOW, (f"u{n}",)) for n in range(20)]  # 500 tokens each
    assert len(merge_batch(threads, max_tokens=500)) == MERGE_BATCH_BOUNDS
    assert merge_batch(threads[:1], max_tokens=10) == threads[:1]  # one thread is always merged
    assert merge_batch([], max_tokens=500) == []


def flag(client: redis.Redis, thread: str, uuid: str, sent: list[str] | None = None) -> bool:
    return request_merge(lambda: client, REPO, thread, uuid, (sent if sent is not None else []).append)


def test_a_burst_of_flags_queues_one_merge_job(redis_client: redis.Redis) -> None:
    sent: list[str] = []
    queued = [flag(redis_client, f"{REPO}#issue/{n}", f"u{n}", sent) for n in range(5)]
    assert queued == [True, False, False, False, False]
    assert sent == [REPO]
    assert redis_client.ttl(MERGE_QUEUED_PREFIX + REPO) > 0  # a lost job never blocks the repository for good
    assert request_merge(lambda: redis_client, "github:acme/other", "t", "v1", sent.append)  # per repository


def test_the_merge_removes_exactly_the_threads_it_merged(redis_client: redis.Redis) -> None:
    flag(redis_client, "t1", "u1")
    flag(redis_client, "t2", "u2")
    waiting = start_merge(redis_client, REPO, "job-a")
    assert waiting == {"t1": "u1", "t2": "u2"}
    # Flagged while the merge runs: a newer task on t2, a new thread t3. The flag was cleared: a new job is queued.
    assert flag(redis_client, "t2", "u4")
    assert not flag(redis_client, "t3", "u5")
    finish_merge(redis_client, REPO, waiting)
    assert redis_client.hgetall(MERGE_WAITING_PREFIX + REPO) == {"t2": "u4", "t3": "u5"}


def test_a_second_merge_of_a_repository_waits_for_the_running_one(redis_client: redis.Redis) -> None:
    flag(redis_client, "t1", "u1")
    assert start_merge(redis_client, REPO, "job-a") == {"t1": "u1"}
    assert start_merge(redis_client, REPO, "job-b") is None
    release_merge(redis_client, REPO, "job-b")  # not its lock: nothing happens
    assert redis_client.get(MERGE_RUNNING_PREFIX + REPO) == "job-a"
    release_merge(redis_client, REPO, "job-a")
    assert start_merge(redis_client, REPO, "job-b") == {"t1": "u1"}  # a crashed merge left its thread waiting


def test_a_failed_enqueue_clears_the_flag_so_the_next_task_queues_the_job(redis_client: redis.Redis) -> None:
    def broker_down(repository: str) -> None:
        raise redis.ConnectionError("broker down")

    with capture_logs() as logs:
        assert not request_merge(lambda: redis_client, REPO, "t1", "u1", broker_down)
    assert [e["event"] for e in logs] == ["memory: repository merge not flagged"]
    sent: list[str] = []
    assert flag(redis_client, "t2", "u2", sent)
    assert sent == [REPO]
    assert redis_client.hgetall(MERGE_WAITING_PREFIX + REPO) == {"t1": "u1", "t2": "u2"}  # nothing lost


@pytest.mark.parametrize("error", [redis.ConnectionError("refused"), redis.TimeoutError("timed out")])
def test_a_redis_that_does_not_answer_never_fails_the_task(error: Exception) -> None:
    def client() -> redis.Redis:
        raise error

    with capture_logs() as logs:
        assert not request_merge(client, REPO, "t1", "u1", lambda r: None)
    assert [e["event"] for e in logs] == ["memory: repository merge not flagged"]
