"""The context store: whole-or-nothing creation, private modes, open/finish and their errors (SPEC §3)."""

from __future__ import annotations

import json
import os
import threading
import uuid as uuid_module
from pathlib import Path

import filelock
import pytest

from contexts import (
    ContextCompletedError,
    ContextError,
    ContextExistsError,
    ContextNotFoundError,
    ContextStore,
    InvalidUUIDError,
    LockHeldError,
    validate_uuid,
)
from contexts.names import FINAL_STATUSES
from contexts.state import read_state
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    Clock,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
    loose_modes,
    shifted_clock,
    wait_for,
    waiting_in,
)
from tests.helpers.schemas import validate_context_dir

CONTEXT_FILES = {"metadata.json", "state.json", "messages.jsonl", "summaries.jsonl", "tools.jsonl", ".lock"}


@pytest.fixture
def store(tmp_path: Path) -> ContextStore:
    return ContextStore(tmp_path / "contexts", fsync="never", heartbeat_interval_s=30)


def test_create_makes_a_whole_running_context_that_matches_the_schemas(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, user="alice", heartbeat=False)

    assert ctx.path == store.base_dir / "running" / ctx.uuid
    assert {p.name for p in ctx.path.iterdir()} >= CONTEXT_FILES
    state = ctx.read_state()
    assert (state["status"], state["attempt"], state["cancel_requested"]) == ("initializing", 1, False)
    assert state["worker"] == f"{store.hostname}:{os.getpid()}"
    lock = store.read_lock(ctx.uuid)
    assert lock is not None
    assert (lock.process_id, lock.hostname) == (os.getpid(), store.hostname)
    assert ctx.metadata["task_key"] == TASK_KEY
    assert ctx.metadata["user"] == "alice"
    assert validate_context_dir(ctx.path) == {"messages.jsonl": 0, "summaries.jsonl": 0, "tools.jsonl": 0}


def test_create_uses_the_given_uuid_in_canonical_form(store: ContextStore) -> None:
    wanted = str(uuid_module.uuid4())
    ctx = store.create(TASK_KEY, CONFIG, uuid=wanted.upper(), heartbeat=False)
    assert ctx.uuid == wanted
    assert ctx.metadata["uuid"] == wanted


def test_every_directory_and_file_the_store_creates_is_private(tmp_path: Path) -> None:
    base = tmp_path / "fresh" / "contexts"  # the store creates its base directory itself
    store = ContextStore(base, fsync="always", heartbeat_interval_s=0.02)
    ctx = store.create(TASK_KEY, CONFIG)
    ctx.append_message("system", "you are a coding agent")
    ctx.append_message("user", "fix the bug")
    ctx.append_tool("bash", {"command": "ls"}, "success", 3, result="README")
    ctx.update_state(status="processing", add={"tool_call_count": 1})
    wait_for(
        lambda: store.read_lock(ctx.uuid).heartbeat_at > store.read_lock(ctx.uuid).acquired_at,  # type: ignore[union-attr]
        what="a heartbeat",
    )
    finished = store.create(TASK_KEY, CONFIG, heartbeat=False)
    finished.append_message("user", "task")
    finished.finish("completed")

    assert {".lock", ".state.lock"} <= {p.name for p in ctx.path.iterdir()}
    assert (base / ".locks" / ctx.uuid).exists()
    assert loose_modes(base) == {}
    validate_context_dir(ctx.path)
    validate_context_dir(base / "completed" / finished.uuid)


def test_create_that_fails_midway_leaves_nothing_under_running_and_cleans_staging(store: ContextStore) -> None:
    bad_config = {**CONFIG, "callback": object()}  # not JSON: fails after staging began

    with pytest.raises(TypeError):
        store.create(TASK_KEY, bad_config, heartbeat=False)

    assert list((store.base_dir / "running").iterdir()) == []
    assert list((store.base_dir / ".staging").iterdir()) == []


def test_create_refuses_an_incomplete_task_key_before_touching_the_disk(store: ContextStore) -> None:
    with pytest.raises(ValueError, match="task_id"):
        store.create({k: v for k, v in TASK_KEY.items() if k != "task_id"}, CONFIG)
    assert list((store.base_dir / "running").iterdir()) == []
    assert list((store.base_dir / ".staging").iterdir()) == []


def test_create_of_an_existing_uuid_raises_and_leaves_the_original_untouched(store: ContextStore) -> None:
    first = store.create(TASK_KEY, CONFIG, user="alice", heartbeat=False)
    first.append_message("user", "the task")
    before = {p.name: p.read_bytes() for p in first.path.iterdir() if p.is_file()}

    with pytest.raises(ContextExistsError):
        store.create(TASK_KEY, CONFIG, user="mallory", uuid=first.uuid, heartbeat=False)

    assert {p.name: p.read_bytes() for p in first.path.iterdir() if p.is_file()} == before
    assert list((store.base_dir / ".staging").iterdir()) == []


