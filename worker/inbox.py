"""A running task's inbox (SPEC §14): comments that arrived while it works, taken from their Redis list only once
they are in the context.

The intake appends each comment, with an ``id``, to ``tasuki:inbox:UUID``. At a step boundary the task reads the
list without removing anything, appends what the reporter lets through as user messages (each with its
``inbox_id``), writes the step, and only then trims what it read. A worker that dies before the step is on disk
leaves every comment in the list for the attempt that resumes; one that dies after it but before the trim leaves
comments the context already holds at its end, which the resumed attempt recognises by their ids and trims
without appending them twice. Redis away: the comments wait in the list for a later step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import redis
import structlog

from agent.prompts import comment_message
from contexts import jsonl
from contexts.masking import mask
from contexts.names import MESSAGES_FILE
from worker.names import ACTIVE_PREFIX, INBOX_PREFIX
from worker.submit import task_key_id

log = structlog.get_logger(__name__)

INBOX_TTL_S = 8 * 24 * 3600

# The task must still be the active one of its task key: checked and pushed in one step, so a task that has let
# its key go (it read its inbox for the last time before that) is never handed a comment it would not read.
_DELIVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""


def deliver(client: redis.Redis, task_key: dict[str, str], uuid: str, entry: dict[str, Any]) -> bool:
    """Put ``entry`` in the inbox of task ``uuid`` if it is still its task key's active task; False if not
    (it has ended, or is ending: the comment is for whatever starts next)."""
    keys = (ACTIVE_PREFIX + task_key_id(task_key), INBOX_PREFIX + uuid)
    return bool(client.eval(_DELIVER, 2, *keys, uuid, json.dumps(entry), INBOX_TTL_S))


def take_leftovers(client: redis.Redis, uuid: str) -> list[dict[str, Any]]:
    """Empty the inbox of a task that has ended and let its task key go (nothing more can arrive): the comments
    delivered after its last look, and any it heard but could not trim."""
    pipe = client.pipeline(transaction=True)
    pipe.lrange(INBOX_PREFIX + uuid, 0, -1)
    pipe.delete(INBOX_PREFIX + uuid)
    raw, _ = pipe.execute()
    return _entries(raw)


def _entries(raw: list[Any]) -> list[dict[str, Any]]:
    """The readable records of an inbox list (anything else is skipped)."""
    entries = []
    for item in raw:
        try:
            entry = json.loads(item)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def heard_ids(messages: Any) -> set[str]:
    """The inbox ids of the comments a context's ``messages.jsonl`` holds."""
    return {str(r["inbox_id"]) for r in jsonl.iter_records(messages) if r.get("inbox") and r.get("inbox_id")}


def read_inbox(client: redis.Redis, uuid: str) -> tuple[list[dict[str, Any]], int]:
    """The comments waiting for a running task, oldest first, and how many list items were read (unreadable items
    included: they are trimmed with the rest). Nothing is removed."""
    raw = client.lrange(INBOX_PREFIX + uuid, 0, -1)
    return _entries(raw), len(raw)


def trim_inbox(client: redis.Redis, uuid: str, count: int) -> None:
    """Drop the ``count`` oldest items, which are in the context now (comments appended since stay)."""
    client.ltrim(INBOX_PREFIX + uuid, count, -1)


class Transcript(Protocol):
    """What the inbox needs of a context."""

    path: Any  # the context directory

    def append_message(self, role: str, content: str | None, **extra: Any) -> int:
        """Append one (masked) message."""
        ...


def _ids_at_the_end(ctx: Transcript) -> set[str]:
    """Ids of the inbox messages that close the context: the only ones a trim can have missed."""
    ids = set()
    for record in jsonl.iter_records_reversed(ctx.path / MESSAGES_FILE):
        if record.get("role") != "user" or not record.get("inbox"):
            break
        if record.get("inbox_id"):
            ids.add(str(record["inbox_id"]))
    return ids


class Inbox:
    """One attempt's view of its task's inbox: ``hear`` appends new comments, ``taken`` trims what was read."""

    def __init__(self, read: Callable[[], tuple[list[dict[str, Any]], int]], trim: Callable[[int], None],
                 passes: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        self.read = read
        self.trim = trim
        self.passes = passes  # the reporter's filter: what the model gets, or None to drop the comment
        self._appended: set[str] | None = None  # ids this context holds (found at the first read of the attempt)
        self._read = 0

    def hear(self, ctx: Transcript) -> int:
        """Append the comments not yet in the context as user messages; returns how many were appended."""
        try:
            entries, self._read = self.read()
        except Exception as exc:
            log.warning("inbox not read", error=mask(str(exc))[:300])
            self._read = 0
            return 0
        if self._appended is None:
            self._appended = _ids_at_the_end(ctx) if entries else set()
        count = 0
        for entry in entries:
            inbox_id = str(entry["id"]) if entry.get("id") else None
            if inbox_id is not None and inbox_id in self._appended:
                continue
            try:
                passed = self.passes(entry)
            except Exception as exc:
                log.warning("comment not taken", error=mask(str(exc))[:300])
                continue
            if passed is not None:
                ctx.append_message("user", comment_message(passed), inbox=True,
                                   **({"inbox_id": inbox_id} if inbox_id else {}))
                count += 1
            if inbox_id is not None:
                self._appended.add(inbox_id)
        return count

    def taken(self) -> None:
        """The step holding the comments is on disk: trim what was read (a failed trim is redone by the next)."""
        if not self._read:
            return
        try:
            self.trim(self._read)
        except Exception as exc:
            log.warning("inbox not trimmed", error=mask(str(exc))[:300])
        self._read = 0
