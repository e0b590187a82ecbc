"""Admitting a task into the queue in one Redis round trip (SPEC §2, §8): dedupe the delivery, claim the task
key, remember the task key by UUID and push the message, all or nothing.

One Lua script does it, so a duplicate delivery or an active task key writes nothing but what it checked, and
no other client ever sees a claimed key without its message (or the reverse). A later check (a budget, say)
joins the script as one more guard before the writes: its keys after KEYS[4] and its arguments after ARGV[5]
(fields of ``Admission``), its refusal one more ``Outcome``.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Literal, cast

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from worker.task_message import QueuedMessage

Outcome = Literal["enqueued", "active", "duplicate"]

# KEYS: active key, task key by UUID, queue list, delivery key ('' for none; it holds the UUID that claimed it)
# ARGV: uuid, ttl of both keys, task key JSON, message, ttl of the delivery key
ADMIT_LUA = """
local queue_type = redis.call('TYPE', KEYS[3])['ok']
if queue_type ~= 'none' and queue_type ~= 'list' then
  -- checked before any write: a script that fails half-way keeps the writes it made
  return redis.error_reply('WRONGTYPE the queue ' .. KEYS[3] .. ' is a ' .. queue_type .. ', not a list')
end
if KEYS[4] ~= '' and not redis.call('SET', KEYS[4], ARGV[1], 'NX', 'EX', ARGV[5]) then
  if redis.call('GET', KEYS[4]) == ARGV[1] and redis.call('GET', KEYS[1]) == ARGV[1] then
    return {'enqueued', ARGV[1]}  -- this very admission, run again by a client that lost the reply
  end
  return {'duplicate', ''}
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return {'active', redis.call('GET', KEYS[1])}
end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2])
redis.call('LPUSH', KEYS[3], ARGV[4])
return {'enqueued', ARGV[1]}
"""
ADMIT_SHA = hashlib.sha1(ADMIT_LUA.encode(), usedforsecurity=False).hexdigest()
MAX_BATCH = 64  # admissions in one pipeline: a bound on the write, far above what a busy intake gathers


@dataclass(frozen=True)
class Admission:
    """Everything the script needs to admit one task: its keys, their lifetimes and the message."""

    uuid: str
    active_key: str  # ACTIVE_PREFIX + task key: holds the UUID of its queued or running task
    task_record_key: str  # TASK_PREFIX + UUID: the task key, for the API and cancels while it is queued
    task_key_json: str
    ttl_s: int
    message: QueuedMessage
    delivery_key: str | None = None  # a webhook delivery, claimed first: a redelivery admits nothing
    delivery_ttl_s: int = 0

    def keys(self) -> list[str]:
        """The script's KEYS."""
        return [self.active_key, self.task_record_key, self.message.queue_key, self.delivery_key or ""]

    def args(self) -> list[str | int]:
        """The script's ARGV."""
        return [self.uuid, self.ttl_s, self.task_key_json, self.message.payload, self.delivery_ttl_s]


@dataclass(frozen=True)
class Admitted:
    """What the script did: enqueued this task, found the task key active (``uuid`` is the active task), or
    found the delivery already seen (``uuid`` is empty)."""

    outcome: Outcome
    uuid: str


def _admitted(admission: Admission, reply: list[bytes | str]) -> Admitted:
    outcome, uuid = (part.decode() if isinstance(part, bytes) else str(part) for part in reply)
    if outcome == "active" and uuid == admission.uuid:
        # The client retried a script whose reply was lost: the task key is ours, the message was pushed.
        outcome = "enqueued"
    return Admitted(cast(Outcome, outcome), uuid)


def admit(client: redis.Redis, admission: Admission) -> Admitted:
    """Run the admission on a blocking client."""
    script = client.register_script(ADMIT_LUA)
    return _admitted(admission, script(keys=admission.keys(), args=admission.args()))


class Admissions:
    """Admissions on an asyncio client, sent in batches: those that arrive while a batch is in flight go to Redis
    together in the next pipeline, one write, one read and one wake-up of the event loop for all of them rather
    than for each (bench/bench_webhook.py: the intake's CPU per delivery at 50 senders fell by about a tenth).
    Each script still runs on its own, all or nothing; a lone delivery is a batch of one. One per event loop.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self._waiting: list[tuple[Admission, asyncio.Future[Admitted]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def admit(self, admission: Admission) -> Admitted:
        """Run ``admission`` with whatever else is waiting; raises what Redis raised for it."""
        admitted: asyncio.Future[Admitted] = asyncio.get_running_loop().create_future()
        self._waiting.append((admission, admitted))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_waiting())
        return await admitted

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                try:
                    replies = await self._run(batch)
                except Exception as exc:  # the connection failed: none of them is known to have run
                    replies = [exc] * len(batch)
                for (admission, admitted), reply in zip(batch, replies, strict=True):
                    if admitted.done():  # its delivery was cancelled (the sender hung up); the script ran
                        continue
                    if isinstance(reply, Exception):
                        admitted.set_exception(reply)
                    else:
                        admitted.set_result(_admitted(admission, cast(list[bytes | str], reply)))
        finally:
            self._sender = None

    async def _run(self, batch: list[tuple[Admission, asyncio.Future[Admitted]]]) -> list[object]:
        replies = await self._pipeline(batch)
        if any(isinstance(reply, NoScriptError) for reply in replies):  # a new or restarted Redis
            await self.client.script_load(ADMIT_LUA)
            replies = await self._pipeline(batch)
        return replies

    async def _pipeline(self, batch: list[tuple[Admission, asyncio.Future[Admitted]]]) -> list[object]:
        pipe = self.client.pipeline(transaction=False)
        for admission, _ in batch:
            keys = admission.keys()
            pipe.evalsha(ADMIT_SHA, len(keys), *keys, *admission.args())
        replies: list[object] = await pipe.execute(raise_on_error=False)
        return replies
