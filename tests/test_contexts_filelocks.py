"""File locks whose waiters retry briskly at first: the ``flock`` semantics stay the library's (another process's
hold blocks, a timeout raises ``filelock.Timeout``), in both phases of a wait."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import pytest

from contexts import filelocks
from contexts.filelocks import file_lock

HOLD = (
    "import filelock, sys; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
    "sys.stdin.readline()"
)


@contextmanager
def held_by_another_process(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process holding the lock on ``path`` until the block ends (or it is told to let go)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "held\n"
    try:
        yield child
    finally:
        let_go(child)


def let_go(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_one_try_on_a_lock_another_process_holds_raises_timeout(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with held_by_another_process(path), pytest.raises(filelock.Timeout), file_lock(path, 0):
        pytest.fail("the lock was held elsewhere")


def test_a_short_timeout_runs_out_while_the_wait_is_still_brisk(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    with held_by_another_process(path), pytest.raises(filelock.Timeout), file_lock(path, filelocks.BRISK_FOR_S / 10):
        pytest.fail("the lock was held elsewhere")


@pytest.mark.parametrize("brisk_for_s", [filelocks.BRISK_FOR_S, 0.0], ids=["brisk phase", "after the brisk phase"])
def test_a_waiter_gets_the_lock_once_the_other_process_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, brisk_for_s: float
) -> None:
    monkeypatch.setattr(filelocks, "BRISK_FOR_S", brisk_for_s)
    path = tmp_path / "x.lock"
    got: list[str] = []

    def wait_for_it() -> None:
        with file_lock(path, 60):
            got.append("held")

    with held_by_another_process(path) as child:
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert got == []  # the other process still holds it
        let_go(child)
        waiter.join(timeout=60)

    assert got == ["held"]
    with file_lock(path, 0):  # and it was released again
        pass
