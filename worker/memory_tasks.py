"""Memory's Celery side (SPEC §13): the ending subscriber that records a task's episode, ``tasuki.update_memory``
(embedding and thread memory) and ``tasuki.merge_memory`` (waiting thread memories into the repository memory,
coalesced by :mod:`worker.merging`), both on the ``maintenance`` queue."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from celery import Task

from agent.seams import usage_of
from contexts import TasukiError
from contexts.atomic import read_json
from contexts.clock import utc_now
from contexts.masking import mask
from contexts.names import METADATA_FILE
from contexts.usage import Usage, repo_of
from memory import MemoryUnavailable
from memory.facts import context_paths
from worker.celery import app
from worker.endings import Ending, on_ending
from worker.merging import DELAY_S, RETRY_S, finish_merge, queue_merge, release_merge, request_merge, start_merge
from worker.metering import Meter
from worker.names import MAINTENANCE_QUEUE, MERGE_MEMORY, UPDATE_MEMORY
from worker.outcome_tasks import respend
from worker.profiles import PROFILE_KEY
from worker.remembering import merge_repository, next_merge, record_episode, update_memories
from worker.runtime import context_store, llm_config, provider_for, redis_client, settings
from worker.settings_models import Settings
from worker.stores import open_memory

log = structlog.get_logger(__name__)


@on_ending("memory")
def _remember(ending: Ending) -> None:
    """Record the task's episode; a thread's first episode becomes its memory here when no model and no embedding
    is needed (then only the repository merge is flagged), else ``update_memory`` runs off the task."""
    s = settings()
    directory = finished_directory(s, ending.uuid)
    request = ending.request or recorded_request(directory) or {"task_key": ending.task_key}
    if request.get("grading"):  # an eval task: what it did must not teach the tasks that come after it
        log.info("memory: an eval task records no episode")
        return
    # No finished context (cannot_start had no contexts root): an episode from the request alone.
    recorded = record_episode(s, ending.uuid, request, ending.status, directory)
    if recorded is None or recorded.next == "nothing":
        return
    if recorded.next == "merge":
        flag_merge(recorded.episode.repository, recorded.episode.thread, ending.uuid)
        return
    try:
        update_memory.apply_async(args=[ending.uuid], queue=MAINTENANCE_QUEUE)
    except Exception as exc:  # a broker blip: the episode is stored; only the memory update is skipped
        log.warning("memory update not enqueued", error=mask(str(exc))[:300])


def recorded_request(directory: Path | None) -> dict[str, Any] | None:
    """The request a finished context recorded (the monitor's endings carry none); None when it cannot be read."""
    if directory is None:
        return None
    try:
        request = read_json(directory / METADATA_FILE).get("request")
    except (OSError, ValueError, AttributeError, TasukiError):  # a damaged context: treated as no eval
        return None
    return request if isinstance(request, dict) else None


def flag_merge(repository: str, thread: str, uuid: str) -> None:
    """Have the thread merged into its repository memory by the repository's one queued merge job."""
    request_merge(redis_client, repository, thread, uuid, enqueue_merge)


def enqueue_merge(repository: str) -> None:
    """Send ``tasuki.merge_memory`` for the repository, to run after ``DELAY_S`` (callers hold its queued flag)."""
    merge_memory.apply_async(args=[repository], queue=MAINTENANCE_QUEUE, countdown=DELAY_S)


@app.task(name=UPDATE_MEMORY, bind=True)
def update_memory(self: Task, uuid: str) -> dict[str, Any]:
    """Embed the episode of task ``uuid`` and update its thread memory, then flag the repository merge (on
    ``maintenance``). Its model calls are metered in the task's ``state.json`` in one write."""
    structlog.contextvars.bind_contextvars(uuid=uuid)
    try:
        s = settings()
        spent = MemoryCalls(s, finished_directory(s, uuid), uuid)
        try:
            store = open_memory(s, must_exist=True)  # no store: no episode was recorded, nothing to update
        except MemoryUnavailable as exc:
            log.warning("memory update skipped", error=str(exc))
            return {"uuid": uuid, "status": "memory unavailable"}
        try:
            outcome = update_memories(s, store, uuid, spent.chat, utc_now(), spent.embedded, paths_of(s))
        except MemoryUnavailable as exc:
            log.warning("memory update stopped", error=str(exc))
            return {"uuid": uuid, "status": "memory unavailable"}
        finally:
            store.close()
            spent.meter()
        if outcome.get("merge"):
            repository, thread = outcome["merge"]
            flag_merge(repository, thread, uuid)
        return outcome
    finally:
        structlog.contextvars.unbind_contextvars("uuid")


@app.task(name=MERGE_MEMORY, bind=True, max_retries=None)
def merge_memory(self: Task, repository: str) -> dict[str, Any]:
    """Merge every thread memory waiting for ``repository`` into its repository memory in one model call (on
    ``maintenance``; at most one such job is queued per repository, see ``worker.merging``). The call is metered
    in the finished ``state.json`` of the newest task merged: one job covers several tasks, one of them pays."""
    client, token = redis_client(), str(self.request.id or utc_now().timestamp())
    waiting = start_merge(client, repository, token)
    if waiting is None:  # another merge of this repository runs: this one waits for it (the flag stays set)
        raise self.retry(countdown=RETRY_S)
    try:
        if not waiting:
            return {"repository": repository, "status": "nothing waiting"}
        s = settings()
        try:
            store = open_memory(s, must_exist=True)
        except MemoryUnavailable as exc:
            log.warning("memory merge skipped", error=str(exc))
            return {"repository": repository, "status": "memory unavailable"}
        try:
            batch = next_merge(s, store, repository, waiting, utc_now())
            spent = MemoryCalls(s, finished_directory(s, batch.newest) if batch.newest else None, batch.newest)
            try:
                status = "nothing to merge"
                if batch.threads:
                    status = merge_repository(s, store, repository, batch.threads, spent.chat, utc_now(),
                                              paths_of(s))
            finally:
                spent.meter()
        except (MemoryUnavailable, TasukiError) as exc:  # the threads stay waiting for the next merge
            log.warning("memory merge stopped", error=mask(str(exc))[:300])
            return {"repository": repository, "status": "stopped"}
        finally:
            store.close()
        finish_merge(client, repository, batch.merged)
        if batch.left:  # more than one request holds: the next job takes the rest
            queue_merge(client, repository, enqueue_merge)
        return {
            "repository": repository,
            "status": status,
            "threads": sorted(batch.merged),
            "left": batch.left,
            "metered": batch.newest,
        }
    finally:
        release_merge(client, repository, token)


def finished_directory(s: Settings, uuid: str) -> Path | None:
    """The finished context of ``uuid``, None when there is none (a task that could not create one)."""
    try:
        directory = context_store(s, index=False).completed_path(uuid)
    except (OSError, TasukiError):
        return None
    return directory if directory.is_dir() else None


def paths_of(s: Settings) -> Callable[[str], set[str]]:
    """A task's UUID -> the paths its tool calls named, from its finished context while this host keeps it: what a
    memory may name besides the files its episodes changed (``memory.facts``)."""
    return lambda uuid: context_paths(finished_directory(s, uuid))


class MemoryCalls:
    """A memory job's model calls and embeddings, in the task's model, metered in its finished context in ONE
    ``state.json`` write when the job is done (not one per call): this host's directory, and in a fleet the durable
    copy (which is all there is of a task that ended on another host)."""

    def __init__(self, s: Settings, directory: Path | None, uuid: str | None = None) -> None:
        self.settings, self.directory = s, directory
        self.uuid = uuid or (directory.name if directory is not None else None)
        self.usages: list[Usage] = []
        self.metadata = self._metadata()
        config = self.metadata.get("config") if self.metadata is not None else None
        # llm.memory's profile when set; else the task's model (no config: a task that never had a context, so the
        # default profile).
        if s.llm.memory is not None:
            config = llm_config(s, s.llm.memory)
        elif not isinstance(config, dict):
            config = llm_config(s)
        self.profile = str(config.get(PROFILE_KEY) or "")
        self.provider = provider_for(config)

    def _metadata(self) -> dict[str, Any] | None:
        """The task's ``metadata.json``: this host's, else the fleet's durable copy's; None when neither has it."""
        try:
            if self.directory is not None:
                found = read_json(self.directory / METADATA_FILE)
                return found if isinstance(found, dict) else None
            if self.uuid is not None:
                committed = context_store(self.settings, index=False).durable.committed(self.uuid)
                return dict(committed.metadata) if committed is not None else None
        except (OSError, ValueError, TasukiError) as exc:
            log.info("memory job: the task's context not read", reason=str(exc)[:200])
        return None

    def chat(self, messages: list[dict[str, str]]) -> str | None:
        """Ask the model; its usage is kept for :meth:`meter`."""
        reply = self.provider.chat(messages, None)
        self.usages.append(usage_of(reply, "memory", profile=self.profile))
        return reply.content

    def embedded(self, tokens: int) -> None:
        """An embedding request's tokens, kept for :meth:`meter`."""
        self.usages.append(Usage("embedding", str(self.settings.memory.embedder), tokens))

    def meter(self) -> None:
        """Write the calls kept so far to the task's ``state.json`` (one write), in a fleet its durable copy, and the
        Redis counters."""
        if not self.usages or self.metadata is None:
            return
        usages, self.usages = self.usages, []
        try:
            task_key = self.metadata["task_key"]
            Meter(self.settings, repo_of(task_key), redis_client).record_finished(self.directory, usages, self.uuid)
            if self.directory is not None:
                respend(self.directory)  # a pull/merge request's outcome counts its thread's memory calls too
        except (OSError, KeyError, ValueError, TasukiError) as exc:  # the task never had a context to count in
            log.info("memory update not metered: no context", reason=str(exc)[:200])