def test_create_of_a_completed_uuid_raises(store: ContextStore) -> None:
    done = store.create(TASK_KEY, CONFIG, heartbeat=False)
    done.finish("completed")
    with pytest.raises(ContextExistsError):
        store.create(TASK_KEY, CONFIG, uuid=done.uuid, heartbeat=False)
    assert store.running_uuids() == []


def test_an_observer_never_sees_a_half_created_context(store: ContextStore) -> None:
    running = store.base_dir / "running"
    incomplete: list[tuple[str, set[str]]] = []
    seen: set[str] = set()
    done = threading.Event()

    def observe() -> None:
        while not done.is_set():
            for entry in os.scandir(running):
                names = set(os.listdir(entry.path))
                seen.add(entry.name)
                if not names >= CONTEXT_FILES:
                    incomplete.append((entry.name, names))

    observer = threading.Thread(target=observe)
    observer.start()
    try:
        for _ in range(40):
            store.create(TASK_KEY, CONFIG, heartbeat=False)
    finally:
        done.set()
        observer.join()

    assert incomplete == []
    assert seen  # the observer did look at contexts while they were being created


@pytest.mark.parametrize("status", FINAL_STATUSES)
def test_finish_moves_the_context_to_completed_with_its_final_status_and_no_lock(
    store: ContextStore, status: str
) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "the task")
    error = None if status == "completed" else f"ended as {status}"

    path = ctx.finish(status, error=error, llm_call_count=3)

    assert path == store.base_dir / "completed" / ctx.uuid
    assert not (store.base_dir / "running" / ctx.uuid).exists()
    assert ".lock" not in os.listdir(path)
    state = json.loads((path / "state.json").read_text())
    assert (state["status"], state["error"], state["llm_call_count"]) == (status, error, 3)
    assert state["completed_at"] is not None
    assert validate_context_dir(path)["messages.jsonl"] == 1
    assert store.locate(ctx.uuid) == path
    assert store.completed_uuids() == [ctx.uuid]
    with pytest.raises(ContextError):
        ctx.append_message("assistant", "too late")


