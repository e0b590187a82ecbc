"""The audit log on disk: an append-only JSON Lines file whose lines form a hash chain (issue 40 item 5).

Each line holds ``seq``, ``at``, ``actor``, ``action``, ``target``, ``outcome``, ``reason``, ``source``,
``detail``, ``prev`` (the previous line's hash) and ``hash`` (sha256 over the canonical JSON of the line
without ``hash``).  Removing, altering or reordering a line breaks the chain at that line, and a ``head``
file beside the log remembers the newest line, so cutting lines off the end is found too.  Appends from
several processes are serialized by a file lock; text is masked before it reaches the disk; the directory
is 0700 and the files 0600, since the log names people.  Pure: no Celery, no Redis, no database driver.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts.atomic import open_no_follow, read_json, write_json_atomic
from contexts.clock import iso
from contexts.errors import TasukiError
from contexts.filelocks import file_lock
from contexts.masking import mask, mask_value
from contexts.names import DIR_MODE, FILE_MODE

AUDIT_DIR = "audit"
AUDIT_FILE = "audit.jsonl"
HEAD_FILE = "head.json"
LOCK_FILE = "audit.lock"
GENESIS = "0" * 64  # the ``prev`` of the first line
LOCK_TIMEOUT_S = 30.0
FIELDS = ("seq", "at", "actor", "action", "target", "outcome", "reason", "source", "detail", "prev", "hash")
_BLOCK = 64 * 1024


class AuditError(TasukiError):
    """The audit log cannot be written or read."""


@dataclass(frozen=True)
class Event:
    """What happened, before the log numbers and chains it."""

    at: datetime
    actor: str
    action: str
    target: str = ""
    outcome: str = "ok"
    reason: str = ""
    source: str = ""
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Problem:
    """Where the chain breaks: the 1-based line number (of the file or, in a database, the row's position)."""

    line: int
    seq: int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class AuditQuery:
    """Which lines a reader wants: at or after ``since``, by ``actor`` and of ``action`` (``*`` and ``?`` match as
    in a shell: ``github:*``, ``task.*``), the newest ``limit`` of them (0: all), always printed oldest first."""

    since: datetime | None = None
    actor: str | None = None
    action: str | None = None
    limit: int = 0

    def matches(self, line: Mapping[str, Any]) -> bool:
        """Whether ``line`` is one of the wanted (``since`` aside: the readers start at it)."""
        return _like(self.actor, line.get("actor")) and _like(self.action, line.get("action"))

    def needles(self) -> list[bytes]:
        """Bytes every wanted line holds as written, to skip the others before parsing them."""
        return [f'"{key}":{json.dumps(value, ensure_ascii=False)}'.encode()
                for key, value in (("actor", self.actor), ("action", self.action))
                if value is not None and not _is_pattern(value)]


def _is_pattern(value: str) -> bool:
    return any(c in value for c in "*?[")


def _like(wanted: str | None, value: object) -> bool:
    if wanted is None:
        return True
    if not isinstance(value, str):
        return False
    return fnmatch.fnmatchcase(value, wanted) if _is_pattern(wanted) else value == wanted


def audit_dir(contexts_root: Path) -> Path:
    """The log's directory: ``audit/`` beside the contexts root (as ``memory.db`` is), never inside it, so
    retention and context listing never see it."""
    return Path(contexts_root).parent / AUDIT_DIR


def canonical(line: Mapping[str, Any]) -> bytes:
    """The bytes the hash covers: sorted keys, no spaces, UTF-8 — the same for disk and database."""
    return json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def line_hash(line: Mapping[str, Any]) -> str:
    """sha256 of the line without its ``hash`` (``prev`` included, which chains it to the line before)."""
    return hashlib.sha256(canonical({k: v for k, v in line.items() if k != "hash"})).hexdigest()


_HASH_TAIL = len(',"hash":""}') + 64


def encode(line: Mapping[str, Any]) -> bytes:
    """The line as the file holds it: its canonical bytes with the hash last, so that a verifier hashes the bytes
    it read instead of encoding each line again (at a million lines, that is most of the work)."""
    body = canonical({k: v for k, v in line.items() if k != "hash"})
    return body[:-1] + b',"hash":"' + str(line["hash"]).encode() + b'"}'


def raw_hash_matches(raw: bytes) -> bool:
    """Whether a line as read (newline stripped) is canonical and its bytes hash to the hash it ends with."""
    if len(raw) <= _HASH_TAIL or raw[-_HASH_TAIL : -_HASH_TAIL + 9] != b',"hash":"' or not raw.endswith(b'"}'):
        return False
    return hashlib.sha256(raw[:-_HASH_TAIL] + b"}").hexdigest().encode() == raw[-66:-2]


def chain(event: Event, *, seq: int, prev: str, at: str) -> dict[str, Any]:
    """The stored line for ``event`` after a line with ``prev`` as hash. Text is masked here, before any
    backend sees it; the actor and action stay as they are, since naming who did what is the log's point."""
    line: dict[str, Any] = {
        "seq": seq,
        "at": at,
        "actor": event.actor,
        "action": event.action,
        "target": mask(event.target),
        "outcome": event.outcome,
        "reason": mask(event.reason),
        "source": mask(event.source),
        "detail": mask_value(dict(event.detail or {})),
        "prev": prev,
    }
    line["hash"] = line_hash(line)
    return line


def next_at(event_at: datetime, last_at: str | None) -> str:
    """The event's time, never earlier than the line before: the log's order is the order of record, and
    time order lets ``--since`` find its first line by bisection (clocks of two processes may differ by a
    hair)."""
    at = iso(event_at)
    return last_at if last_at is not None and last_at > at else at


def check_chain(lines: Iterator[tuple[int, Mapping[str, Any] | None, bool]]) -> Iterator[Problem]:
    """Problems in a sequence of (position, line or None for unreadable, whether its hash was already checked on
    its bytes) — shared by the file and database verifiers. Stops at the first break: every later line's ``prev``
    is suspect after it."""
    prev, expected_seq = GENESIS, 1
    for number, line, hashed in lines:
        if line is None:
            yield Problem(number, None, "not a JSON object (altered)")
            return
        seq = line.get("seq")
        if not hashed and line.get("hash") != line_hash(line):
            yield Problem(number, seq, f"seq {seq}: hash does not match its content (altered)")
            return
        if seq != expected_seq or line.get("prev") != prev:
            what = "removed before it" if isinstance(seq, int) and seq > expected_seq else "reordered or replaced"
            yield Problem(number, seq, f"seq {seq} where seq {expected_seq} was due: a line {what}")
            return
        prev, expected_seq = line["hash"], expected_seq + 1


class AuditLog:
    """The log in one directory; cheap to build, opens files only when used."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / AUDIT_FILE
        self.head_path = self.directory / HEAD_FILE

    def append(self, event: Event) -> dict[str, Any]:
        """Chain ``event`` after the newest line and write it as one line; returns the stored line."""
        self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(self.directory, DIR_MODE)
        with file_lock(self.directory / LOCK_FILE, LOCK_TIMEOUT_S):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
            try:
                last = self._last_line_repairing(fd)
                seq = int(last["seq"]) + 1 if last else 1
                line = chain(event, seq=seq, prev=last["hash"] if last else GENESIS,
                             at=next_at(event.at, last["at"] if last else None))
                data = encode(line) + b"\n"
                if os.write(fd, data) != len(data):
                    raise AuditError(f"{self.path}: short write")
                os.fsync(fd)
            finally:
                os.close(fd)
            write_json_atomic(self.head_path, {"seq": seq, "hash": line["hash"]})
            os.chmod(self.head_path, FILE_MODE)
        return line

    def _last_line_repairing(self, fd: int) -> dict[str, Any] | None:
        """The newest complete line; a torn tail (a crash mid-write) is cut off first."""
        size = os.fstat(fd).st_size
        end = size
        while end > 0 and os.pread(fd, 1, end - 1) != b"\n":
            end -= 1
        if end != size:
            os.ftruncate(fd, end)
        if end == 0:
            return None
        start = max(0, end - _BLOCK)
        chunk = os.pread(fd, end - start, start)[:-1]
        while b"\n" not in chunk and start > 0:
            start = max(0, start - _BLOCK)
            chunk = os.pread(fd, end - start, start)[:-1]
        parsed: dict[str, Any] = json.loads(chunk.rsplit(b"\n", 1)[-1])
        return parsed

    def lines(self) -> Iterator[tuple[int, dict[str, Any] | None, bool]]:
        """(line number, parsed line or None when unreadable, whether its bytes hash to its hash), oldest first; a
        torn last line is left out."""
        if not self.path.exists():
            return
        with open_no_follow(self.path) as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.endswith(b"\n"):
                    return
                yield number, _parse(raw), raw_hash_matches(raw[:-1])

    def _links(self) -> Iterator[tuple[int, Mapping[str, Any] | None, bool]]:
        """:meth:`lines` for the verifier: a line whose bytes hash to its hash is canonical JSON as the writer made
        it, so its ``seq`` and ``prev`` are read off the bytes without parsing it (half the verifier's time)."""
        if not self.path.exists():
            return
        with open_no_follow(self.path) as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.endswith(b"\n"):
                    return
                if raw_hash_matches(raw[:-1]) and (link := _link(raw[:-1])) is not None:
                    yield number, link, True
                else:
                    yield number, _parse(raw), False

    def verify(self) -> list[Problem]:
        """Every line chained to the one before, numbered without gaps, and the newest matching ``head``."""
        problems = list(check_chain(self._links()))
        if problems:
            return problems
        head = read_json(self.head_path) if self.head_path.exists() else None
        if head is None:
            return []
        last = self._last()
        if last is None or int(last["seq"]) < int(head["seq"]):
            count = int(last["seq"]) if last else 0
            return [Problem(count + 1, int(head["seq"]),
                            f"the log ends at seq {count} but seq {head['seq']} was written (lines cut off the end)")]
        return []

    def _last(self) -> dict[str, Any] | None:
        for line in self.read_reversed():
            return line
        return None

    def read(self, *, since: datetime | None = None) -> Iterator[dict[str, Any]]:
        """Lines oldest first, from the first at or after ``since`` (found by bisection: lines are in time
        order), so a recent window costs the same in a large log as in a small one."""
        if not self.path.exists():
            return
        with open_no_follow(self.path) as handle:
            fd = handle.fileno()
            size = os.fstat(fd).st_size
            if since is not None:
                handle.seek(_first_offset_at_or_after(fd, size, iso(since)))
            for raw in handle:
                if raw.endswith(b"\n") and (line := _parse(raw)) is not None:
                    yield line

    def read_reversed(self) -> Iterator[dict[str, Any]]:
        """Lines newest first, reading blocks from the end (the console's and ``tasuki audit``'s default)."""
        for raw in self._raw_reversed():
            if (line := _parse(raw)) is not None:
                yield line

    def _raw_reversed(self) -> Iterator[bytes]:
        if not self.path.exists():
            return
        with open_no_follow(self.path) as handle:
            fd = handle.fileno()
            size = os.fstat(fd).st_size
            pos = _complete_end(fd, size)  # a torn last line (a writer that crashed) is nobody's line yet
            remainder = b""
            while pos > 0:
                step = min(_BLOCK, pos)
                pos -= step
                lines = (os.pread(fd, step, pos) + remainder).split(b"\n")
                remainder = lines[0]
                yield from (raw for raw in reversed(lines[1:]) if raw)
            if remainder:
                yield remainder

    def select(self, query: AuditQuery) -> Iterator[dict[str, Any]]:
        """The lines ``query`` wants, oldest first. The newest ``limit`` are found reading from the end, stopping
        at ``since``; all of them reading forward from ``since`` (bisected); either way a line is parsed only when
        it holds the query's exact words, so a filter over a million lines costs a scan of bytes."""
        needles = query.needles()
        if query.limit > 0:
            since = iso(query.since) if query.since is not None else None
            found: list[dict[str, Any]] = []
            for raw in self._raw_reversed():
                if since is not None and _raw_at(raw) < since:
                    break
                if all(n in raw for n in needles) and (line := _parse(raw)) is not None and query.matches(line):
                    found.append(line)
                    if len(found) == query.limit:
                        break
            yield from reversed(found)
            return
        if not self.path.exists():
            return
        with open_no_follow(self.path) as handle:
            if query.since is not None:
                fd = handle.fileno()
                handle.seek(_first_offset_at_or_after(fd, os.fstat(fd).st_size, iso(query.since)))
            for raw in handle:
                if (raw.endswith(b"\n") and all(n in raw for n in needles) and (line := _parse(raw)) is not None
                        and query.matches(line)):
                    yield line


def _link(raw: bytes) -> dict[str, Any] | None:
    """``seq``, ``prev`` and ``hash`` of a canonical line. Sorted keys put the top-level ``prev`` and ``seq`` after
    ``detail`` (whose keys could be named so too), and a string value holds no bare quote: the last occurrences are
    the line's own."""
    prev_at, seq_at = raw.rfind(b',"prev":"'), raw.rfind(b',"seq":')
    if prev_at < 0 or seq_at < prev_at:
        return None
    prev = raw[prev_at + 9 : prev_at + 73]
    end = seq_at + 7
    while end < len(raw) and raw[end : end + 1].isdigit():
        end += 1
    if raw[prev_at + 73 : prev_at + 74] != b'"' or end == seq_at + 7 or raw[end : end + 1] not in (b",", b"}"):
        return None
    return {"seq": int(raw[seq_at + 7 : end]), "prev": prev.decode(), "hash": raw[-66:-2].decode()}


def _raw_at(raw: bytes) -> str:
    """A line's ``at`` without parsing it (written second, after ``seq``); empty when it is not there."""
    start = raw.find(b'"at":"')
    return raw[start + 6 : raw.find(b'"', start + 6)].decode() if start >= 0 else ""


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _first_offset_at_or_after(fd: int, size: int, at: str) -> int:
    """Byte offset of the first line whose ``at`` is not before ``at``; bisects over line starts."""

    class _Starts:
        """Line starts found lazily by offset: the k-th probe reads the line at or after byte k."""

        def __len__(self) -> int:
            return size

        def __getitem__(self, offset: int) -> str:
            start = _line_start_at_or_after(fd, offset, size)
            if start >= size:
                return "\uffff"
            line = _parse(_read_line(fd, start, size)) or {}
            return str(line.get("at", "\uffff"))

    offset = bisect_left(_Starts(), at)
    return _line_start_at_or_after(fd, offset, size)


def _complete_end(fd: int, size: int) -> int:
    """The end of the last complete line (just after its newline)."""
    pos = size
    while pos > 0:
        start = max(0, pos - 4096)
        index = os.pread(fd, pos - start, start).rfind(b"\n")
        if index >= 0:
            return start + index + 1
        pos = start
    return 0


def _line_start_at_or_after(fd: int, offset: int, size: int) -> int:
    if offset == 0:
        return 0
    pos = offset - 1  # a line starts at ``offset`` when the byte before it is a newline
    while pos < size:
        chunk = os.pread(fd, min(4096, size - pos), pos)
        index = chunk.find(b"\n")
        if index >= 0:
            return pos + index + 1
        pos += len(chunk)
    return size


def _read_line(fd: int, start: int, size: int) -> bytes:
    out = b""
    pos = start
    while pos < size:
        chunk = os.pread(fd, min(4096, size - pos), pos)
        index = chunk.find(b"\n")
        if index >= 0:
            return out + chunk[:index]
        out += chunk
        pos += len(chunk)
    return out
