"""The file work of environment snapshots: copies that keep a virtualenv working, sizes, the secret scan, and the
fingerprint that tells whether a copy is still exactly as it was made."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from contexts.errors import TasukiError

# Symlinks, modes and times kept; copy-on-write where the filesystem can. --remove-destination: a symlink already
# at a destination (the repository's checkout is untrusted) is replaced, never written through to where it points;
# a symlink where a directory is restored makes the copy fail instead.
CP = ("cp", "-a", "--reflink=auto", "--remove-destination")
ARGUMENTS_PER_CALL = 500
# A copy made in the background (a spare) yields the CPU and the disk to the tasks beside it.
BACKGROUND = ("nice", "-n", "10", "ionice", "-c", "2", "-n", "7")
SCAN_CHUNK = 1 << 20


class SnapshotError(TasukiError):
    """A snapshot cannot be kept or restored."""


def copy_entries(source: Path, destination: Path, *, background: bool = False) -> None:
    """Copy what ``source`` holds into ``destination`` (made 0700 if missing; its own mode left alone);
    ``background``: at a low CPU and I/O priority."""
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    entries = sorted(str(source / name) for name in os.listdir(source))
    _cp(entries, destination, cwd=None, background=background)


def move_entries(source: Path, destination: Path) -> None:
    """Move what ``source`` holds into ``destination`` by rename (one filesystem), merging into directories that are
    already there (never through a symlink: a symlink where a directory goes fails, as the copy does); a file there
    is replaced. OSError (EXDEV across filesystems among others) when anything cannot be moved."""
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in sorted(os.listdir(source)):
        moving, target = source / name, destination / name
        try:
            there = target.lstat()
        except FileNotFoundError:
            os.rename(moving, target)
            continue
        if stat.S_ISDIR(there.st_mode) and stat.S_ISDIR(moving.lstat().st_mode):
            move_entries(moving, target)
        elif stat.S_ISDIR(there.st_mode) or stat.S_ISDIR(moving.lstat().st_mode):
            raise OSError(f"{target} is in the way of {moving}")
        else:
            os.rename(moving, target)


def copy_paths(checkout: Path, paths: Sequence[str], destination: Path) -> None:
    """Copy the relative ``paths`` of ``checkout`` to the same relative places under ``destination``."""
    _cp(list(paths), destination, cwd=checkout, parents=True)


def _cp(
    sources: list[str], destination: Path, *, cwd: Path | None, parents: bool = False, background: bool = False
) -> None:
    for start in range(0, len(sources), ARGUMENTS_PER_CALL):
        batch = sources[start : start + ARGUMENTS_PER_CALL]
        prefix = BACKGROUND if background and shutil.which("ionice") else ()
        command = [*prefix, *CP, *(["--parents"] if parents else []), "-t", str(destination), "--", *batch]
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise SnapshotError(f"copying into {destination} failed: {lines[-1] if lines else done.returncode}")


def bytes_under(path: Path) -> int:
    """The apparent size of ``path``: a file's, or the sum of everything below a directory (symlinks not followed)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size
    total = info.st_size
    for directory, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
    return total


class Fingerprint(NamedTuple):
    """What :func:`fingerprint` found: the digest, and the newest change time among the entries (ns)."""

    digest: str
    newest_ns: int


def fingerprint(root: Path, paths: Sequence[str]) -> Fingerprint:
    """A digest of everything under the relative ``paths`` of ``root`` as the kernel describes it: each entry's name,
    type and mode, owner, size, inode, links, modification and change times (a symlink's target too). Any write,
    chmod, rename, link, new or deleted entry changes it, and so does ``touch -d`` (it sets the change time to now):
    nobody without the clock can set a change time back. A path that is missing or passes through a symlink is
    digested as such (it differs from the path as made)."""
    digest = hashlib.sha256()
    newest = [0]
    for relative in sorted(path.rstrip("/") for path in paths):
        parts = relative.split("/")
        if any(os.path.islink(os.path.join(root, *parts[:depth])) for depth in range(1, len(parts))):
            digest.update(b"through a symlink\0" + os.fsencode(relative) + b"\0")
            continue
        try:
            top = os.lstat(os.path.join(root, relative))
        except FileNotFoundError:
            digest.update(b"missing\0" + os.fsencode(relative) + b"\0")
            continue
        _describe(digest, newest, os.path.join(root, relative), relative, top)
        if stat.S_ISDIR(top.st_mode):
            _describe_below(digest, newest, os.path.join(root, relative), relative)
    return Fingerprint(digest.hexdigest(), newest[0])


def _describe_below(digest: hashlib._Hash, newest: list[int], directory: str, relative: str) -> None:
    """Every entry below ``directory`` in name order, depth first; symlinks are entries, never followed."""
    with os.scandir(directory) as listing:  # an unreadable directory raises: the caller treats it as changed
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        info = entry.stat(follow_symlinks=False)
        name = f"{relative}/{entry.name}"
        _describe(digest, newest, entry.path, name, info)
        if stat.S_ISDIR(info.st_mode):
            _describe_below(digest, newest, entry.path, name)


def _describe(digest: hashlib._Hash, newest: list[int], path: str, relative: str, info: os.stat_result) -> None:
    fields = (
        info.st_mode,
        info.st_uid,
        info.st_gid,
        info.st_size,
        info.st_ino,
        info.st_dev,
        info.st_nlink,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )
    target = os.fsencode(os.readlink(path)) if stat.S_ISLNK(info.st_mode) else b""
    digest.update(os.fsencode(relative) + b"\0" + " ".join(map(str, fields)).encode() + b"\0" + target + b"\0")
    newest[0] = max(newest[0], info.st_ctime_ns)


def find_secret(root: Path, names: Mapping[str, str]) -> tuple[str, str] | None:
    """The first regular file under ``root`` holding one of the values of ``names`` (value -> what to call it):
    ``(its name, the file relative to root)``; None when no file does. Empty values are never looked for."""
    values = sorted({value.encode() for value in names if value}, key=len, reverse=True)
    if not values:
        return None
    pattern = re.compile(b"|".join(re.escape(value) for value in values))
    overlap = max(len(value) for value in values) - 1
    for directory, _dirnames, filenames in os.walk(root):
        for filename in sorted(filenames):
            path = Path(directory, filename)
            found = _search(path, pattern, overlap)
            if found is not None:
                return names[found.decode()], path.relative_to(root).as_posix()
    return None


def _search(path: Path, pattern: re.Pattern[bytes], overlap: int) -> bytes | None:
    """The first match in the regular file ``path`` (read in chunks, overlapping so no match is cut in two)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # a symlink (its target is another file of the copy, or outside it) or a socket
    # O_NONBLOCK: a named pipe left in the home opens without waiting for a writer (and is then skipped).
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        tail = b""
        while chunk := handle.read(SCAN_CHUNK):
            window = tail + chunk
            match = pattern.search(window)
            if match is not None:
                return match.group(0)
            tail = window[-overlap:] if overlap else b""
    return None


def write_private(path: Path, data: bytes) -> None:
    """Write a new file readable by the worker's user only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
