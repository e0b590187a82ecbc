"""Whole-file JSON replacement: readers see the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO

from contexts.errors import ContextError
from contexts.names import FILE_MODE


class DiskFullError(ContextError):
    """The file system refused a write (no space or quota); nothing half-written was left behind."""


def write_bytes_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, and rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left writing {path.name} in {path.parent}") from exc
        raise


def write_json_atomic(path: Path, data: Any, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically."""
    write_bytes_atomic(path, json.dumps(data, ensure_ascii=False, indent=2).encode() + b"\n", fsync=fsync)


def open_no_follow(path: Path) -> BinaryIO:
    """Open a context file for reading, refusing a symlink: a context's files are never links, and
    following one could show a file from outside the store."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        from contexts.errors import CorruptRecordError

        raise CorruptRecordError(f"{path}: is a symbolic link; refusing to follow it out of the context") from None
    return os.fdopen(fd, "rb")


def read_json(path: Path) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`."""
    with open_no_follow(path) as handle:
        data = handle.read()
    try:
        return json.loads(data)
    except ValueError as exc:
        from contexts.errors import CorruptRecordError

        raise CorruptRecordError(f"{path}: not valid JSON ({exc})") from exc


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
