"""Warm working copies: a task of a repository starts on an earlier task's tree, switched exactly onto its own
start, without trusting anything the earlier agent could have touched; broken mirrors and copies are remade."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import filelock
import pytest
from structlog.testing import capture_logs

from tests.helpers.environments import next_clock_tick
from tests.helpers.stack import git, make_buggy_repo
from worker import workcopy
from worker.checkout import Checkout
from worker.warm_environment import recalled, remember
from worker.workcopy import EVICT_EVERY_S, FETCHED_FILE, IDLE_DIR, GitCache


def start_task(root: Path, remote: Path, uuid: str, *, fresh: bool = True) -> Checkout:
    checkout = Checkout(root / "workspaces" / uuid, str(remote), f"tasuki/1-{uuid[:8]}",
                        cache=GitCache(root / "git-cache", root / "workspaces"))
    checkout.prepare(fresh=fresh)
    return checkout


def tracked_files(checkout: Checkout) -> set[str]:
    return set(checkout.git("ls-files").split())


def tree_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".git" not in p.parts}


def test_a_second_task_starts_on_the_first_tasks_tree_switched_exactly_onto_the_remote(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    first = start_task(tmp_path, remote, "aaaaaaaa-0001")
    kept = "test_calc.py"  # untouched by the first task
    before = (first.path / kept).stat()
    (first.path / "calc.py").write_text("changed by the first task\n")
    (first.path / "untracked.txt").write_text("left behind\n")
    (first.path / "build" / "out").mkdir(parents=True)
    (first.path / "build" / "out" / "artifact.o").write_bytes(b"\0")
    first.checkpoint(1)
    first.release()

    second = start_task(tmp_path, remote, "bbbbbbbb-0002")

    after = (second.path / kept).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # the same tree, not a clone
    assert tree_files(second.path) == tracked_files(second)  # nothing untracked or ignored is left
    assert (second.path / "calc.py").read_text() == git(remote, "show", "HEAD:calc.py")
    assert second.git("status", "--porcelain") == ""
    assert second.git("rev-parse", "HEAD").strip() == git(remote, "rev-parse", "HEAD").strip()
    assert not (tmp_path / "workspaces" / "aaaaaaaa-0001").exists()


def test_a_recorded_environment_goes_with_its_warm_copy_through_the_clean_and_nothing_else_is_kept(
    tmp_path: Path,
) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    first = start_task(tmp_path, remote, "aaaaaaaa-0001")
    (first.path / ".venv" / "bin").mkdir(parents=True)
    (first.path / ".venv" / "bin" / "tool").write_text("#!/bin/sh\n")
    (first.path / "scratch.txt").write_text("the agent's\n")
    next_clock_tick(tmp_path, first.path / ".venv")
    record = first.environment_record
    assert record is not None
    remember(record, first.path, "0123456789abcdef0123456789abcdef", 1.0, (".venv",))
    first.release()

    second = start_task(tmp_path, remote, "bbbbbbbb-0002")
    record = second.environment_record
    assert record is not None
    warm = recalled(record)
    assert warm is not None  # the record moved with the copy, out of the sandbox's reach
    assert warm.paths == (".venv",)
    assert warm.unchanged(second.path)  # git's clean kept it, untouched
    assert tree_files(second.path) == tracked_files(second) | {".venv/bin/tool"}  # and nothing else
    second.clean(warm.paths)
    assert tree_files(second.path) == tracked_files(second)
    assert second.cache is not None
    second.cache.discard(second.path)
    assert not record.exists()  # a discarded copy takes its record along


def test_discarded_paths_leave_the_checkout_at_once_and_a_tracked_file_under_them_stays(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    (remote / "vendor").mkdir()
    (remote / "vendor" / "tracked.py").write_text("committed\n")
    git(remote, "add", "-A")
    git(remote, "commit", "-q", "-m", "vendored")
    checkout = start_task(tmp_path, remote, "aaaaaaaa-0001")
    for directory in (".venv/lib", "vendor/built"):
        (checkout.path / directory).mkdir(parents=True)
        (checkout.path / directory / "file").write_text("made by a setup\n")
    os.symlink("/", checkout.path / "link")  # a path the agent may have put in place of a directory

    workspaces = tmp_path / "workspaces"

    aside = checkout.clean([".venv/", "link"])  # renamed out at once, for the worker to delete after the task
    assert not (checkout.path / ".venv").exists()
    assert not os.path.lexists(checkout.path / "link")
    assert aside is not None
    assert list(workspaces.glob(".discarded-*")) == [aside]
    assert sorted(os.listdir(aside)) == ["0", "1"]
    shutil.rmtree(aside)
    assert Path("/bin").is_dir()  # the symlink went, never what it points at
    assert checkout.clean(["vendor"]) is None  # a tracked file under it: git's clean, here
    assert tree_files(checkout.path) == tracked_files(checkout)  # the tracked file stays, the rest is gone

    leftover = workspaces / ".discarded-aaaaaaaa-0001-0badf00d"  # a worker killed while it deleted
    (leftover / "0").mkdir(parents=True)
    os.utime(leftover, (time.time() - EVICT_EVERY_S - 60,) * 2)
    assert checkout.cache is not None
    assert leftover in checkout.cache.evict(time.time())


def test_a_file_changed_behind_the_index_with_its_old_mtime_is_still_put_back(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    first = start_task(tmp_path, remote, "aaaaaaaa-0001")
    target = first.path / "calc.py"
    before = target.stat()
    target.write_text("x" * before.st_size)  # same size, same mtime: only ctime tells
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    first.release()

    second = start_task(tmp_path, remote, "bbbbbbbb-0002")

    assert (second.path / "calc.py").read_text() == git(remote, "show", "HEAD:calc.py")


def test_nothing_the_previous_agent_left_in_git_reaches_the_next_task(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    first = start_task(tmp_path, remote, "aaaaaaaa-0001")
    git(first.path, "config", "remote.origin.pushurl", str(tmp_path / "elsewhere.git"))  # the agent's .git
    git(first.path, "config", "filter.evil.clean", "touch planted")
    (first.path / ".git" / "info" / "attributes").parent.mkdir(exist_ok=True)
    (first.path / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    first.release()

    second = start_task(tmp_path, remote, "bbbbbbbb-0002")
    (second.path / "new.txt").write_text("work\n")
    second.checkpoint(1)
    second.commit("done")
    second.push()

    assert "evil" not in second.git("config", "--list")
    assert not (second.path / "planted").exists()
    assert git(remote, "show", "tasuki/1-bbbbbbbb:new.txt") == "work\n"
    assert not (tmp_path / "elsewhere.git").exists()


def test_a_corrupt_mirror_is_discarded_and_cloned_again(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces")
    start_task(tmp_path, remote, "aaaaaaaa-0001").release()
    mirror = cache.mirror_path(str(remote))
    for pack in (mirror / "objects").rglob("*"):
        if pack.is_file():
            pack.write_bytes(b"garbage")
    (mirror / "config").write_text("[core\nbroken")

    with capture_logs() as logs:
        second = start_task(tmp_path, remote, "bbbbbbbb-0002")

    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["git mirror discarded; cloning it again"]
    assert (second.path / "calc.py").read_text() == git(remote, "show", "HEAD:calc.py")


@pytest.mark.parametrize("damage", ["garbage index", "a file instead of a tree"])
def test_a_corrupt_working_copy_is_discarded_and_made_again(tmp_path: Path, damage: str) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces")
    first = start_task(tmp_path, remote, "aaaaaaaa-0001")
    first.release()
    idle = next((tmp_path / "workspaces" / IDLE_DIR).glob("*/*"))
    if damage == "garbage index":
        cache.index_path(idle).write_bytes(b"DIRC garbage")
    else:
        shutil.rmtree(idle)
        idle.write_text("not a directory\n")

    with capture_logs() as logs:
        second = start_task(tmp_path, remote, "bbbbbbbb-0002")

    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["working copy discarded; making a new one"]
    assert second.git("status", "--porcelain") == ""
    assert (second.path / "calc.py").read_text() == git(remote, "show", "HEAD:calc.py")


def test_a_task_resumed_on_a_warm_copy_gets_its_last_pushed_checkpoint(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    start_task(tmp_path, remote, "cccccccc-0003").release()  # an idle copy of another task
    first = start_task(tmp_path / "host1", remote, "aaaaaaaa-0001")
    (first.path / "calc.py").write_text("step one\n")
    (first.path / "notes.txt").write_text("note\n")
    first.checkpoint(1)
    first.settle()  # pushed

    resumed = start_task(tmp_path, remote, "aaaaaaaa-0001", fresh=False)

    assert (resumed.path / "calc.py").read_text() == "step one\n"
    assert (resumed.path / "notes.txt").read_text() == "note\n"
    assert set(resumed.git("status", "--porcelain").split()) == {"M", "calc.py", "??", "notes.txt"}


def run_tasks(root: Path, remote: Path, worker: int, tasks: int) -> None:
    """One worker process on this host: tasks one after another, each writing its own file and pushing."""
    for n in range(tasks):
        uuid = f"{worker:04d}{n:04d}-0000"
        checkout = start_task(root, remote, uuid)
        leftovers = tree_files(checkout.path) - tracked_files(checkout)
        (checkout.path / f"from-{uuid}.txt").write_text(uuid)
        checkout.commit(uuid)
        checkout.push()
        checkout.release()
        if leftovers:
            raise AssertionError(f"{uuid} started with another task's files: {leftovers}")


def test_processes_of_one_host_share_the_mirror_and_never_the_same_copy(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    workers = []
    for worker in range(3):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                run_tasks(tmp_path, remote, worker, 4)
                code = 0
            finally:
                os._exit(code)
        workers.append(pid)

    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in workers] == [0, 0, 0]
    for worker in range(3):
        for n in range(4):
            uuid = f"{worker:04d}{n:04d}-0000"
            assert git(remote, "ls-tree", "--name-only", f"tasuki/1-{uuid[:8]}").split() == [
                "calc.py", f"from-{uuid}.txt", "test_calc.py"]
    assert 1 <= len(list((tmp_path / "workspaces" / IDLE_DIR).glob("*/*"))) <= 3


def idle_copies(root: Path) -> list[Path]:
    return [copy for remote_dir in (root / "workspaces" / IDLE_DIR).glob("*") for copy in remote_dir.iterdir()]


def age(path: Path, days: float) -> None:
    when = path.stat().st_mtime - days * 86400
    os.utime(path, (when, when))


def test_idle_copies_and_mirrors_unused_for_warm_copy_days_are_deleted_and_recent_ones_kept(tmp_path: Path) -> None:
    old_remote = make_buggy_repo(tmp_path / "old")
    new_remote = make_buggy_repo(tmp_path / "new")
    for index, remote in enumerate((old_remote, new_remote)):
        start_task(tmp_path, remote, f"aaaaaaaa-000{index}").release()
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces", keep_s=7 * 86400)
    old_mirror, new_mirror = cache.mirror_path(str(old_remote)), cache.mirror_path(str(new_remote))
    [old_copy] = [c for c in idle_copies(tmp_path) if c.parent.name == old_mirror.stem]
    age(old_copy, 8)
    age(old_mirror, 8)
    age(new_mirror, 8)  # an old fetch, but a copy of it was used lately: the mirror is in use

    gone = cache.evict(time.time())

    assert set(gone) == {old_copy, old_mirror}
    assert not old_mirror.exists()
    assert not cache.index_path(old_copy).exists()
    assert new_mirror.is_dir()
    assert [c.parent.name for c in idle_copies(tmp_path)] == [new_mirror.stem]
    again = start_task(tmp_path, old_remote, "bbbbbbbb-0003")  # the next task of that remote simply clones again
    assert again.git("status", "--porcelain") == ""


def test_a_mirror_being_refreshed_is_not_evicted(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    start_task(tmp_path, remote, "aaaaaaaa-0001").release()
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces", keep_s=86400)
    for copy in idle_copies(tmp_path):
        age(copy, 2)
    mirror = cache.mirror_path(str(remote))
    age(mirror, 2)

    with filelock.FileLock(str(mirror.with_suffix(".lock"))):  # a task's refresh holds it
        gone = cache.evict(time.time())

    assert mirror.is_dir()
    assert mirror not in gone
    assert idle_copies(tmp_path) == []


def test_a_host_looks_for_unused_copies_at_most_once_an_hour(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    start_task(tmp_path, remote, "aaaaaaaa-0001").release()
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces", keep_s=86400)
    now = time.time()
    assert cache.maybe_evict(now) == []  # the first look: nothing is old yet
    [copy] = idle_copies(tmp_path)
    age(copy, 2)

    assert cache.maybe_evict(now + 60) == []  # looked a minute ago
    assert cache.maybe_evict(now + EVICT_EVERY_S + 1) == [copy]


def test_what_an_eviction_killed_mid_way_left_is_deleted_by_the_next(tmp_path: Path) -> None:
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces", keep_s=86400)
    left = [tmp_path / "workspaces" / IDLE_DIR / ".evicting-0123",
            tmp_path / "git-cache" / "mirrors" / ".evicting-a.git"]
    for trash in left:
        (trash / "objects").mkdir(parents=True)
        (trash / "objects" / "pack").write_bytes(b"\0")

    cache.evict(time.time())

    assert [trash for trash in left if trash.exists()] == []


def counting_fetches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The ``git fetch`` runs of the mirror from now on (git itself still runs)."""
    fetches: list[tuple[str, ...]] = []
    real = workcopy.run_git

    def run_git(args: tuple[str, ...], **kwargs: Any) -> str:
        if args[0] == "fetch":
            fetches.append(args)
        return real(args, **kwargs)

    monkeypatch.setattr(workcopy, "run_git", run_git)
    return fetches


