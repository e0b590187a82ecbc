"""The ``.lock``: staleness as a pure function, heartbeats, takeover of a killed holder, fencing (SPEC §4)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid as uuid_module
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contexts import Context, ContextStore, FencedError, LockHeldError, LockInfo, is_stale
from contexts.compression import CompressionPolicy
from contexts.lock import (
    Incarnation,
    heartbeat_age_s,
    holder_alive,
    incarnation_of,
    is_hung,
    process_alive,
    stop_hung_holder,
)
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
    shifted_clock,
    wait_for,
)
from tests.helpers.schemas import validate_context_dir, validate_record

REPO_ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2025, 6, 1, 9, 30, tzinfo=UTC)
HERE = "host-a"


def lock_info(age_s: float, hostname: str = HERE, pid: int = 4242) -> LockInfo:
    beat = NOW - timedelta(seconds=age_s)
    return LockInfo(pid, hostname, beat - timedelta(seconds=5), beat, "owner-token")


@pytest.mark.parametrize(
    ("age_s", "hostname", "alive", "stale"),
    [
        pytest.param(5, HERE, True, False, id="fresh, alive, same host"),
        pytest.param(5, HERE, False, False, id="fresh, dead pid, same host: the heartbeat still counts"),
        pytest.param(5, "host-b", False, False, id="fresh, other host"),
        pytest.param(60, HERE, False, False, id="exactly stale_after_s old is not older than it"),
        pytest.param(61, HERE, False, True, id="old, dead pid, same host"),
        pytest.param(3600, HERE, True, False, id="old, alive pid, same host: a slow holder is not robbed"),
        pytest.param(61, "host-b", True, True, id="old, other host: kill -0 means nothing there"),
        pytest.param(61, "host-b", False, True, id="old, other host, pid unknown"),
    ],
)
def test_is_stale_is_a_pure_function_of_the_lock_now_and_liveness(
    age_s: float, hostname: str, alive: bool, stale: bool
) -> None:
    lock = lock_info(age_s, hostname)
    assert is_stale(lock, NOW, 60, HERE, alive) is stale
    assert heartbeat_age_s(lock, NOW) == age_s


def test_lock_info_round_trips_through_json_and_matches_the_schema() -> None:
    info = LockInfo(os.getpid(), "host-a", NOW, NOW + timedelta(seconds=30), "abc")
    data = info.to_json()
    validate_record("lock", data)
    assert LockInfo.from_json(data) == info
    assert info.worker == f"host-a:{os.getpid()}"


def test_process_alive_answers_kill_zero() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_alive(os.getpid())
    assert not process_alive(child.pid)  # reaped: the pid is gone
    assert not process_alive(0)
    assert not process_alive(-1)


def test_the_heartbeat_refreshes_lock_state_and_hook(tmp_path: Path) -> None:
    beats: list[str] = []
    store = ContextStore(
        tmp_path, heartbeat_interval_s=0.02, fsync="never", on_heartbeat=lambda uuid, _now, _status: beats.append(uuid)
    )
    ctx = store.create(TASK_KEY, CONFIG)
    first = store.read_lock(ctx.uuid)
    created_state = ctx.read_state()["updated_at"]
    assert first is not None

    def refreshed() -> bool:
        lock = store.read_lock(ctx.uuid)
        return lock is not None and lock.heartbeat_at > first.heartbeat_at

    wait_for(refreshed, what="heartbeat_at to move")
    wait_for(lambda: ctx.read_state()["updated_at"] > created_state, what="state.updated_at to move")
    wait_for(lambda: len(beats) >= 3, what="the heartbeat hook")
    lock = store.read_lock(ctx.uuid)
    assert lock is not None
    assert (lock.acquired_at, lock.owner) == (first.acquired_at, first.owner)
    assert set(beats) == {ctx.uuid}
    ctx.release()
    validate_context_dir(ctx.path)


def test_a_failing_heartbeat_hook_does_not_stop_the_heartbeat(tmp_path: Path) -> None:
    calls: list[datetime] = []

    def flaky_hook(_uuid: str, now: datetime, _status: str) -> None:
        calls.append(now)
        if len(calls) > 1:
            raise ConnectionError("redis blip")

    store = ContextStore(tmp_path, heartbeat_interval_s=0.02, fsync="never", on_heartbeat=flaky_hook)
    ctx = store.create(TASK_KEY, CONFIG)
    wait_for(lambda: len(calls) >= 5, what="heartbeats after the hook failed")
    assert not ctx.fenced
    assert ctx.append_message("user", "still writing") == 1
    ctx.release()


def test_a_live_holder_on_the_same_host_is_never_taken_over_however_old_its_heartbeat(tmp_path: Path) -> None:
    ctx = ContextStore(tmp_path, hostname="host-a").create(TASK_KEY, CONFIG, heartbeat=False)
    much_later = ContextStore(tmp_path, hostname="host-a", stale_after_s=60, clock=shifted_clock(3600))
    with pytest.raises(LockHeldError):
        much_later.open(ctx.uuid)
    assert much_later.is_held(ctx.uuid)
    elsewhere = ContextStore(tmp_path, hostname="host-b", stale_after_s=60, clock=shifted_clock(3600))
    taken = elsewhere.open(ctx.uuid, heartbeat=False)
    assert taken.previous_holder is not None
    assert taken.previous_holder.owner == ctx._lock.owner
    assert store_lock_owner(elsewhere, ctx.uuid) == taken._lock.owner


def store_lock_owner(store: ContextStore, uuid: str) -> str:
    lock = store.read_lock(uuid)
    assert lock is not None
    return lock.owner


def opened_unless_held(store: ContextStore, uuid: str) -> Context | None:
    """The context, opened (taken over), or None while a live holder still has it."""
    try:
        return store.open(uuid)
    except LockHeldError:
        return None


def test_a_holder_killed_with_sigkill_is_taken_over_after_stale_after_s(tmp_path: Path) -> None:
    uuid = str(uuid_module.uuid4())
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.context_holder", str(tmp_path), uuid, "0.02"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    store = ContextStore(tmp_path, stale_after_s=0.5, heartbeat_interval_s=0.05, fsync="never")
    try:

        def holder_ready() -> LockInfo | None:
            if holder.poll() is not None:
                raise AssertionError(f"holder exited early: {holder.stderr.read().decode()}")  # type: ignore[union-attr]
            path = tmp_path / "running" / uuid / "messages.jsonl"
            return store.read_lock(uuid) if path.exists() and path.stat().st_size else None

        first = wait_for(holder_ready, timeout=30, what="the holder process to create the context")
        assert (first.process_id, first.hostname) == (holder.pid, store.hostname)
        wait_for(
            lambda: store.read_lock(uuid).heartbeat_at > first.heartbeat_at,  # type: ignore[union-attr]
            what="the holder's heartbeat",
        )
        with pytest.raises(LockHeldError):
            store.open(uuid)
    finally:
        # Nothing is asserted between the kill and the reaping: the process is dying, and whether kill -0 still
        # finds it (a zombie counts as dead for the lock) depends on how far the kernel got.
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stderr.close()  # type: ignore[union-attr]
    assert holder.returncode == -signal.SIGKILL
    assert not process_alive(holder.pid)

    ctx = wait_for(lambda: opened_unless_held(store, uuid), timeout=15, what="the stale lock to be taken over")
    assert ctx.previous_holder is not None
    assert ctx.previous_holder.process_id == holder.pid
    state = ctx.read_state()
    assert state["attempt"] == 2
    assert state["worker"] == f"{store.hostname}:{os.getpid()}"
    assert ctx.append_message("assistant", "picked up the baton") == 2
    ctx.release()
    assert validate_context_dir(ctx.path)["messages.jsonl"] == 2


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file() and p.name != ".state.lock"}


def test_a_holder_whose_lock_was_taken_over_is_fenced_and_writes_nothing_more(tmp_path: Path) -> None:
    a = ContextStore(tmp_path, hostname="a", heartbeat_interval_s=0.02, stale_after_s=0.2, fsync="never")
    b = ContextStore(tmp_path, hostname="b", heartbeat_interval_s=30, stale_after_s=0.2, fsync="never")
    holder_a = a.create(TASK_KEY, CONFIG)
    holder_a.append_message("user", "the task")
    holder_a.append_message("assistant", "working on it")
    assert holder_a._heartbeat is not None
    holder_a._heartbeat.stop()  # A stalls: no more heartbeats, but it still believes it holds the lock

    def take_over() -> Context | None:
        try:
            return b.open(holder_a.uuid, heartbeat=False)
        except LockHeldError:
            return None

    holder_b = wait_for(take_over, what="B to take the stale lock over")
    assert holder_b.read_state()["attempt"] == 2
    before = files_of(holder_a.path)

    with pytest.raises(FencedError):
        holder_a.append_message("assistant", "a write after losing the lock")
    assert holder_a.fenced
    with pytest.raises(FencedError):
        holder_a.append_tool("bash", {"command": "rm -rf /"}, "success", 1)
    with pytest.raises(FencedError):
        holder_a.update_state(status="processing")
    with pytest.raises(FencedError):
        holder_a.beat()
    with pytest.raises(FencedError):
        holder_a.compress(lambda _prev, _span: "s", CompressionPolicy(keep_recent=0))
    with pytest.raises(FencedError):
        holder_a.finish("completed")
    holder_a.release()  # must not remove B's lock

    assert files_of(holder_a.path) == before
    assert store_lock_owner(b, holder_a.uuid) == holder_b._lock.owner
    assert holder_b.append_message("assistant", "B carries on") == 3
    holder_b.finish("completed")
    validate_context_dir(tmp_path / "completed" / holder_a.uuid)


def test_the_heartbeat_thread_notices_a_takeover_and_stops(tmp_path: Path) -> None:
    a = ContextStore(tmp_path, hostname="a", heartbeat_interval_s=0.02, fsync="never")
    holder_a = a.create(TASK_KEY, CONFIG)
    thief = ContextStore(tmp_path, hostname="b", stale_after_s=60, clock=shifted_clock(120))
    holder_b = thief.open(holder_a.uuid, heartbeat=False)  # as if A had been silent for two minutes

    wait_for(lambda: holder_a.fenced, what="A's heartbeat to notice the takeover")
    assert holder_a._heartbeat is not None
    wait_for(lambda: not holder_a._heartbeat.is_alive(), what="A's heartbeat thread to end")  # type: ignore[union-attr]
    assert store_lock_owner(thief, holder_a.uuid) == holder_b._lock.owner
    with pytest.raises(FencedError):
        holder_a.append_message("assistant", "too late")
    assert holder_b.messages() == []


# -- liveness across PID namespaces (SPEC §4) -------------------------------------------------------------


def _aged_lock(pid: int, incarnation: Incarnation | None, hostname: str) -> LockInfo:
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    return LockInfo(pid, hostname, long_ago, long_ago, "someone", incarnation)


def test_a_lock_naming_a_live_pid_of_another_process_incarnation_is_stale_once_its_heartbeat_is_old() -> None:
    """A restarted container keeps its hostname and reuses low pids at once: our own pid, another start."""
    mine = incarnation_of(os.getpid())
    assert mine is not None
    host = socket.gethostname()
    cases = {
        "another start time": Incarnation(mine.boot_id, mine.pid_namespace, mine.started + 1),
        "another PID namespace": Incarnation(mine.boot_id, "pid:[1]", mine.started),
        "another boot": Incarnation("00000000-0000-0000-0000-000000000000", mine.pid_namespace, mine.started),
    }
    for why, incarnation in cases.items():
        lock = _aged_lock(os.getpid(), incarnation, host)
        assert not holder_alive(lock, host), why
        assert is_stale(lock, datetime.now(UTC), 60, host, holder_alive(lock, host)), why


def test_the_genuine_live_holder_and_an_old_format_lock_are_alive_as_before() -> None:
    host = socket.gethostname()
    assert holder_alive(_aged_lock(os.getpid(), incarnation_of(os.getpid()), host), host)
    old_format = LockInfo.from_json(_aged_lock(os.getpid(), None, host).to_json())
    assert old_format.incarnation is None
    assert holder_alive(old_format, host)  # hostname + kill -0, as locks written before this change are read


def test_a_holder_in_another_pid_namespace_that_died_is_taken_over_although_its_pid_lives_here(
    tmp_path: Path,
) -> None:
    """The compose failure, for real: the holder ran as pid 1 of its own PID namespace; here pid 1 is init,
    alive forever, which kept the lock held for good. Now only the heartbeat decides, and it goes stale."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        cannot_run("a new PID namespace needs unshare(1) as root (CI runs as root)")
    uuid = str(uuid_module.uuid4())
    holder = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-m",
            "tests.helpers.context_holder",
            str(tmp_path),
            uuid,
            "0.05",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    store = ContextStore(tmp_path, stale_after_s=0.5, heartbeat_interval_s=0.05, fsync="never")
    try:
        lock = wait_for(
            lambda: store.read_lock(uuid) if (tmp_path / "running" / uuid).is_dir() else None,
            timeout=30,
            what="the namespaced holder's lock",
        )
        assert lock.process_id == 1  # pid 1 of its namespace; here pid 1 is this machine's init
        assert lock.incarnation is not None
        assert process_alive(1)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stderr.close()  # type: ignore[union-attr]

    ctx = wait_for(
        lambda: opened_unless_held(store, uuid), timeout=15, what="the dead namespaced holder's lock to go stale"
    )
    assert ctx.read_state()["attempt"] == 2
    ctx.release()


