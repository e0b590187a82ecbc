"""``requests.jsonl``: the request each model call of a task sent, step by step (issue 37).

After a summary or an omission the prompt is not the history, so ``messages.jsonl`` alone cannot say what a step
asked. Each record keeps the provider-neutral prompt (the OpenAI-style messages and tool schemas handed to
``Provider.chat``) and the body as it went on the wire, masked before it reaches the disk.

A request repeats most of the previous one, so storing each whole would grow with the square of the task's length.
A record is stored as a *delta* against the previous record of its kind written by the same holder (``base``): a
dict is its fields' deltas, a list is a run of ``copy`` (items ``start .. start+count`` of the base's list) and
``add`` (new items) operations, so a request that appends two messages stores two messages, and a window that drops
its oldest messages or moves a marker stores the marker. The delta is compressed (zlib, then base85 to stay a JSON
string: the line is an ordinary JSONL line, torn tails and the fleet's durable copy included). A holder's first
record has no base; a reader rebuilds every request by applying the deltas in order.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from contexts import jsonl
from contexts.clock import iso
from contexts.errors import ContextNotFoundError, CorruptRecordError
from contexts.masking import OPAQUE_REASONING_KEYS, mask
from contexts.names import REQUESTS_FILE

ID_FIELD = "request_id"
ENCODING = "delta+zlib+b85"
KINDS = ("agent", "summary")
_LOOKUPS = 4  # positions of an item in the base tried for the longest run (items repeat: nudges, markers)
REASONING_TYPES = frozenset({"reasoning", "thinking", "redacted_thinking"})
"""Items whose opaque fields (a signature, ciphertext) are kept byte for byte, as ``messages.jsonl`` keeps them."""


class RequestNotFound(ContextNotFoundError):
    """The context recorded no request for the step asked for (what was asked for does not exist, like a UUID)."""


@dataclass(frozen=True)
class SentRequest:
    """One model call's request, as the worker hands it over to be recorded."""

    step: int
    """The agent step the call belongs to (1 is the first model call; a summary: the step it was made before)."""
    kind: str
    """``agent`` or ``summary`` (a compression's request)."""
    profile: str | None
    provider: str | None
    model: str | None
    messages: list[dict[str, Any]]
    """The provider-neutral prompt: OpenAI-style messages as passed to ``Provider.chat``."""
    tools: list[dict[str, Any]] | None
    wire: Mapping[str, Any] | None
    """The body as sent (``Reply.request``); None when the provider gave none."""
    reply_seq: int | None = None
    """The ``messages.jsonl`` seq of the reply it got (an agent call)."""


@dataclass(frozen=True)
class RecordedRequest:
    """A request rebuilt from ``requests.jsonl`` (masked, as recorded)."""

    request_id: int
    step: int
    kind: str
    profile: str | None
    provider: str | None
    model: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    wire: dict[str, Any] | None
    reply_seq: int | None
    timestamp: str | None
    stored_bytes: int = field(default=0, compare=False)
    """The record's line on disk: what the delta and its compression cost."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of everything recorded."""
        return {
            "request_id": self.request_id,
            "step": self.step,
            "kind": self.kind,
            "profile": self.profile,
            "provider": self.provider,
            "model": self.model,
            "reply_seq": self.reply_seq,
            "timestamp": self.timestamp,
            "messages": self.messages,
            "tools": self.tools,
            "wire": self.wire,
        }


# -- deltas ------------------------------------------------------------------------------------------------------

_ABSENT = object()


def delta(current: Any, base: Any = _ABSENT) -> dict[str, Any]:
    """``current`` as changes to ``base``: ``{"same": true}``, ``{"fields": {...}}`` (a dict, field by field),
    ``{"list": [ops]}`` (a list: ``["copy", start, count]`` of the base's items, ``["add", [items]]``) or
    ``{"value": v}``. New values are masked here: what the base holds was masked when it was recorded."""
    if base is not _ABSENT and current == base:
        return {"same": True}
    if isinstance(current, dict) and isinstance(base, dict):
        return {"fields": {mask(key): delta(value, base.get(key, _ABSENT)) for key, value in current.items()}}
    if isinstance(current, list) and isinstance(base, list):
        return {"list": list_ops(current, base)}
    return {"value": masked(current)}


