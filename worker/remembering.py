"""The worker's side of memory (SPEC §13): the first prompt's memory, episodes at the end, updates after.

A thread's first episode is its memory as written (no model); a thread with memory asks the model to merge
the episode in (``update_memory``); thread memories reach the repository memory in coalesced merge jobs, one
model call per batch of waiting threads (``worker.merging``).

Memory never fails a task: a store that is locked or damaged, an embedding model that times out or
answers the wrong dimension, a model that answers junk — the task goes on without memory, says so once
in its log and in ``state.json.memory.note``, and ``tasuki memory status`` names the problem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from agent.instructions import INSTRUCTIONS_FIELD
from contexts import Context, TasukiError
from contexts.clock import utc_now
from contexts.masking import mask
from memory import EmbeddingError, Episode, Memory, MemoryStore, MemoryUnavailable, repository_key, thread_key
from memory.episodes import episode_from_context, episode_without_context
from memory.facts import Evidence, keep_supported
from memory.prompt import MemoryUse, memory_block
from memory.recall import rank_messages
from memory.search import Embedder, embed_checked, recall
from memory.update import (
    REPOSITORY_SYSTEM,
    THREAD_SYSTEM,
    Verdict,
    episode_material,
    judge,
    merge_batch,
    thread_without_model,
    threads_material,
    update_messages,
)
from memory.upkeep import prune_old
from worker.embeddings import Spent, embedder_for
from worker.settings_models import Settings
from worker.stores import kept_memory, open_memory

log = structlog.get_logger(__name__)

Chat = Callable[[list[dict[str, str]]], str | None]
PathsOf = Callable[[str], set[str]]  # a task's UUID -> the paths its tool calls named (its context, if still kept)


def _embedder(settings: Settings, spent: Spent | None = None) -> Embedder | None:
    try:
        return embedder_for(settings, spent)
    except EmbeddingError as exc:
        log.warning("memory: no embeddings", error=str(exc))
        return None


# -- the first prompt ------------------------------------------------------------------------------


def first_prompt_memory(settings: Settings, ctx: Context, checkout: Path, request: dict[str, Any],
                        task_text: str, context_length: int, spent: Spent | None = None) -> str:
    """The memory block for the first user message; records what it holds in ``state.json.memory``
    (``spent``: told the tokens of each embedding request, for metering)."""
    budget = int(settings.memory.prompt_share * context_length)
    # The owner's instruction files are no memory: they open the task as a system message (agent/instructions.py).
    text, use = memory_block([], None, None, [], budget)
    try:
        with kept_memory(settings) as store:
            text, use = _with_store(settings, store, [], request, task_text, budget, spent)
    except Exception as exc:  # memory never fails a task (SPEC §13): whatever went wrong, go on without it
        use.note = f"memory unavailable, the task goes on without it: {_why(exc)}"
    use.instruction_files = [str(name) for record in ctx.pinned for name in record.get(INSTRUCTIONS_FIELD) or []]
    if use.note:
        log.warning("memory", note=mask(use.note))
    ctx.stage_state(memory=use.to_json())  # written with the first prompt's step
    return text


def _with_store(settings: Settings, store: MemoryStore, instructions: list[tuple[str, str]], request: dict[str, Any],
                task_text: str, budget: int, spent: Spent | None) -> tuple[str, MemoryUse]:
    repository = repository_key(request["task_key"], request.get("repo_path"))
    found = recall(store, repository, task_text, embedder=_embedder(settings, spent), now=utc_now(),
                   limit=settings.memory.recall_k, vector_weight=settings.memory.vector_weight)
    thread = thread_key(request["task_key"], repository)
    text, use = memory_block(
        instructions, store.memory("repository", repository), store.memory("thread", thread), found.hits, budget
    )
    use.note = found.note
    use.embedder = found.embedder
    if found.note and settings.memory.embedder:  # a configured model that failed is a problem to show
        store.note_problem(found.note)
    return text, use


# -- the end of a task -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """A recorded episode and what its memory still needs: ``"nothing"``, ``"merge"`` (its thread memory is
    written: only the repository merge is to be flagged) or ``"update"`` (the ``update_memory`` job: a model
    or an embedding is needed)."""

    episode: Episode
    next: str


def record_episode(settings: Settings, uuid: str, request: dict[str, Any], status: str, directory: Path | None,
                   now: datetime | None = None) -> Recorded | None:
    """Record the episode of a task that ended (``directory``: its finished context, None if it had none), and
    write a thread's first episode as its memory when no model and no embedding is needed (one open store).
    Never raises: a memory failure is logged once and the episode is skipped."""
    now = now or utc_now()
    try:
        if directory is not None and directory.is_dir():
            episode = episode_from_context(directory, now)
        else:
            episode = episode_without_context(uuid, request, status, "the task could not create its context", now)
        with kept_memory(settings) as store:
            store.add_episode(episode)
            after = _without_a_job(settings, store, episode, now)
    except Exception as exc:  # the task has ended already: memory must not change how it ends
        log.warning("memory: episode not recorded", error=mask(_why(exc))[:300])
        return None
    log.info("memory: episode recorded", repository=episode.repository, thread=episode.thread, next=after)
    return Recorded(episode, after)


def _without_a_job(settings: Settings, store: MemoryStore, episode: Episode, now: datetime) -> str:
    """What the task process can do itself: with no embedding model, a thread's first episode (rule of
    ``thread_without_model``) and an episode with nothing to learn need no job."""
    if settings.memory.embedder:
        return "update"
    if not episode.learned:
        return "nothing"
    if _thread_as_written(store, episode, settings.memory.repo_max_tokens, now) is None:
        return "update"
    return "merge"


def _thread_as_written(store: MemoryStore, episode: Episode, bound: int, now: datetime) -> str | None:
    """Write the episode as its thread's first memory when no model is needed; None when the model must merge."""
    text = thread_without_model(store.memory("thread", episode.thread), episode, bound)
    if text is not None:
        store.put_memory(Memory("thread", episode.thread, text, now, (episode.uuid,)), episode.repository)
    return text