@pytest.mark.parametrize(
    ("age_s", "alive", "stale"),
    [
        pytest.param(200, True, False, id="alive, silent less than hung_after_s: a slow holder keeps it"),
        pytest.param(300, True, False, id="exactly hung_after_s old is not older than it"),
        pytest.param(301, True, True, id="alive but silent past hung_after_s: stopped or wedged, taken over"),
        pytest.param(30, True, False, id="fresh: hung_after_s never shortens stale_after_s"),
    ],
)
def test_a_live_local_holder_silent_past_hung_after_s_is_stale(age_s: float, alive: bool, stale: bool) -> None:
    lock = lock_info(age_s)
    assert is_stale(lock, NOW, 60, HERE, alive, hung_after_s=300) is stale
    assert is_hung(lock, NOW, 300) is (age_s > 300)
    assert is_stale(lock, NOW, 60, HERE, alive) is False  # without hung_after_s, as before


def test_a_write_that_passed_the_fencing_check_before_a_takeover_lands_where_nobody_reads(tmp_path: Path) -> None:
    """The check-to-write window, without a pause: the check is made to pass after the takeover, as it would
    for a holder stopped right after checking. The write must still not reach the context."""
    store = ContextStore(tmp_path, hostname="a", fsync="never")
    old = store.create(TASK_KEY, CONFIG, heartbeat=False)
    old.append_message("user", "the task")
    thief = ContextStore(tmp_path, hostname="b", stale_after_s=60, clock=shifted_clock(120))
    new = thief.open(old.uuid, heartbeat=False)
    old._lock.check = lambda: None  # type: ignore[method-assign] - the check already passed before the pause
    old.append_message("assistant", "a late append")
    old.append_tool("bash", {"command": "true"}, "success", 1)
    with pytest.raises((FileNotFoundError, FencedError)):
        old.update_state(status="processing", last_activity="a late state write")
    with pytest.raises((FileNotFoundError, FencedError)):
        old._lock.refresh(NOW)
    old.release()  # a hand-back paused after its check: removes no lock but its own generation's
    assert new.append_message("assistant", "the new holder's") == 2
    assert [m["content"] for m in new.messages()] == ["the task", "the new holder's"]
    assert new.read_state()["last_activity"] != "a late state write"
    assert store_lock_owner(thief, old.uuid) == new._lock.owner
    assert list((tmp_path / ".staging").iterdir()) == []  # the old generation is gone
    new.finish("completed")


