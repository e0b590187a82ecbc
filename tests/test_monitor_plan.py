"""The monitor's decisions (scheduler.plan): a pure function of what it saw and ``now`` — no sleeps, no files."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from contexts.lock import LockInfo
from scheduler.plan import Copy, Policy, Seen, plan

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HOST = "monitor-host"
POLICY = Policy(stale_after_s=60, max_attempts=3, resume=True, hostname=HOST)
UUID = "9b2f7c4e-3f0a-4f5e-9d7c-2a1b3c4d5e6f"


def lock(age_s: float, host: str = "other-host", owner: str = "tok") -> LockInfo:
    at = NOW - timedelta(seconds=age_s)
    return LockInfo(process_id=4242, hostname=host, acquired_at=at, heartbeat_at=at, owner=owner)


def running(age_s: float = 120, status: str = "processing", **fields: object) -> Copy:
    defaults: dict[str, object] = {"lock": lock(age_s), "updated_at": NOW - timedelta(seconds=age_s)}
    defaults.update(fields)
    return Copy(status=status, **defaults)  # type: ignore[arg-type]


def kinds(seen: Seen, policy: Policy = POLICY) -> list[str]:
    return [a.repair or a.kind for a in plan([seen], NOW, policy)]


def test_stale_context_below_max_attempts_is_resumed_with_its_lock_owner_and_attempt() -> None:
    [action] = plan([Seen(UUID, running=running(attempt=2), indexed=True)], NOW, POLICY)
    assert (action.kind, action.attempt, action.owner) == ("resume", 2, "tok")
    assert "attempt 2 of 3" in action.reason


def test_stale_context_at_max_attempts_fails_with_the_worker_lost_error() -> None:
    [action] = plan([Seen(UUID, running=running(attempt=3), indexed=True)], NOW, POLICY)
    assert action.kind == "fail"
    assert action.error == "worker lost: heartbeat stale since 2026-01-01T11:58:00.000000Z"


def test_resume_off_fails_at_once_as_seed_001_does() -> None:
    policy = Policy(stale_after_s=60, max_attempts=3, resume=False, hostname=HOST)
    [action] = plan([Seen(UUID, running=running(attempt=1))], NOW, policy)
    assert action.kind == "fail"
    assert "monitor.resume is off" in action.reason


def test_cancel_requested_context_is_failed_not_resumed() -> None:
    [action] = plan([Seen(UUID, running=running(cancel_requested=True))], NOW, POLICY)
    assert (action.kind, action.reason.endswith("cancel requested")) == ("fail", True)


def test_fresh_heartbeat_is_a_live_holder_and_is_skipped() -> None:
    assert kinds(Seen(UUID, running=running(age_s=10), indexed=True)) == ["skip"]


def test_old_heartbeat_of_a_process_alive_on_this_host_is_never_touched() -> None:
    copy = running(age_s=600, lock=lock(600, host=HOST), holder_alive=True)
    assert kinds(Seen(UUID, running=copy)) == ["skip"]


def test_old_heartbeat_of_a_dead_process_on_this_host_is_stale() -> None:
    copy = running(age_s=600, lock=lock(600, host=HOST), holder_alive=False)
    assert kinds(Seen(UUID, running=copy)) == ["resume"]


def test_running_context_without_a_lock_is_left_alone_while_recently_active() -> None:
    assert kinds(Seen(UUID, running=running(age_s=5, lock=None))) == ["skip"]


def test_running_context_without_a_lock_and_quiet_is_resumed() -> None:
    assert kinds(Seen(UUID, running=running(age_s=300, lock=None))) == ["resume"]


def test_running_context_stuck_in_completing_is_moved_once_quiet() -> None:
    assert kinds(Seen(UUID, running=running(status="completing", lock=None))) == ["finish_move"]
    assert kinds(Seen(UUID, running=running(status="completing"))) == ["finish_move"]  # with its dead lock
    assert kinds(Seen(UUID, running=running(age_s=5, status="completing", lock=None))) == ["skip"]


def test_completed_copy_still_completing_gets_its_final_status_and_leaves_the_index() -> None:
    completed = Copy(status="completing", updated_at=NOW - timedelta(minutes=5), final_status="cancelled")
    [action] = plan([Seen(UUID, completed=completed, indexed=True)], NOW, POLICY)
    assert (action.repair, action.reason.endswith("becomes cancelled")) == ("finish_status", True)


def test_completed_copy_without_recorded_final_status_becomes_failed_if_it_has_an_error() -> None:
    completed = Copy(status="completing", updated_at=NOW - timedelta(minutes=5), error="boom")
    [action] = plan([Seen(UUID, completed=completed)], NOW, POLICY)
    assert action.reason.endswith("becomes failed")


def test_leftover_lock_in_completed_is_removed_unless_live() -> None:
    stale = Copy(status="completed", updated_at=NOW, lock=lock(600))
    live = Copy(status="completed", updated_at=NOW, lock=lock(1))
    assert kinds(Seen(UUID, completed=stale)) == ["remove_completed_lock"]
    assert kinds(Seen(UUID, completed=live)) == ["skip"]


def test_context_in_both_places_drops_the_running_copy_unless_it_is_held() -> None:
    completed = Copy(status="completed", updated_at=NOW)
    assert kinds(Seen(UUID, running=running(), completed=completed)) == ["drop_running_copy"]
    assert kinds(Seen(UUID, running=running(age_s=1), completed=completed)) == ["skip"]


def test_finished_context_left_in_the_index_is_unindexed_and_a_vanished_one_too() -> None:
    long_ago = NOW - timedelta(seconds=POLICY.stale_after_s + 1)
    assert kinds(Seen(UUID, completed=Copy(status="completed", updated_at=long_ago), indexed=True)) == ["unindex"]
    # Finished moments ago: its finisher (a worker, or another monitor that just failed it) is about to unindex it.
    assert kinds(Seen(UUID, completed=Copy(status="failed", updated_at=NOW), indexed=True)) == ["skip"]
    assert kinds(Seen(UUID, indexed=True)) == ["unindex"]
    assert kinds(Seen(UUID, completed=Copy(status="completed", updated_at=NOW))) == []  # deep scan: healthy


def test_unreadable_context_is_reported_and_never_acted_on() -> None:
    assert kinds(Seen(UUID, unreadable="bad json", indexed=True)) == ["skip"]


def test_attempts_handed_back_on_a_warm_shutdown_do_not_count_towards_max_attempts() -> None:
    # Two rolling restarts handed the task back; then its third worker was lost: one lost attempt of three.
    [action] = plan([Seen(UUID, running=running(attempt=3, handbacks=2), indexed=True)], NOW, POLICY)
    assert action.kind == "resume"
    [action] = plan([Seen(UUID, running=running(attempt=5, handbacks=2), indexed=True)], NOW, POLICY)
    assert action.kind == "fail"


# -- fleet mode: another host's context, as the durable copy has it (its lease for a lock) ------------------


def elsewhere(live: bool, age_s: float = 120, status: str = "processing") -> Copy:
    return Copy(status=status, updated_at=NOW - timedelta(seconds=age_s), lease_live=live, lease_owner="h1:7#3")


def test_another_hosts_context_whose_lease_lives_is_skipped_however_old_its_last_step() -> None:
    [action] = plan([Seen(UUID, running=elsewhere(live=True, age_s=3600), indexed=True)], NOW, POLICY)
    assert (action.kind, action.reason) == ("skip", "held by a live worker (lease h1:7#3)")


def test_another_hosts_context_whose_lease_ran_out_is_resumed_with_the_leases_owner() -> None:
    [action] = plan([Seen(UUID, running=elsewhere(live=False), indexed=True)], NOW, POLICY)
    assert (action.kind, action.owner) == ("resume", "h1:7#3")


def test_another_hosts_interrupted_completion_is_not_repaired_from_here() -> None:
    assert kinds(Seen(UUID, running=elsewhere(live=False, status="completing"), indexed=True)) == ["skip"]
