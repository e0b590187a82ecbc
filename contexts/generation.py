"""Generations of a context directory: how a takeover cuts the previous holder off from the files (SPEC §4).

A holder writes only through a directory descriptor it opened when it took the context (its *home*): appends
go to descriptors of files inside it, ``state.json`` and ``.lock`` are renamed into place inside it.  A
takeover never edits those files.  It copies them into a fresh directory (the next generation), writes its own
``.lock`` there, and swaps the two directories in one ``rename`` (``RENAME_EXCHANGE``).  Whatever the previous
holder writes afterwards — an append it checked for before a pause, a ``state.json`` it was renaming, a
heartbeat — lands in the old generation, which is moved aside and deleted.  The fence is the file system's
name lookup, not a check the holder makes, so a holder paused between its check and its write cannot pass it,
and the takeover never waits for anything that holder holds.  docs/fencing.md has the argument.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from contexts.names import (
    FILE_MODE,
    LOCK_FILE,
    MESSAGES_FILE,
    METADATA_FILE,
    STATE_FILE,
    STATE_LOCK_FILE,
    SUMMARIES_FILE,
    TOOLS_FILE,
)

# What a record refers to is copied before the record: state.json counts messages up to some seq, a summary
# covers messages up to its end_seq, so a copy never holds a reference to a message it lacks.
COPY_ORDER = (METADATA_FILE, STATE_FILE, SUMMARIES_FILE, TOOLS_FILE, MESSAGES_FILE)
NOT_COPIED = (LOCK_FILE, STATE_LOCK_FILE)  # each generation gets its own holder's lock and its own mutex
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_CHUNK = 1 << 20


def open_directory(path: Path) -> int:
    """A descriptor of the directory at ``path``; it follows the directory wherever it is renamed."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def home_of(fd: int, fallback: Path) -> Path:
    """A path that names the directory behind ``fd`` itself, not whatever is at its old name now
    (``/proc/self/fd/N``); ``fallback`` where /proc is missing (not Linux: no fencing by generation)."""
    home = Path(f"/proc/self/fd/{fd}")
    return home if home.is_dir() else fallback


def identity(fd: int) -> tuple[int, int]:
    """(device, inode) of the directory behind ``fd``: what the fencing check compares with the current name."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def copy_generation(source: Path, target: Path, *, fsync: bool = True) -> None:
    """Copy every file of ``source`` except its lock files into the empty directory ``target`` (0600 files)."""
    names = sorted(os.listdir(source), key=lambda n: (COPY_ORDER.index(n) if n in COPY_ORDER else -1, n))
    for name in _copied(names):
        src = source / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, target / name, symlinks=True)
        elif src.is_file() and not src.is_symlink():
            _copy_file(src, target / name, fsync=fsync)
    if fsync:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _copied(names: Iterable[str]) -> list[str]:
    """Names to copy: not a lock, not a temporary file a writer left half-made."""
    return [n for n in names if n not in NOT_COPIED and not (n.startswith(".") and n.endswith(".tmp"))]


def _copy_file(src: Path, dst: Path, *, fsync: bool) -> None:
    try:
        source = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # vanished between listing and opening (a temporary file renamed into place)
    try:
        target = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            _copy_range(source, target)
            if fsync:
                os.fsync(target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _copy_range(source: int, target: int) -> None:
    """Copy in the kernel (``copy_file_range``: a reflink where the file system shares extents, as XFS and btrfs
    do), up to the end the file has now; plain reads and writes where it is not supported."""
    try:
        while os.copy_file_range(source, target, _CHUNK * 64):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    os.lseek(source, 0, os.SEEK_SET)
    os.lseek(target, 0, os.SEEK_SET)
    os.ftruncate(target, 0)
    while chunk := os.read(source, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def exchange(current: Path, replacement: Path) -> None:
    """Swap two directories in one step (``renameat2(RENAME_EXCHANGE)``), so that a reader always finds a whole
    context at ``current``; where the file system cannot, two renames (``current`` is missing for an instant)."""
    libc = _libc()
    if libc is not None:
        if libc.renameat2(_AT_FDCWD, os.fsencode(current), _AT_FDCWD, os.fsencode(replacement), _RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(current))
    aside = replacement.with_name(replacement.name + ".old")
    os.rename(current, aside)
    os.rename(replacement, current)
    os.rename(aside, replacement)


def discard(directory: Path, tries: int = 20) -> None:
    """Delete an old generation.  Its fenced holder may still be creating a file in it (a ``.lock`` or
    ``state.json`` it was renaming into place), which makes one ``rmtree`` fail; once the directory itself is
    gone nothing can be created in it any more."""
    for _ in range(tries):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2  # noqa: B018 - glibc 2.28 or later
    except (OSError, AttributeError):
        return None
    return libc