def test_a_stopped_holder_on_this_host_is_taken_over_after_hung_after_s_without_waiting_on_it(
    tmp_path: Path,
) -> None:
    uuid = str(uuid_module.uuid4())
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.context_holder", str(tmp_path), uuid, "0.05"], cwd=REPO_ROOT
    )
    try:
        wait_for(lambda: (tmp_path / "running" / uuid / "messages.jsonl").stat().st_size > 0
                 if (tmp_path / "running" / uuid / "messages.jsonl").exists() else None, what="the holder")
        os.kill(holder.pid, signal.SIGSTOP)
        here = socket.gethostname()
        patient = ContextStore(tmp_path, hostname=here, stale_after_s=60, clock=shifted_clock(120))
        with pytest.raises(LockHeldError):
            patient.open(uuid)  # alive (kill -0 answers for a stopped process) and not yet hung
        later = ContextStore(tmp_path, hostname=here, stale_after_s=60, hung_after_s=300, clock=shifted_clock(400))
        taken = later.open(uuid, heartbeat=False)
        assert taken.previous_holder is not None
        assert taken.previous_holder.process_id == holder.pid
        taken.append_message("assistant", "taken over from a stopped holder")
        taken.finish("completed")
    finally:
        holder.kill()
        holder.wait()


def test_a_hung_holder_is_killed_only_when_it_is_provably_the_same_incarnation() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        here = socket.gethostname()
        genuine = incarnation_of(sleeper.pid)
        assert genuine is not None
        beat = NOW - timedelta(hours=1)
        other = Incarnation(genuine.boot_id, genuine.pid_namespace, genuine.started + 1)  # the pid, reused
        assert not stop_hung_holder(LockInfo(sleeper.pid, here, beat, beat, "o", other), here)
        assert not stop_hung_holder(LockInfo(sleeper.pid, "elsewhere", beat, beat, "o", genuine), "host-x")
        assert not stop_hung_holder(LockInfo(sleeper.pid, here, beat, beat, "o", None), here)  # nothing to prove it
        assert sleeper.poll() is None
        assert stop_hung_holder(LockInfo(sleeper.pid, here, beat, beat, "o", genuine), here)
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()
