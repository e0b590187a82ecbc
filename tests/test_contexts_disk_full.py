"""A full disk: the append that does not fit fails with one clear error, and nothing half-written stays.

The file system is a real one that really fills up: a small tmpfs mounted for the test (root only, as in CI).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fakeredis
import pytest

from contexts import Context, ContextStore
from contexts.atomic import DiskFullError
from scheduler.monitor import Monitor
from scheduler.plan import Policy, plan
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import CONFIG, TASK_KEY
from tests.helpers.schemas import validate_context_dir
from worker.run import LocalReporter, TaskRequest, TaskRun
from worker.settings import Settings

SIZE = 256 * 1024


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        cannot_run("mounting a tmpfs needs root (CI runs as root)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        cannot_run(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path, leave_bytes: int) -> Path:
    """Take all free space of the file system but ``leave_bytes``."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / "filler"
    with open(filler, "wb") as out:
        out.write(b"\0" * max(free - leave_bytes, 0))
    return filler


def append_until_full(ctx: Context) -> tuple[int, DiskFullError]:
    """Append 1 KB messages until the disk refuses one; how many fitted, and the error."""
    for written in range(1000):
        try:
            ctx.append_message("assistant", "x" * 1024)
        except DiskFullError as exc:
            return written, exc
    raise AssertionError("the disk never filled up")


def test_an_append_that_does_not_fit_fails_cleanly_and_the_context_resumes_once_there_is_room(tiny_fs: Path) -> None:
    store = ContextStore(tiny_fs / "contexts", heartbeat_interval_s=3600, fsync="always")
    ctx = store.create(TASK_KEY, CONFIG, user="u")
    ctx.append_message("system", "s")
    ctx.append_message("user", "the task")
    filler = fill(tiny_fs, 16 * 1024)

    written, failure = append_until_full(ctx)
    assert "no space left" in str(failure)
    assert "\n" not in str(failure)
    assert written > 0  # it failed because the disk filled, not at once

    # Nothing half-written: every line is whole, and the seqs run 1..n.
    counts = validate_context_dir(ctx.path)
    assert counts["messages.jsonl"] == 2 + written

    filler.unlink()
    seq = ctx.append_message("assistant", "after the disk was freed")
    assert seq == 3 + written
    ctx.finish("completed")
    assert validate_context_dir(store.completed_path(ctx.uuid))["messages.jsonl"] == seq


def test_a_state_update_on_a_full_disk_keeps_the_previous_state_whole(tiny_fs: Path) -> None:
    store = ContextStore(tiny_fs / "contexts", heartbeat_interval_s=3600)
    ctx = store.create(TASK_KEY, CONFIG, user="u")
    ctx.update_state(status="processing", last_activity="before")
    fill(tiny_fs, 0)

    with pytest.raises(DiskFullError):
        ctx.update_state(last_activity="x" * 100_000)

    assert ctx.read_state()["last_activity"] == "before"
    assert not [p for p in ctx.path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind
    ctx.detach()


def test_a_task_whose_context_cannot_be_finished_hands_it_to_the_monitor_instead_of_holding_it(
    tiny_fs: Path, make_settings: Callable[..., Settings], fake_redis: fakeredis.FakeRedis
) -> None:
    """A full disk at the end of a task: the worker gives the lock up (an unlink needs no space), so the
    monitor takes the context once it is quiet — even while this worker process lives on."""
    store = ContextStore(tiny_fs / "contexts", fsync="never")
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("user", "the task")
    run = TaskRun(ctx.uuid, TaskRequest(TASK_KEY, prompt="the task"), make_settings(), store, provider_for=print)
    fill(tiny_fs, leave_bytes=0)

    outcome = run._finish(ctx, "failed", "boom", None)

    assert outcome["status"] == "unfinished"
    running = store.running_path(ctx.uuid)
    assert not (running / ".lock").exists()
    policy = Policy(stale_after_s=60, max_attempts=3, resume=True, hostname=store.hostname)
    monitor = Monitor(store, fake_redis, policy, send=lambda *_: None, ended=lambda *_: None)
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert [action.kind for action in plan([monitor.inspect(ctx.uuid)], later, policy)] == ["resume"]


def test_a_task_that_cannot_create_its_context_fails_visibly_and_frees_its_issue(
    tiny_fs: Path, make_settings: Callable[..., Settings]
) -> None:
    store = ContextStore(tiny_fs / "contexts", fsync="never")
    fill(tiny_fs, leave_bytes=0)
    ended: list[tuple[str, str]] = []
    reported: list[tuple[str, str | None]] = []

    class Reporter(LocalReporter):
        def finish(self, status: str, state: dict[str, object], result: object, error: str | None) -> None:
            reported.append((status, error))

    request = TaskRequest(TASK_KEY, prompt="the task")
    uuid = "0f0e0d0c-0b0a-4908-8706-050403020100"
    run = TaskRun(
        uuid,
        request,
        make_settings(),
        store,
        provider_for=print,
        on_finish=lambda u, status: ended.append((u, status)),
        reporter=Reporter(request),
    )

    outcome = run.execute({})

    assert outcome["status"] == "failed"
    assert outcome["error"].startswith(f"cannot create the context under {store.base_dir}")
    assert ended == [(uuid, "failed")]  # the task key is released: the issue can be triggered again
    assert [status for status, _ in reported] == ["failed"]
