"""``flock`` file locks whose waiters notice a release within a millisecond.

``filelock`` retries a busy lock every 50 ms by default. The sections Tasuki guards with file locks last
milliseconds (a ``state.json`` rewrite, a ``.lock`` change, a ``git fetch`` into a mirror), so a waiter
slept most of a 50 ms tick after the holder had already let go: two task processes taking turns on one
repository's mirror left the cores idle a third of the time (``bench.run --only throughput``). A waiter
here retries every millisecond for its first tenth of a second, then at the library's own pace, so a long
hold (the first clone of a large repository) does not cost a thousand retries a second.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from contexts.names import FILE_MODE

BRISK_POLL_S = 0.001  # retry interval while the wait is young
BRISK_FOR_S = 0.1  # how long a wait stays young


@contextmanager
def file_lock(path: Path | str, timeout: float, *, mode: int = FILE_MODE) -> Iterator[None]:
    """Hold the ``flock`` on ``path`` for the ``with`` block; :class:`filelock.Timeout` after ``timeout``
    seconds (0: one try, negative: wait for ever)."""
    lock = filelock.FileLock(str(path), mode=mode)
    acquire(lock, timeout)
    try:
        yield
    finally:
        lock.release()


def acquire(lock: filelock.BaseFileLock, timeout: float) -> None:
    """Take ``lock`` within ``timeout`` seconds: briskly at first, then at ``filelock``'s usual interval."""
    brisk = BRISK_FOR_S if timeout < 0 else min(timeout, BRISK_FOR_S)
    try:
        lock.acquire(timeout=brisk, poll_interval=BRISK_POLL_S)
    except filelock.Timeout:
        if 0 <= timeout <= BRISK_FOR_S:
            raise
        lock.acquire(timeout=-1 if timeout < 0 else timeout - BRISK_FOR_S)


@contextmanager
def flock_in_place(path: Path | str, timeout: float, *, mode: int = FILE_MODE) -> Iterator[None]:
    """Like :func:`file_lock`, but never creates a missing parent directory: ``path`` may lie in a context
    generation that a takeover deleted (``/proc/self/fd/N/...``), where only ``FileNotFoundError`` is right."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            waited = time.monotonic() - started
            if 0 <= timeout <= waited:
                raise filelock.Timeout(os.fspath(path))
            time.sleep(BRISK_POLL_S if waited < BRISK_FOR_S else 0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