def test_finish_refuses_a_status_that_is_not_final(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    with pytest.raises(ValueError, match="final status"):
        ctx.finish("processing")
    assert store.running_uuids() == [ctx.uuid]


def test_open_of_a_completed_context_raises_context_completed(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.finish("failed", error="boom")
    with pytest.raises(ContextCompletedError):
        store.open(ctx.uuid)


def test_open_of_a_context_left_completing_raises_and_leaves_no_lock(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.update_state(status="completing")
    ctx.release()

    with pytest.raises(ContextCompletedError):
        store.open(ctx.uuid)
    assert store.read_lock(ctx.uuid) is None


def test_open_of_an_unknown_uuid_raises_context_not_found(store: ContextStore) -> None:
    with pytest.raises(ContextNotFoundError):
        store.open(str(uuid_module.uuid4()))
    with pytest.raises(ContextNotFoundError):
        store.locate(str(uuid_module.uuid4()))


@pytest.mark.parametrize(
    "text",
    [
        "../x",
        "..",
        "",
        "not-a-uuid",
        "../running/0b6a5c1e-7f7e-4c5a-9a39-2f5f6d7f0e11",
        "{0b6a5c1e-7f7e-4c5a-9a39-2f5f6d7f0e11}",
        "urn:uuid:0b6a5c1e-7f7e-4c5a-9a39-2f5f6d7f0e11",
        "0b6a5c1e7f7e4c5a9a392f5f6d7f0e11",
        "0b6a5c1e-7f7e-4c5a-9a39-2f5f6d7f0e11/../../etc",
    ],
)
def test_malformed_uuids_and_path_tricks_raise_invalid_uuid(store: ContextStore, text: str) -> None:
    with pytest.raises(InvalidUUIDError):
        validate_uuid(text)
    with pytest.raises(InvalidUUIDError):
        store.open(text)
    with pytest.raises(InvalidUUIDError):
        store.create(TASK_KEY, CONFIG, uuid=text or "x", heartbeat=False)
    assert list((store.base_dir / "running").iterdir()) == []


def test_open_of_a_held_context_raises_lock_held(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    other = ContextStore(store.base_dir, hostname="other-host")
    with pytest.raises(LockHeldError):
        other.open(ctx.uuid)
    assert store.is_held(ctx.uuid)


def test_release_then_open_resumes_with_the_next_attempt_and_seq(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "the task")
    ctx.append_tool("bash", {"command": "true"}, "success", 1)
    ctx.release()
    assert not store.is_held(ctx.uuid)
    assert store.read_lock(ctx.uuid) is None

    resumed = store.open(ctx.uuid, heartbeat=False)

    assert resumed.previous_holder is None  # a clean hand-back, not a takeover
    assert resumed.read_state()["attempt"] == 2
    assert resumed.append_message("assistant", "continuing") == 2
    assert resumed.append_tool("bash", {"command": "true"}, "success", 1) == 2
    assert validate_context_dir(resumed.path) == {"messages.jsonl": 2, "summaries.jsonl": 0, "tools.jsonl": 2}


def test_open_without_resume_keeps_the_attempt(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.release()
    again = store.open(ctx.uuid, resume=False, heartbeat=False)
    assert again.read_state()["attempt"] == 1


def test_is_held_is_false_once_the_holder_went_silent_on_another_host(store: ContextStore) -> None:
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.detach()
    later = ContextStore(store.base_dir, hostname="other-host", stale_after_s=60, clock=shifted_clock(61))
    assert store.is_held(ctx.uuid)
    assert not later.is_held(ctx.uuid)


def _hold_mutex(store: ContextStore, uuid: str) -> filelock.BaseFileLock:
    mutex = filelock.FileLock(str(store.base_dir / ".locks" / uuid), timeout=5)
    mutex.acquire()
    return mutex


def test_a_lock_taken_after_waiting_for_the_mutex_carries_the_time_it_was_written(tmp_path: Path) -> None:
    """A slow mutex wait must not produce a lock that is stale the moment it appears."""
    clock = Clock()
    store = ContextStore(tmp_path, hostname="b", stale_after_s=60, clock=clock)
    first = ContextStore(tmp_path, hostname="a", clock=clock).create(TASK_KEY, CONFIG, heartbeat=False)
    first.release()
    mutex = _hold_mutex(store, first.uuid)
    opener = threading.Thread(target=lambda: store.open(first.uuid, heartbeat=False))
    opener.start()
    wait_for(lambda: waiting_in(opener, "filelock"), what="open() to wait for the mutex")
    clock.advance(120)  # the wait for the mutex lasts longer than stale_after_s
    mutex.release()
    opener.join()

    lock = store.read_lock(first.uuid)
    assert lock is not None
    assert lock.heartbeat_at == clock.now
    with pytest.raises(LockHeldError):
        ContextStore(tmp_path, hostname="c", stale_after_s=60, clock=clock).open(first.uuid, heartbeat=False)


def test_a_context_created_after_waiting_for_the_mutex_is_not_born_stale(tmp_path: Path) -> None:
    clock = Clock()
    store = ContextStore(tmp_path, hostname="a", stale_after_s=60, clock=clock)
    wanted = str(uuid_module.uuid4())
    mutex = _hold_mutex(store, wanted)
    creator = threading.Thread(target=lambda: store.create(TASK_KEY, CONFIG, uuid=wanted, heartbeat=False))
    creator.start()
    wait_for(lambda: waiting_in(creator, "filelock"), what="create() to wait for the mutex")
    clock.advance(120)
    mutex.release()
    creator.join()

    lock = store.read_lock(wanted)
    assert lock is not None
    assert lock.heartbeat_at == clock.now
    with pytest.raises(LockHeldError):
        ContextStore(tmp_path, hostname="c", stale_after_s=60, clock=clock).open(wanted, heartbeat=False)


def test_an_open_racing_a_finish_leaves_no_lock_in_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving: the finisher drops its lock, an opener takes it, the finisher renames the directory."""
    import contexts.store

    ctx = ContextStore(tmp_path, hostname="finisher").create(TASK_KEY, CONFIG, heartbeat=False)
    opener_store = ContextStore(tmp_path, hostname="opener")
    opener_reading, renamed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def open_it() -> None:
        try:
            outcome.append(opener_store.open(ctx.uuid, heartbeat=False))
        except Exception as exc:  # the outcome is what the test is about
            outcome.append(exc)

    opener = threading.Thread(target=open_it)
    real_rename = os.rename

    def rename_after_the_opener_moved(src: object, dst: object) -> None:
        if Path(str(src)) == ctx.path:
            opener.start()
            wait_for(
                lambda: opener_reading.is_set() or waiting_in(opener, "filelock") or not opener.is_alive(),
                what="the opener to take the lock or to wait for the mutex",
            )
        real_rename(src, dst)  # type: ignore[arg-type]
        renamed.set()

    def read_state_after_the_rename(directory: Path) -> dict[str, object]:
        opener_reading.set()
        renamed.wait(10)
        return read_state(directory)

    monkeypatch.setattr(os, "rename", rename_after_the_opener_moved)
    monkeypatch.setattr(contexts.store, "read_state", read_state_after_the_rename)
    path = ctx.finish("completed")
    opener.join(10)

    assert len(outcome) == 1
    assert isinstance(outcome[0], ContextCompletedError), outcome
    assert ".lock" not in os.listdir(path)
    assert json.loads((path / "state.json").read_text())["status"] == "completed"
    validate_context_dir(path)


def test_create_that_cannot_get_the_mutex_raises_lock_held_and_leaves_nothing(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contexts.lock

    monkeypatch.setattr(contexts.lock, "MUTEX_TIMEOUT_S", 0.05)
    wanted = str(uuid_module.uuid4())
    mutex = _hold_mutex(store, wanted)
    try:
        with pytest.raises(LockHeldError):
            store.create(TASK_KEY, CONFIG, uuid=wanted, heartbeat=False)
    finally:
        mutex.release()
    assert list((store.base_dir / "running").iterdir()) == []
    assert list((store.base_dir / ".staging").iterdir()) == []
    assert store.create(TASK_KEY, CONFIG, uuid=wanted, heartbeat=False).uuid == wanted
