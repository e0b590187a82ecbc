"""The files of a task's home that the worker itself reads or writes (issue 36): its ``.tasuki/env`` and
``.tasuki/path``, the environment's marker. The home is the agent's to write, so each is reached beneath the home
one component at a time without following a link, opened without blocking (a named pipe in a file's place is
refused, never waited on), and read or written only when it is a regular file. What the agent left in a file's or
``.tasuki``'s place that is of another kind is removed, never followed, before the worker makes its own; and where the
worker writes, a directory or file the agent took its owner's rights from (``chmod 000``: an unprivileged worker's
sandbox runs as the worker's own user) gets them back, or the worker could write nothing there again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Unreadable(OSError):
    """A file of the home is there but is not read: a link on the way, not a regular file, or an I/O error."""


def read(home: Path, name: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes (and one more, to tell a longer file) of ``name`` (``.tasuki/env``) beneath
    ``home``; None when it is missing; Unreadable, saying why, when it is there but is not read."""
    fds: list[int] = []
    try:
        fds.append(os.open(home, _DIRECTORY))
        *directories, leaf = name.split("/")
        for directory in directories:
            fds.append(os.open(directory, _DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(leaf, _READ, dir_fd=fds[-1]))
        if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
            raise Unreadable(errno.EINVAL, f"{name} is not a regular file: not read")
        return os.read(fds[-1], limit + 1)
    except FileNotFoundError:
        return None
    except Unreadable:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unreadable(exc.errno, f"{name} is a symbolic link or passes through one: not read") from exc
        raise Unreadable(exc.errno or errno.EIO, f"{name} could not be read ({exc.strerror or exc})") from exc
    finally:
        for fd in reversed(fds):
            os.close(fd)


def ensure(home: Path, names: tuple[str, ...]) -> None:
    """Make each of ``names`` (``.tasuki/env``: a directory, then a file) exist beneath ``home`` as the worker's
    own kind, empty when it is new; whatever holds a place with another kind is removed first."""
    for name in names:
        with _beneath(home, name) as (directory, leaf):
            _replace_odd(directory, leaf, stat.S_ISREG)
            os.close(_open_leaf(directory, leaf, _WRITE))


def write(home: Path, name: str, data: bytes) -> None:
    """Replace the content of ``name`` beneath ``home`` with ``data`` (made as in :func:`ensure`)."""
    with _beneath(home, name) as (directory, leaf):
        _replace_odd(directory, leaf, stat.S_ISREG)
        fd = _open_leaf(directory, leaf, _WRITE | os.O_TRUNC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a pipe since the check: refused, not waited on
                raise Unreadable(errno.EINVAL, f"{name} is not a regular file: not written")
            os.write(fd, data)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _beneath(home: Path, name: str) -> Iterator[tuple[int, str]]:
    """The directory fd that holds ``name``'s last component (its directories made, odd entries replaced)."""
    fds = [_enter(str(home), None)]
    try:
        *directories, leaf = name.split("/")
        for directory in directories:
            _replace_odd(fds[-1], directory, stat.S_ISDIR)
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700, dir_fd=fds[-1])
            fds.append(_enter(directory, fds[-1]))
        yield fds[-1], leaf
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _enter(name: str, parent: int | None) -> int:
    """The directory ``name`` (in ``parent``), opened without following a link; one the worker may not open (mode
    000: it is the worker's own, or the worker is root and nothing stops it) is made ``0700`` first, through a
    descriptor that is not followed either."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except PermissionError:
        held = os.open(name, _DIRECTORY | os.O_PATH, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{held}", 0o700)  # an O_PATH fd opens at mode 000; chmod through its link
            return os.open(".", _DIRECTORY, dir_fd=held)
        finally:
            os.close(held)


def _open_leaf(directory: int, leaf: str, flags: int) -> int:
    """``leaf`` opened to write (made 0600 when new); one the worker may not write (mode 000) is replaced."""
    try:
        return os.open(leaf, flags, 0o600, dir_fd=directory)
    except PermissionError:
        os.unlink(leaf, dir_fd=directory)
        return os.open(leaf, flags | os.O_EXCL, 0o600, dir_fd=directory)


def _replace_odd(directory_fd: int, name: str, wanted: Callable[[int], bool]) -> None:
    """Remove ``name`` in ``directory_fd`` when it is there but not of the ``wanted`` kind (lstat: a link is not
    followed; a directory in a file's place goes whole, rmtree following no link either)."""
    try:
        mode = os.lstat(name, dir_fd=directory_fd).st_mode
    except FileNotFoundError:
        return
    if wanted(mode):
        return
    log.warning("a file of the task's home was of another kind: replaced", file=name)
    if stat.S_ISDIR(mode):
        shutil.rmtree(name, dir_fd=directory_fd, ignore_errors=True)
    else:
        os.unlink(name, dir_fd=directory_fd)
