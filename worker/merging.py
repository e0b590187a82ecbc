"""Repository merges, coalesced (SPEC §13): at most one merge job queued per repository at any time.

A thread whose memory changed waits in a Redis hash (thread key -> the task that changed it last) and a flag
(``SET NX EX``) says that a merge job is queued.  The job takes the repository's running lock, clears the
flag, reads the waiting threads, merges them all in one model call, then removes exactly the threads it
merged: one flagged again by a newer task meanwhile stays for the next job, which that task's flag queued.
A job that crashes mid-way leaves its threads waiting; the next update of the repository merges them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import redis
import structlog

from contexts.masking import mask
from worker.names import MERGE_QUEUED_PREFIX, MERGE_RUNNING_PREFIX, MERGE_WAITING_PREFIX

log = structlog.get_logger(__name__)

QUEUED_TTL_S = 3600  # a queued job whose message was lost stops holding back new ones after this
RUNNING_TTL_S = 900  # a merge job that died stops holding back the next one after this
RETRY_S = 2.0  # a job that finds another merge of its repository running tries again after this
# A merge job waits this long before it runs, so that the threads of a burst of tasks ending one after another
# wait for the same job (a free maintenance worker would otherwise take each task's job at once: no batch).
DELAY_S = 5.0

# ARGV: thread, UUID, thread, UUID, ...: each thread goes only while it still holds the UUID the job merged.
_UNFLAG = """
for i = 1, #ARGV, 2 do
  if redis.call('hget', KEYS[1], ARGV[i]) == ARGV[i + 1] then redis.call('hdel', KEYS[1], ARGV[i]) end
end
return 0
"""
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def request_merge(
    client: Callable[[], redis.Redis], repository: str, thread: str, uuid: str, enqueue: Callable[[str], Any]
) -> bool:
    """Mark ``thread`` waiting for its repository's merge and queue a merge job unless one is queued; True when
    this call queued it. Never raises: a thread Redis did not flag is merged by the next update of its repository."""
    try:
        connection = client()
        connection.hset(MERGE_WAITING_PREFIX + repository, thread, uuid)  # first: a job queued before must see it
        return queue_merge(connection, repository, enqueue)
    except Exception as exc:  # memory never fails a task (SPEC §13)
        log.warning("memory: repository merge not flagged", thread=thread, error=mask(str(exc))[:300])
        return False


def queue_merge(client: redis.Redis, repository: str, enqueue: Callable[[str], Any]) -> bool:
    """Queue a merge job for the repository unless one is queued (``SET NX EX``); True when this call queued it."""
    if not client.set(MERGE_QUEUED_PREFIX + repository, 1, nx=True, ex=QUEUED_TTL_S):
        return False
    try:
        enqueue(repository)
    except Exception:
        client.delete(MERGE_QUEUED_PREFIX + repository)  # no job is queued: the next flag queues one
        raise
    return True


def start_merge(client: redis.Redis, repository: str, token: str) -> dict[str, str] | None:
    """Claim the repository's merge: ``None`` while another job runs one; else clear the queued flag (a thread
    flagged from now on queues the next job) and return the waiting threads (thread -> UUID)."""
    if not client.set(MERGE_RUNNING_PREFIX + repository, token, nx=True, ex=RUNNING_TTL_S):
        return None
    client.delete(MERGE_QUEUED_PREFIX + repository)
    waiting = client.hgetall(MERGE_WAITING_PREFIX + repository)
    return {_text(thread): _text(uuid) for thread, uuid in waiting.items()}


def finish_merge(client: redis.Redis, repository: str, merged: Mapping[str, str]) -> None:
    """Remove exactly the threads merged: a thread a newer task flagged meanwhile (another UUID) stays waiting."""
    if merged:
        client.eval(_UNFLAG, 1, MERGE_WAITING_PREFIX + repository, *(v for pair in merged.items() for v in pair))


def release_merge(client: redis.Redis, repository: str, token: str) -> None:
    """Let the next merge of the repository run (only the lock this job holds: an expired one may be another's)."""
    client.eval(_RELEASE, 1, MERGE_RUNNING_PREFIX + repository, token)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