def prune_memory(settings: Settings, now: datetime, *, dry_run: bool = False) -> list[str]:
    """The retention job's share: episodes older than memory.prune_after_days (none when no store exists)."""
    if not settings.memory.database(settings.contexts).is_file():
        return []
    try:
        store = open_memory(settings, must_exist=True)
        try:
            return prune_old(store, now, settings.memory.prune_after_days, dry_run=dry_run)
        finally:
            store.close()
    except MemoryUnavailable as exc:
        log.warning("memory not pruned", error=str(exc))
        return []


# -- the maintenance task --------------------------------------------------------------------------


def update_memories(settings: Settings, store: MemoryStore, uuid: str, chat: Chat, now: datetime,
                    spent: Spent | None = None, paths_of: PathsOf | None = None) -> dict[str, Any]:
    """Embed the episode, then update its thread memory incrementally (004), keeping only the lines the thread's
    tasks' records support (``paths_of``: the paths a task's tool calls named). ``outcome["merge"]``: the thread
    is ``[repository, thread]`` when the thread is to be flagged for the repository merge (:func:`merge_repository`),
    which the caller does (it holds Redis)."""
    episode = store.episode(uuid)
    if episode is None:
        return {"uuid": uuid, "status": "no episode", "merge": None}
    outcome: dict[str, Any] = {"uuid": uuid, "embedded": _embed(settings, store, episode, spent)}
    if not episode.learned:  # nothing to merge: the model is not asked
        return {**outcome, "thread": "nothing to learn", "merge": None}
    bound = settings.memory.repo_max_tokens
    merge = [episode.repository, episode.thread]
    if _thread_as_written(store, episode, bound, now) is not None:
        return {**outcome, "thread": "first episode, as written", "merge": merge}
    material = episode_material(episode)
    thread = store.memory("thread", episode.thread)
    answer = _ask(chat, update_messages(THREAD_SYSTEM, thread.text if thread else None, material, bound))
    existing = thread.text if thread else None
    verdict = judge(answer, material, bound, existing)
    sources = tuple(dict.fromkeys((*(thread.sources if thread else ()), uuid)))
    if verdict.accepted:
        verdict = on_record(verdict, store, episode.repository, sources, existing, paths_of, "thread", episode.thread)
    if verdict.accepted:
        store.put_memory(Memory("thread", episode.thread, verdict.text, now, sources), episode.repository)
    else:
        log.warning("memory: thread memory left unchanged", reason=verdict.reason)
    return {**outcome, "thread": verdict.reason or "updated", "merge": merge}