def list_ops(current: list[Any], base: list[Any]) -> list[list[Any]]:
    """``current`` as runs copied from ``base`` and items added: first the prefix the two share (a request that only
    appended, the common case, costs one comparison per item), then, greedily, each further item looked up in the rest
    of the base and the longest run from the few places it occurs copied; what is found nowhere is added (masked)."""
    prefix = 0
    while prefix < min(len(current), len(base)) and current[prefix] == base[prefix]:
        prefix += 1
    ops: list[list[Any]] = [["copy", 0, prefix]] if prefix else []
    if prefix == len(current):
        return ops
    base_keys = {position: _key(base[position]) for position in range(prefix, len(base))}
    where: dict[str, list[int]] = {}
    for position, key in base_keys.items():
        where.setdefault(key, []).append(position)
    keys = [_key(item) for item in current[prefix:]]
    added: list[Any] = []
    index, expected = 0, prefix
    while index < len(keys):
        places = where.get(keys[index], [])
        candidates = ([expected] if expected in places else []) + places[:_LOOKUPS]
        start, count = 0, 0
        for place in candidates:
            run = _run(keys, index, base_keys, place)
            if run > count:
                start, count = place, run
        if count == 0:
            added.append(masked(current[prefix + index]))
            index += 1
            continue
        if added:
            ops.append(["add", added])
            added = []
        ops.append(["copy", start, count])
        index += count
        expected = start + count
    if added:
        ops.append(["add", added])
    return ops


def masked(value: Any) -> Any:
    """``value`` with every string masked, except the opaque fields of reasoning items (Responses' reasoning,
    Claude's thinking blocks): masking cannot find a secret in ciphertext, and a changed byte would make the API
    refuse the item; their readable text was checked when the reply was recorded (``contexts.masking.mask_reasoning``
    drops an item whose text holds something to mask)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        opaque = value.get("type") in REASONING_TYPES
        return {
            mask(key) if isinstance(key, str) else key: item
            if opaque and key in OPAQUE_REASONING_KEYS
            else masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [masked(item) for item in value]
    return value


def _run(keys: list[str], index: int, base_keys: dict[int, str], start: int) -> int:
    count = 0
    while index + count < len(keys) and base_keys.get(start + count) == keys[index + count]:
        count += 1
    return count


def _key(item: Any) -> str:
    return json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def apply_delta(change: Mapping[str, Any], base: Any) -> Any:
    """The value ``change`` (from :func:`delta`) describes against ``base``; :class:`ValueError` when the two do
    not fit (a base that is not the one the delta was made against)."""
    if change.get("same"):
        if base is _ABSENT:
            raise ValueError("'same' without a base")
        return base
    if "value" in change:
        return change["value"]
    if "fields" in change:
        fields = base if isinstance(base, dict) else {}
        return {key: apply_delta(part, fields.get(key, _ABSENT)) for key, part in change["fields"].items()}
    if "list" in change:
        if not isinstance(base, list):
            raise ValueError("a list delta without a list to apply it to")
        out: list[Any] = []
        for op in change["list"]:
            if op[0] == "copy":
                start, count = int(op[1]), int(op[2])
                if start < 0 or start + count > len(base):
                    raise ValueError("a copied run beyond the base's list")
                out.extend(base[start : start + count])
            elif op[0] == "add":
                out.extend(op[1])
            else:
                raise ValueError(f"unknown list operation {op[0]!r}")
        return out
    raise ValueError("an empty delta")


def pack(value: Any) -> str:
    """``value`` as compressed JSON in a string that needs no escaping inside a JSON line."""
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.b85encode(zlib.compress(raw, 6)).decode("ascii")


def unpack(text: str) -> Any:
    """The value :func:`pack` packed."""
    return json.loads(zlib.decompress(base64.b85decode(text.encode("ascii"))))


# -- writing -------------------------------------------------------------------------------------------------------


def _payload(sent: SentRequest) -> dict[str, Any]:
    # Neutral messages first, the wire body right after: their new items sit close together, where zlib's window
    # finds the one repeating the other.
    return {"messages": sent.messages, "tools": sent.tools, "wire": dict(sent.wire) if sent.wire is not None else None}


class RequestLog:
    """The one writer of a context's ``requests.jsonl``: opened on the first record (a context that made no call
    has none), each record a delta against this holder's previous record of its kind."""

    def __init__(self, fsync: jsonl.FsyncPolicy) -> None:
        self.fsync = fsync
        self.writer: jsonl.JsonlWriter | None = None
        self._previous: dict[str, tuple[int, dict[str, Any]]] = {}  # kind -> (request_id, payload as sent)

    @property
    def last_line(self) -> str:
        return self.writer.last_line if self.writer is not None else ""

    def append(self, home: Path, sent: SentRequest, now: datetime) -> int:
        """Encode and append ``sent``; returns its ``request_id``."""
        if sent.kind not in KINDS:
            raise ValueError(f"not a request kind: {sent.kind!r}")
        if self.writer is None:
            self.writer = jsonl.JsonlWriter(home / REQUESTS_FILE, id_field=ID_FIELD, fsync=self.fsync)
        payload = _payload(sent)
        previous = self._previous.get(sent.kind)
        change = delta(payload, previous[1]) if previous is not None else delta(payload)
        record = {
            "step": sent.step,
            "kind": sent.kind,
            "profile": sent.profile,
            "provider": sent.provider,
            "model": sent.model,
            "reply_seq": sent.reply_seq,
            "timestamp": iso(now),
            "base": previous[0] if previous is not None else None,
            "encoding": ENCODING,
            "body": pack(change),
        }
        request_id = self.writer.append(record)
        self._previous[sent.kind] = (request_id, payload)  # only once it is on disk: the next delta's base
        return request_id

    def sync(self) -> None:
        if self.writer is not None:
            self.writer.sync()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# -- reading -------------------------------------------------------------------------------------------------------


