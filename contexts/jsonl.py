"""Append-only JSON Lines files: one record per line, one ``write`` per record, torn tails repaired.

Writers append a complete line with a single ``os.write`` on an ``O_APPEND`` descriptor, so a crash
leaves at most one torn line at the end of the file.  Readers ignore such a line; the next writer cuts
it off before appending (SPEC §3 rules 1-4).  Readers that want the newest records seek from the end.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, cast

from contexts.atomic import DiskFullError, open_no_follow
from contexts.errors import CorruptRecordError
from contexts.names import FILE_MODE, GZIP_SUFFIX

FsyncPolicy = Literal["always", "step", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "step", "never")
_BLOCK = 64 * 1024
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # one line, UTF-8 kept readable


class JsonlWriter:
    """The single writer of one JSONL file; numbers records with ``id_field`` (1, 2, 3, ... across resumes)."""

    def __init__(self, path: Path, *, id_field: str = "seq", fsync: FsyncPolicy = "step") -> None:
        self.path = path
        self.id_field = id_field
        self.fsync = fsync
        self._dirty = False
        self.last_line = ""
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self.last_id = self._repair_and_find_last_id()

    def _repair_and_find_last_id(self) -> int:
        size = os.fstat(self._fd).st_size
        tail_start, tail = _read_last_complete_line(self._fd, size)
        end = tail_start + len(tail)  # end of the last complete line, newline included
        if end != size:
            os.ftruncate(self._fd, end)  # a torn last line from a crash mid-write
            os.fsync(self._fd)
        if not tail:
            return 0
        record = json.loads(tail)
        return int(record.get(self.id_field, 0))

    def append(self, record: dict[str, Any]) -> int:
        """Number ``record``, write it as one line and flush it; return its id."""
        next_id = self.last_id + 1
        # The id goes first; splicing it into the encoded record saves copying the record into a new dict.
        body = _ENCODER.encode(record)
        line = f'{{"{self.id_field}":{next_id}' + ("," + body[1:] if len(body) > 2 else "}")
        self.write_line(line.encode() + b"\n")
        self.last_id = next_id
        self.last_line = line  # what a durable copy keeps of it, byte for byte (contexts/durable.py)
        return next_id

    def write_line(self, data: bytes) -> None:
        """Write one complete line; on a failed or short write cut the file back and raise."""
        before = os.fstat(self._fd).st_size if self.fsync == "always" else -1
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, before if before >= 0 else _size_before(self._fd, data))
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"no space left appending to {self.path.name}") from exc
            raise
        if self.fsync == "always":
            os.fsync(self._fd)
        else:
            self._dirty = True

    def sync(self) -> None:
        """fsync pending lines (the ``step`` policy calls this at the end of every step)."""
        if self._dirty and self.fsync != "never":
            os.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        """Sync and close the file."""
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


def _size_before(fd: int, data: bytes) -> int:
    """Where the file ended before a failed append: just after its last complete line."""
    return _complete_end(fd, os.fstat(fd).st_size)


def _rfind_newline(fd: int, end: int) -> int:
    """Offset of the last newline before ``end``, or -1."""
    pos = end
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        cut = os.pread(fd, step, pos).rfind(b"\n")
        if cut >= 0:
            return pos + cut
    return -1


def _complete_end(fd: int, size: int) -> int:
    """Offset just past the last newline: everything after it is a torn line."""
    return _rfind_newline(fd, size) + 1


def _read_last_complete_line(fd: int, size: int) -> tuple[int, bytes]:
    """Return (offset, bytes) of the last newline-terminated line; (0, b"") when there is none."""
    end = _complete_end(fd, size)
    if end == 0:
        return 0, b""
    start = _rfind_newline(fd, end - 1) + 1
    return start, os.pread(fd, end - start, start)


def resolve(path: Path) -> Path:
    """The file as it exists now: ``x.jsonl`` or, after retention, ``x.jsonl.gz``."""
    if not path.exists():
        gz = path.with_name(path.name + GZIP_SUFFIX)
        if gz.exists():
            return gz
    return path


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Yield records oldest first (transparently from ``.jsonl.gz``); a torn last line is ignored."""
    path = resolve(path)
    if not path.exists():
        return
    with open_no_follow(path) as raw, _damaged_archive(path):
        handle = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if path.suffix == GZIP_SUFFIX else raw
        pending: bytes | None = None
        number = 0
        for line in handle:
            if pending is not None:
                yield _parse(pending, path, number)
            number += 1
            pending = line if line.endswith(b"\n") else None
            if pending is None and line.strip():
                return  # torn last line
        if pending is not None:
            yield _parse(pending, path, number)