def on_record(verdict: Verdict, store: MemoryStore, repository: str, sources: Sequence[str], existing: str | None,
              paths_of: PathsOf | None, scope: str, key: str) -> Verdict:
    """The accepted answer without the lines its tasks' records do not support (made-up tasks, files, requests,
    branches, results), each drop logged with its reason; refused when no new line is left."""
    episodes = store.fetch(repository, list(sources)).values()
    paths = {p for uuid in sources for p in (paths_of(uuid) if paths_of else ())}
    checked = keep_supported(verdict.text, Evidence.of(episodes, paths, sources), existing)
    for dropped in checked.dropped:
        log.warning("memory: claim dropped", scope=scope, key=key, kind=dropped.kind, claim=mask(dropped.claim)[:200],
                    reason=mask(dropped.reason)[:300], line=mask(dropped.line)[:300])
    if not checked.text.strip() or (checked.dropped and checked.text.strip() == (existing or "").strip()):
        return Verdict(False, checked.text, "no line of the answer that the tasks' records support was left")
    return Verdict(True, checked.text)


@dataclass(frozen=True)
class MergeBatch:
    """The waiting threads one merge takes: their memories (oldest task first), ``merged`` (thread -> the UUID
    that flagged it, to unflag after the merge), the newest task among them, how many threads wait for the next."""

    threads: list[Memory]
    merged: dict[str, str]
    newest: str | None
    left: int


def next_merge(settings: Settings, store: MemoryStore, repository: str, waiting: Mapping[str, str], now: datetime
               ) -> MergeBatch:
    """The oldest waiting threads whose memories fit one merge request (``waiting``: thread -> the task that
    flagged it). A thread without memory (its update was refused) is merged from its task's episode; one with
    neither (forgotten meanwhile) is only unflagged."""
    episodes = store.fetch(repository, sorted(set(waiting.values())))
    ended = {t: episodes[u].ended_at for t, u in waiting.items() if u in episodes}
    memories: list[Memory] = []
    gone: dict[str, str] = {}
    for key in sorted(waiting, key=lambda t: (t in ended, ended.get(t, now), t)):
        memory = store.memory("thread", key)
        if memory is None and waiting[key] in episodes:
            memory = Memory("thread", key, episode_material(episodes[waiting[key]]), now, (waiting[key],))
        if memory is None:
            gone[key] = waiting[key]
        else:
            memories.append(memory)
    batch = merge_batch(memories, settings.memory.repo_max_tokens)
    merged = {**gone, **{t.key: waiting[t.key] for t in batch}}
    newest = max((episodes[u] for u in merged.values() if u in episodes), key=lambda e: e.ended_at, default=None)
    return MergeBatch(batch, merged, newest.uuid if newest else None, len(memories) - len(batch))