def test_a_fetch_begun_after_a_task_asked_for_one_serves_it_and_an_older_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces")
    mirror, heads = cache.refresh(str(remote), None)  # the clone
    fetches = counting_fetches(monkeypatch)
    git(remote, "branch", "pushed-since")
    assert (mirror / FETCHED_FILE).stat().st_mode & 0o777 == 0o600
    note = json.loads((mirror / FETCHED_FILE).read_text())
    # Another process's fetch began after this call asked (while it waited for the lock): it serves this call.
    (mirror / FETCHED_FILE).write_text(json.dumps({**note, "started_ns": time.time_ns() + 10**12}))

    assert cache.refresh(str(remote), None) == (mirror, heads)
    assert fetches == []

    (mirror / FETCHED_FILE).write_text(json.dumps(note))  # the last fetch began before this call: fetch again
    _, fresh = cache.refresh(str(remote), None)
    assert len(fetches) == 1
    assert fresh["pushed-since"] == git(remote, "rev-parse", "pushed-since").strip()
    assert json.loads((mirror / FETCHED_FILE).read_text())["heads"] == fresh


@pytest.mark.parametrize("note", ["{torn", '{"started_ns": "soon", "heads": {}}', '{"started_ns": 1}', "[]"])
def test_an_unreadable_fetch_note_only_costs_a_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      note: str) -> None:
    remote = make_buggy_repo(tmp_path / "repo")
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces")
    mirror, heads = cache.refresh(str(remote), None)
    fetches = counting_fetches(monkeypatch)
    (mirror / FETCHED_FILE).write_text(note)

    assert cache.refresh(str(remote), None) == (mirror, heads)
    assert len(fetches) == 1