def recorded_requests(directory: Path) -> Iterator[RecordedRequest]:
    """Every request of the context in ``directory``, rebuilt, oldest first (``requests.jsonl.gz`` after retention
    too; a torn last line is left out). :class:`CorruptRecordError` when a record does not fit its base."""
    path = directory / REQUESTS_FILE
    latest: dict[int, dict[str, Any]] = {}  # request_id -> payload, of the newest record of each kind
    newest_of: dict[str, int] = {}
    for record in jsonl.iter_records(path):
        request_id = int(record[ID_FIELD])
        base_id = record.get("base")
        try:
            if record.get("encoding") != ENCODING:
                raise ValueError(f"unknown encoding {record.get('encoding')!r}")
            if base_id is not None and base_id not in latest:
                raise ValueError(f"its base {base_id} is not the newest request of its kind")
            payload = apply_delta(unpack(str(record["body"])), latest[base_id] if base_id is not None else _ABSENT)
        except (ValueError, KeyError, TypeError, zlib.error) as exc:
            raise CorruptRecordError(f"{path}: request {request_id} cannot be rebuilt ({exc})") from exc
        kind = str(record.get("kind"))
        if kind in newest_of:
            latest.pop(newest_of[kind], None)
        latest[request_id], newest_of[kind] = payload, request_id
        yield RecordedRequest(
            request_id=request_id,
            step=int(record["step"]),
            kind=kind,
            profile=record.get("profile"),
            provider=record.get("provider"),
            model=record.get("model"),
            messages=list(payload.get("messages") or []),
            tools=payload.get("tools"),
            wire=payload.get("wire"),
            reply_seq=record.get("reply_seq"),
            timestamp=record.get("timestamp"),
            stored_bytes=len(json.dumps(record, ensure_ascii=False, separators=(",", ":"))) + 1,
        )


def request_of_step(directory: Path, step: int, kind: str = "agent") -> RecordedRequest:
    """The request ``kind`` sent at ``step`` (the last one when a step asked twice); :class:`RequestNotFound`, saying
    which steps there are, when it has none."""
    found: RecordedRequest | None = None
    steps: list[int] = []
    for request in recorded_requests(directory):
        if request.kind != kind:
            continue
        steps.append(request.step)
        if request.step == step:
            found = request
    if found is not None:
        return found
    what = "requests" if kind == "agent" else f"{kind} requests"
    if not steps:
        raise RequestNotFound(f"context {directory.name} recorded no {what}")
    raise RequestNotFound(
        f"step {step} is out of range: context {directory.name} recorded {what} of steps {_ranges(sorted(set(steps)))}"
    )


def _ranges(steps: list[int]) -> str:
    """``1-12, 14`` for 1..12 and 14."""
    parts: list[str] = []
    start = previous = steps[0]
    for step in [*steps[1:], None]:
        if step is not None and step == previous + 1:
            previous = step
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if step is not None:
            start = previous = step
    return ", ".join(parts)