def merge_repository(settings: Settings, store: MemoryStore, repository: str, threads: Sequence[Memory],
                     chat: Chat, now: datetime, paths_of: PathsOf | None = None) -> str:
    """ONE model call merges the waiting thread memories into the repository memory (004); its sources become
    the union of theirs, and only the lines their records support are kept. Returns "updated" or why not; a model
    that fails raises (the threads stay waiting)."""
    bound = settings.memory.repo_max_tokens
    material = threads_material(threads)
    repo = store.memory("repository", repository)
    existing = repo.text if repo else None
    verdict = judge(chat(update_messages(REPOSITORY_SYSTEM, existing, material, bound)), material, bound, existing)
    merged = tuple(dict.fromkeys((*(repo.sources if repo else ()), *(u for thread in threads for u in thread.sources))))
    if verdict.accepted:
        verdict = on_record(verdict, store, repository, merged, existing, paths_of, "repository", repository)
    if not verdict.accepted:
        log.warning("memory: repository memory left unchanged", reason=verdict.reason)
        return verdict.reason or "refused"
    store.put_memory(Memory("repository", repository, verdict.text, now, merged), repository)
    return "updated"


def _ask(chat: Chat, messages: list[dict[str, str]]) -> str | None:
    try:
        return chat(messages)
    except TasukiError as exc:
        log.warning("memory: the model did not answer", error=mask(str(exc))[:300])
        return None


def _embed(settings: Settings, store: MemoryStore, episode: Episode, spent: Spent | None) -> bool:
    """Store the episode's vector; a failing or mismatched embedding leaves the episode BM25-only."""
    embedder = _embedder(settings, spent)
    if embedder is None:
        return False
    try:
        [vector] = embed_checked(embedder, [episode.meaning()])
        store.add_episode(episode, vector)
    except EmbeddingError as exc:
        log.warning("memory: episode not embedded", error=mask(str(exc))[:300])
        store.note_problem(f"episode {episode.uuid} not embedded: {exc}")
        return False
    return True


# -- the recall tool -------------------------------------------------------------------------------

RECALLED_MESSAGES = 5
RECALLED_CHARS = 1500


def task_recall(settings: Settings, ctx: Context, request: dict[str, Any], query: str, in_prompt: set[str],
                spent: Spent | None = None) -> str:
    """The recall tool's answer: this task's messages no longer in the prompt, then the repository's episodes."""
    from contexts import jsonl
    from contexts.names import MESSAGES_FILE

    own = [
        r for r in jsonl.iter_records(ctx.path / MESSAGES_FILE)
        if r.get("role") in ("user", "assistant", "tool") and str(r.get("content")) not in in_prompt
    ]
    lines = []
    for _, record in rank_messages(query, own, RECALLED_MESSAGES):
        content = str(record.get("content"))[:RECALLED_CHARS]
        lines.append(f"[message {record.get('seq')}, {record.get('role')}]\n{content}")
    episodes = _recall_episodes(settings, request, query, ctx.uuid, spent)
    parts = ["Earlier messages of this task (no longer in the prompt):", *(lines or ["(none match)"])]
    parts += ["", "Earlier tasks on this repository:", *(episodes or ["(none match)"])]
    return "\n".join(parts)


def _recall_episodes(settings: Settings, request: dict[str, Any], query: str, own_uuid: str, spent: Spent | None
                     ) -> list[str]:
    try:
        with kept_memory(settings) as store:
            repository = repository_key(request["task_key"], request.get("repo_path"))
            found = recall(store, repository, query, embedder=_embedder(settings, spent), now=utc_now(),
                           limit=settings.memory.recall_k, vector_weight=settings.memory.vector_weight)
    except Exception as exc:  # the recall tool answers the model; it never breaks the step
        return [f"(memory unavailable: {_why(exc)})"]
    return [
        f"task {h.episode.uuid} ({h.episode.status}, {h.episode.ended_at.date()}): {h.episode.task[:300]}\n"
        f"  outcome: {h.episode.final_summary[:500] or '-'}"
        for h in found.hits
        if h.episode.uuid != own_uuid
    ]


def _why(exc: Exception) -> str:
    """An error for the log and state.json: ours are one line already; anything else names its type."""
    return str(exc) if isinstance(exc, TasukiError) else f"{type(exc).__name__}: {exc}"
