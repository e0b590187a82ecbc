"""The monitor on real context directories and real Redis: finding lost tasks, resuming or failing them once,
and every repair of an interrupted completion (SPEC §3 rule 9, §7)."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore
from contexts.clock import iso, utc_now
from contexts.lock import LockInfo
from contexts.state import read_state, update_state
from scheduler.monitor import Monitor, Outcome
from scheduler.plan import Policy, plan
from tests.helpers.context_support import CONFIG, TASK_KEY, wait_for
from worker.names import HEARTBEATS_KEY, TASKS_QUEUE

STALE_S = 3
LONG_AGO = timedelta(minutes=10)
REQUEST = {"task_key": TASK_KEY, "repo_path": "/nowhere", "prompt": "fix it"}
SENT_KEY = "tasuki:test:sent"
FORGOTTEN_KEY = "tasuki:test:forgotten"


@dataclass
class Fleet:
    """Contexts under ``base`` and a way to build monitors on them (recording what they send and forget)."""

    base: Path
    redis_url: str
    client: redis.Redis
    sent: list[str] = field(default_factory=list)

    def lost(self, *, attempt: int = 1, status: str = "processing", indexed: bool = True, **state: Any) -> str:
        """A context whose holder, on another host, stopped heartbeating ten minutes ago."""
        ghost = ContextStore(self.base, hostname="ghost-host", clock=lambda: utc_now() - LONG_AGO)
        ctx = ghost.create(TASK_KEY, CONFIG, heartbeat=False, extra_metadata={"request": REQUEST})
        ctx.append_message("user", "the task")
        ctx.update_state(status=status, attempt=attempt, **state)
        ctx.detach()
        if indexed:
            self.client.zadd(HEARTBEATS_KEY, {ctx.uuid: (utc_now() - LONG_AGO).timestamp()})
        return ctx.uuid

    def finished(self) -> str:
        """A context that completed normally (an old one, so its updates are quiet)."""
        old = ContextStore(self.base, clock=lambda: utc_now() - LONG_AGO)
        ctx = old.create(TASK_KEY, CONFIG, heartbeat=False)
        ctx.append_message("user", "the task")
        ctx.append_message("assistant", "done")
        ctx.finish("completed")
        return ctx.uuid

    def monitor(
        self, *, resume: bool = True, max_attempts: int = 3, shift_s: float = 0, dedupe_s: int = 300
    ) -> Monitor:
        clock = lambda: utc_now() + timedelta(seconds=shift_s)  # noqa: E731 - a one-line clock
        store = ContextStore(self.base, heartbeat_interval_s=1, stale_after_s=STALE_S, clock=clock)
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        policy = Policy(stale_after_s=STALE_S, max_attempts=max_attempts, resume=resume, hostname=store.hostname)
        return Monitor(
            store,
            client,
            policy,
            send=lambda uuid, request: client.rpush(SENT_KEY, json.dumps([uuid, request])) and None,
            ended=lambda uuid, task_key, status: client.rpush(FORGOTTEN_KEY, f"{uuid} {status}") and None,
            dedupe_s=dedupe_s,
        )

    def reap(self, **kwargs: Any) -> list[Outcome]:
        deep = kwargs.pop("deep", False)
        shift_s = kwargs.get("shift_s", 0)
        return self.monitor(**kwargs).run(utc_now() + timedelta(seconds=shift_s), deep=deep)

    def sent_uuids(self) -> list[str]:
        return [json.loads(item)[0] for item in self.client.lrange(SENT_KEY, 0, -1)]

    def state(self, where: str, uuid: str) -> dict[str, Any]:
        return read_state(self.base / where / uuid)


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Fleet:
    return Fleet(tmp_path / "contexts", redis_url, redis_client)


def done(outcomes: list[Outcome]) -> list[tuple[str, str]]:
    return [(o.action.uuid, o.action.repair or o.action.kind) for o in outcomes if o.done]


# -- resume and fail -----------------------------------------------------------------------------------


def test_lost_task_is_reenqueued_with_its_uuid_and_recorded_request(fleet: Fleet) -> None:
    uuid = fleet.lost(attempt=1)
    assert done(fleet.reap()) == [(uuid, "resume")]
    [item] = fleet.client.lrange(SENT_KEY, 0, -1)
    assert json.loads(item) == [uuid, REQUEST]
    assert fleet.state("running", uuid)["status"] == "processing"  # the next holder resumes it; nothing written


def test_a_second_monitor_run_does_not_reenqueue_the_same_attempt(fleet: Fleet) -> None:
    uuid = fleet.lost()
    fleet.reap()
    second = fleet.reap()
    assert done(second) == []
    assert [o.detail for o in second] == ["already re-enqueued"]
    assert fleet.sent_uuids() == [uuid]


def test_a_delivery_nobody_took_up_is_sent_again_once_the_guard_expires(fleet: Fleet) -> None:
    """A resume whose delivery was dropped, lost or never consumed: the monitor does not give up silently."""
    uuid = fleet.lost()
    fleet.reap(dedupe_s=1)
    assert [o.detail for o in fleet.reap(dedupe_s=1)] == ["already re-enqueued"]  # within the guard: once

    again = wait_for(lambda: done(fleet.reap(dedupe_s=1)) or None, timeout=10, what="the guard to expire")

    assert again == [(uuid, "resume")]
    assert fleet.sent_uuids() == [uuid, uuid]


def test_a_task_whose_deliveries_are_never_taken_up_ends_failed_after_max_attempts(fleet: Fleet) -> None:
    uuid = fleet.lost()

    def reaped_to_the_end() -> bool | None:
        fleet.reap(dedupe_s=1, max_attempts=3)
        return (fleet.base / "completed" / uuid).is_dir() or None

    wait_for(reaped_to_the_end, timeout=20, what="the monitor to give up")
    assert fleet.sent_uuids() == [uuid] * 3
    state = fleet.state("completed", uuid)
    assert state["status"] == "failed"
    assert state["error"].endswith("3 re-enqueued deliveries were not taken up")


def test_task_lost_at_max_attempts_is_failed_with_the_error_and_moved_to_completed(fleet: Fleet) -> None:
    uuid = fleet.lost(attempt=3)
    assert done(fleet.reap()) == [(uuid, "fail")]
    state = fleet.state("completed", uuid)
    assert state["status"] == "failed"
    assert state["error"].startswith("worker lost: heartbeat stale since ")
    assert not (fleet.base / "running" / uuid).exists()
    assert not (fleet.base / "completed" / uuid / ".lock").exists()
    assert fleet.client.lrange(FORGOTTEN_KEY, 0, -1) == [f"{uuid} failed"]  # task key freed, unindexed, counted
    assert fleet.sent_uuids() == []


def test_resume_off_fails_every_lost_task(fleet: Fleet) -> None:
    uuid = fleet.lost(attempt=1)
    assert done(fleet.reap(resume=False)) == [(uuid, "fail")]
    assert fleet.state("completed", uuid)["status"] == "failed"


def test_cancel_requested_lost_task_is_failed_not_resumed(fleet: Fleet) -> None:
    uuid = fleet.lost(cancel_requested=True)
    assert done(fleet.reap()) == [(uuid, "fail")]


def test_context_missing_from_the_index_is_found_by_the_running_scan(fleet: Fleet) -> None:
    uuid = fleet.lost(indexed=False)  # e.g. Redis restarted and lost the sorted set
    assert done(fleet.reap()) == [(uuid, "resume")]


def test_fresh_index_entries_are_not_read_at_all(fleet: Fleet) -> None:
    uuid = fleet.lost(indexed=False)
    fleet.client.zadd(HEARTBEATS_KEY, {uuid: utc_now().timestamp()})  # the index says: alive
    assert fleet.monitor().observe(utc_now()) == []


def test_live_holder_process_is_never_touched(fleet: Fleet, tmp_path: Path) -> None:
    uuid = "5d0c6a1e-8b8f-4c53-9a43-7f3f2d2b1a10"
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.context_holder", str(fleet.base), uuid, "1"],
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        wait_for(
            lambda: (
                (fleet.base / "running" / uuid / "messages.jsonl").stat().st_size
                if (fleet.base / "running" / uuid / "messages.jsonl").exists()
                else 0
            ),
            what="holder ready",
        )
        fleet.client.zadd(HEARTBEATS_KEY, {uuid: 0})  # the index claims it is ancient
        outcomes = fleet.reap(resume=False, shift_s=600)  # and the monitor's clock is ten minutes ahead
        assert [(o.action.kind, o.done) for o in outcomes] == [("skip", False)]
        assert (fleet.base / "running" / uuid / ".lock").exists()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert done(fleet.reap(resume=False, shift_s=600)) == [(uuid, "fail")]  # dead: now it is stale
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_resume_is_dropped_when_someone_took_the_context_over_meanwhile(fleet: Fleet) -> None:
    uuid = fleet.lost()
    monitor = fleet.monitor()
    now = utc_now()
    [action] = plan(monitor.observe(now), now, monitor.policy)
    ContextStore(fleet.base, stale_after_s=STALE_S).open(uuid, heartbeat=False).detach()  # a worker took it
    outcome = monitor.carry_out(action, now)
    assert (outcome.done, outcome.detail) == (False, "taken over meanwhile")


def _reap_in_process(base: str, redis_url: str, barrier: Any, results: Any) -> None:
    fleet = Fleet(Path(base), redis_url, redis.Redis.from_url(redis_url, decode_responses=True))
    monitor = fleet.monitor()
    now = utc_now()
    barrier.wait(timeout=30)
    results.put(done(monitor.run(now)))


def test_two_monitors_at_once_take_one_action_per_stale_context(fleet: Fleet) -> None:
    to_resume = [fleet.lost(attempt=1) for _ in range(4)]
    to_fail = [fleet.lost(attempt=3) for _ in range(4)]
    # Spawned, not forked: a fork of this process would inherit (and, closing them, hang on) the Redis
    # connections that earlier tests' Celery clients left open.
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(3), context.Queue()
    workers = [
        context.Process(target=_reap_in_process, args=(str(fleet.base), fleet.redis_url, barrier, results))
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    actions = [action for _ in workers for action in results.get(timeout=60)]
    for worker in workers:
        worker.join(timeout=30)
    assert sorted(actions) == sorted([(u, "resume") for u in to_resume] + [(u, "fail") for u in to_fail])
    assert sorted(fleet.sent_uuids()) == sorted(to_resume)
    assert all(fleet.state("completed", u)["status"] == "failed" for u in to_fail)


# -- repairs -------------------------------------------------------------------------------------------


def _back_date(directory: Path, **fields: Any) -> None:
    update_state(directory, utc_now() - LONG_AGO, fsync=False, set_fields=fields)


def _stale_lock(directory: Path) -> None:
    at = utc_now() - LONG_AGO
    info = LockInfo(process_id=99999, hostname="ghost-host", acquired_at=at, heartbeat_at=at, owner="old")
    (directory / ".lock").write_text(json.dumps(info.to_json()))


def test_completed_context_still_completing_gets_the_status_its_holder_chose(fleet: Fleet) -> None:
    uuid = fleet.finished()
    _back_date(fleet.base / "completed" / uuid, status="completing", final_status="timeout", error="soft limit")
    fleet.client.zadd(HEARTBEATS_KEY, {uuid: 0})  # the crash came before the worker unindexed it
    assert done(fleet.reap()) == [(uuid, "finish_status")]
    assert fleet.state("completed", uuid)["status"] == "timeout"
    assert fleet.client.lrange(FORGOTTEN_KEY, 0, -1) == [f"{uuid} timeout"]


def test_completed_context_left_completing_without_index_entry_is_found_by_a_deep_pass(fleet: Fleet) -> None:
    uuid = fleet.finished()
    _back_date(fleet.base / "completed" / uuid, status="completing", final_status="completed")
    assert done(fleet.reap()) == []  # the frequent pass reads only what the index and running/ point at
    assert done(fleet.reap(deep=True)) == [(uuid, "finish_status")]
    assert fleet.state("completed", uuid)["status"] == "completed"


def test_leftover_lock_in_completed_is_removed(fleet: Fleet) -> None:
    uuid = fleet.finished()
    _stale_lock(fleet.base / "completed" / uuid)
    assert done(fleet.reap(deep=True)) == [(uuid, "remove_completed_lock")]
    assert not (fleet.base / "completed" / uuid / ".lock").exists()


def test_running_context_stopped_in_completing_is_moved_to_completed(fleet: Fleet) -> None:
    uuid = fleet.lost()
    running = fleet.base / "running" / uuid
    _back_date(running, status="completing", final_status="completed", completed_at=iso(utc_now()))
    (running / ".lock").unlink()  # the crash came after the lock was removed, before the rename
    assert done(fleet.reap()) == [(uuid, "finish_move")]
    assert fleet.state("completed", uuid)["status"] == "completed"
    assert not running.exists()


def test_running_context_stopped_in_completing_with_its_dead_lock_is_moved_too(fleet: Fleet) -> None:
    uuid = fleet.lost()
    _back_date(fleet.base / "running" / uuid, status="completing", final_status="failed", error="x")
    assert done(fleet.reap()) == [(uuid, "finish_move")]
    assert fleet.state("completed", uuid)["status"] == "failed"
    assert not (fleet.base / "completed" / uuid / ".lock").exists()


def test_context_in_both_places_keeps_completed_and_drops_an_identical_running_copy(fleet: Fleet) -> None:
    uuid = fleet.finished()
    running = fleet.base / "running" / uuid
    shutil.copytree(fleet.base / "completed" / uuid, running)
    _back_date(running, status="processing")
    _stale_lock(running)
    assert done(fleet.reap()) == [(uuid, "drop_running_copy")]
    assert not running.exists()
    assert fleet.state("completed", uuid)["status"] == "completed"


def test_context_in_both_places_keeps_both_when_the_running_copy_has_more_records(fleet: Fleet) -> None:
    uuid = fleet.finished()
    running = fleet.base / "running" / uuid
    shutil.copytree(fleet.base / "completed" / uuid, running)
    with open(running / "messages.jsonl", "a") as extra:
        extra.write(json.dumps({"seq": 3, "role": "assistant", "content": "only here"}) + "\n")
    _back_date(running, status="processing")
    outcomes = fleet.reap()
    assert done(outcomes) == []
    assert "conflict" in outcomes[0].detail
    assert running.exists()
    assert (fleet.base / "completed" / uuid).exists()


def test_index_entry_of_a_finished_or_vanished_context_is_removed(fleet: Fleet) -> None:
    uuid = fleet.finished()
    _back_date(fleet.base / "completed" / uuid)  # its finisher died before unindexing it, a while ago
    gone = "0e4a3c5b-1d2e-4f60-8a7b-9c0d1e2f3a4b"
    fleet.client.zadd(HEARTBEATS_KEY, {uuid: 0, gone: 0})
    assert sorted(done(fleet.reap())) == sorted([(uuid, "unindex"), (gone, "unindex")])
    assert fleet.client.zcard(HEARTBEATS_KEY) == 0


def test_dry_run_changes_nothing(fleet: Fleet) -> None:
    lost, failing = fleet.lost(), fleet.lost(attempt=3)
    outcomes = fleet.monitor().run(utc_now(), dry_run=True)
    assert sorted((o.action.uuid, o.action.kind) for o in outcomes) == sorted([(lost, "resume"), (failing, "fail")])
    assert fleet.sent_uuids() == []
    assert (fleet.base / "running" / failing).exists()


# -- damaged contexts ------------------------------------------------------------------------------------


def _set_state_field(fleet: Fleet, uuid: str, **fields: Any) -> None:
    path = fleet.base / "running" / uuid / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _lock_with_null_pid(fleet: Fleet, uuid: str) -> None:
    lock = LockInfo(1, "ghost-host", utc_now() - LONG_AGO, utc_now() - LONG_AGO, "owner").to_json()
    (fleet.base / "running" / uuid / ".lock").write_text(json.dumps({**lock, "process_id": None}))


@pytest.mark.parametrize(
    "damage",
    [
        lambda fleet, uuid: _set_state_field(fleet, uuid, attempt=None),
        lambda fleet, uuid: _set_state_field(fleet, uuid, updated_at=None),
        lambda fleet, uuid: _set_state_field(fleet, uuid, attempt=1e999),
        _lock_with_null_pid,
    ],
    ids=["attempt-null", "updated_at-null", "attempt-infinite", "lock-process_id-null"],
)
def test_a_damaged_running_context_is_reported_and_skipped_while_the_pass_resumes_the_others(
    fleet: Fleet, damage: Any
) -> None:
    lost = fleet.lost()
    damaged = fleet.lost()
    damage(fleet, damaged)

    outcomes = fleet.reap()

    assert done(outcomes) == [(lost, "resume")]
    [skipped] = [o for o in outcomes if o.action.uuid == damaged]
    assert skipped.action.kind == "skip"
    assert skipped.action.reason.startswith("unreadable: ")


def test_while_a_delivery_waits_in_the_tasks_queue_the_monitor_neither_sends_again_nor_gives_up(fleet: Fleet) -> None:
    """Every worker stopped a while (a rolling restart): the re-enqueued delivery waits in the queue, untaken; the
    monitor does not count it as refused, and the task is not failed however long the wait."""
    uuid = fleet.lost()
    fleet.reap(dedupe_s=1, max_attempts=3)
    assert fleet.sent_uuids() == [uuid]
    fleet.client.rpush(TASKS_QUEUE, "a delivery no worker has taken yet")
    try:
        for _ in range(6):  # twice max_attempts passes, each after the re-enqueue guard would have expired
            outcomes = fleet.reap(dedupe_s=1, max_attempts=3)
            assert [o.detail for o in outcomes] == ["a delivery is waiting in the tasks queue"]
        assert fleet.sent_uuids() == [uuid]
        assert (fleet.base / "running" / uuid).is_dir()
    finally:
        fleet.client.delete(TASKS_QUEUE)
    # The queue drained and still nobody took it up: counted again from where it was.
    wait_for(lambda: (fleet.reap(dedupe_s=1, max_attempts=3), (fleet.base / "completed" / uuid).is_dir())[1] or None,
             timeout=30, what="the monitor to give up")  # fmt: skip
    assert fleet.sent_uuids() == [uuid] * 3