@contextlib.contextmanager
def _damaged_archive(path: Path) -> Iterator[None]:
    """A truncated or corrupt ``.jsonl.gz`` is bad data, said as such, not an unexpected error."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise CorruptRecordError(f"{path}: damaged gzip archive ({exc})") from exc


def iter_records_reversed(path: Path) -> Iterator[dict[str, Any]]:
    """Yield records newest first, reading blocks from the end; never reads more than it yields."""
    path = resolve(path)
    if not path.exists():
        return
    if path.suffix == GZIP_SUFFIX:  # archives are small and rare: no seeking in gzip
        yield from reversed(list(iter_records(path)))
        return
    with open_no_follow(path) as handle:
        pos = _complete_end(handle.fileno(), os.fstat(handle.fileno()).st_size)
        remainder = b""
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            chunk = os.pread(handle.fileno(), step, pos) + remainder
            lines = chunk.split(b"\n")
            remainder = lines[0]
            for line in reversed(lines[1:]):
                if line.strip():
                    yield _parse(line, path, -1)
        if remainder.strip():
            yield _parse(remainder, path, -1)


def iter_from_id(path: Path, first: int, *, id_field: str = "seq") -> Iterator[dict[str, Any]]:
    """Yield records whose ``id_field`` is at least ``first``, oldest first, without reading what comes before:
    ids grow line by line, so a binary search over byte offsets finds the first one (a torn last line is
    ignored). Costs the same at a thousand records and at a million."""
    path = resolve(path)
    if not path.exists():
        return
    if path.suffix == GZIP_SUFFIX:  # archives: no seeking in gzip, and no compression runs on them
        yield from (r for r in iter_records(path) if int(r[id_field]) >= first)
        return
    with open_no_follow(path) as handle:
        fd = handle.fileno()
        end = _complete_end(fd, os.fstat(fd).st_size)
        lo, hi = 0, end  # every line before lo has a smaller id; the first line at or after hi does not
        while hi - lo > _BLOCK:
            mid = (lo + hi) // 2
            found = _line_at_or_after(fd, mid, hi)
            if found is None:
                hi = mid
                continue
            start, line = found
            if int(_parse(line, path, -1)[id_field]) < first:
                lo = start + len(line) + 1
            else:
                hi = start
        for record in _records_between(fd, lo, end, path):
            if int(record[id_field]) >= first:
                yield record


def _line_at_or_after(fd: int, offset: int, limit: int) -> tuple[int, bytes] | None:
    """The first whole line that starts at or after ``offset`` and before ``limit``: its start and bytes."""
    position = offset
    if offset > 0:  # offset may fall inside a line: skip to the next line start
        while True:
            chunk = os.pread(fd, _BLOCK, position - 1)
            newline = chunk.find(b"\n")
            if newline >= 0:
                position = position - 1 + newline + 1
                break
            if not chunk:
                return None
            position += len(chunk)
    if position >= limit:
        return None
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.pread(fd, _BLOCK, position + len(line))
        if not chunk:
            return None
        newline = chunk.find(b"\n")
        line += chunk if newline < 0 else chunk[: newline + 1]
    return position, line[:-1]


def _records_between(fd: int, start: int, end: int, path: Path) -> Iterator[dict[str, Any]]:
    """The records of the whole lines from ``start`` (a line start) to ``end`` (a line end), in order."""
    remainder = b""
    position = start
    while position < end:
        chunk = remainder + os.pread(fd, min(_BLOCK, end - position), position)
        position += len(chunk) - len(remainder)
        lines = chunk.split(b"\n")
        remainder = lines.pop()
        for line in lines:
            if line.strip():
                yield _parse(line, path, -1)
    if remainder.strip():
        yield _parse(remainder, path, -1)


def read_head(path: Path, count: int) -> list[dict[str, Any]]:
    """The first ``count`` records."""
    out: list[dict[str, Any]] = []
    for record in iter_records(path):
        if len(out) >= count:
            break
        out.append(record)
    return out


def last_record(path: Path) -> dict[str, Any] | None:
    """The newest complete record, or ``None``."""
    return next(iter_records_reversed(path), None)


def _parse(line: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as exc:
        where = f"line {number + 1}" if number >= 0 else "a line"
        raise CorruptRecordError(f"{path}: {where} is not valid JSON") from exc
    if not isinstance(record, dict):
        raise CorruptRecordError(f"{path}: a line is not a JSON object")
    return record
