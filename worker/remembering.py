"""The worker's side of memory (SPEC §13): the first prompt's memory, episodes at the end, updates after.

Memory never fails a task: a store that is locked or damaged, an embedding model that times out or
answers the wrong dimension, a model that answers junk — the task goes on without memory, says so once
in its log and in ``state.json.memory.note``, and ``tasuki memory status`` names the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from contexts import Context, TasukiError
from contexts.clock import utc_now
from contexts.masking import mask
from memory import EmbeddingError, Episode, Memory, MemoryStore, MemoryUnavailable, repository_key, thread_key
from memory.episodes import episode_from_context, episode_without_context
from memory.instructions import read_instructions
from memory.prompt import MemoryUse, memory_block
from memory.recall import rank_messages
from memory.search import Embedder, embed_checked, recall
from memory.update import REPOSITORY_SYSTEM, THREAD_SYSTEM, episode_material, judge, update_messages
from memory.upkeep import prune_old
from worker.llm.embeddings import Spent, embedder_for
from worker.settings_models import Settings
from worker.stores import open_memory

log = structlog.get_logger(__name__)

Chat = Callable[[list[dict[str, str]]], str | None]


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
    instructions = read_instructions(checkout)
    text, use = memory_block(instructions, None, None, [], budget)
    try:
        store = open_memory(settings)
    except Exception as exc:  # memory never fails a task (SPEC §13): whatever went wrong, go on without it
        use.note = f"memory unavailable, the task goes on without it: {_why(exc)}"
    else:
        try:
            text, use = _with_store(settings, store, instructions, request, task_text, budget, spent)
        except Exception as exc:
            use.note = f"memory unavailable, the task goes on without it: {_why(exc)}"
        finally:
            store.close()
    if use.note:
        log.warning("memory", note=mask(use.note))
    ctx.stage_state(memory=use.to_json())  # written with the first prompt's step
    return text


def _with_store(settings: Settings, store: MemoryStore, instructions: list[tuple[str, str]], request: dict[str, Any],
                task_text: str, budget: int, spent: Spent | None) -> tuple[str, MemoryUse]:
    repository = repository_key(request["task_key"], request.get("repo_path"))
    found = recall(store, repository, task_text, embedder=_embedder(settings, spent), now=utc_now(),
                   limit=settings.memory.recall_k)
    thread = thread_key(request["task_key"], repository)
    text, use = memory_block(
        instructions, store.memory("repository", repository), store.memory("thread", thread), found.hits, budget
    )
    use.note = found.note
    if found.note and settings.memory.embedding_model:  # a configured model that failed is a problem to show
        store.note_problem(found.note)
    return text, use


# -- the end of a task -----------------------------------------------------------------------------


def record_episode(settings: Settings, uuid: str, request: dict[str, Any], status: str, directory: Path | None,
                   now: datetime | None = None) -> Episode | None:
    """Record the episode of a task that ended (``directory``: its finished context, None if it had none).
    Never raises: a memory failure is logged once and the episode is skipped."""
    now = now or utc_now()
    try:
        if directory is not None and directory.is_dir():
            episode = episode_from_context(directory, now)
        else:
            episode = episode_without_context(uuid, request, status, "the task could not create its context", now)
        store = open_memory(settings)
        try:
            store.add_episode(episode)
        finally:
            store.close()
    except Exception as exc:  # the task has ended already: memory must not change how it ends
        log.warning("memory: episode not recorded", error=mask(_why(exc))[:300])
        return None
    log.info("memory: episode recorded", repository=episode.repository, thread=episode.thread)
    return episode


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
                    spent: Spent | None = None) -> dict[str, Any]:
    """Embed the episode, then update its thread memory and its repository memory incrementally (004)."""
    episode = store.episode(uuid)
    if episode is None:
        return {"uuid": uuid, "status": "no episode"}
    outcome: dict[str, Any] = {"uuid": uuid, "embedded": _embed(settings, store, episode, spent)}
    if not episode.learned:  # nothing to merge: the model is not asked
        return {**outcome, "thread": "nothing to learn", "repository": "nothing to learn"}
    bound = settings.memory.repo_max_tokens
    material = episode_material(episode)
    thread = store.memory("thread", episode.thread)
    answer = _ask(chat, update_messages(THREAD_SYSTEM, thread.text if thread else None, material, bound))
    verdict = judge(answer, material, bound)
    outcome["thread"] = verdict.reason or "updated"
    if verdict.accepted:
        sources = (*(thread.sources if thread else ()), uuid)
        thread = Memory("thread", episode.thread, verdict.text, now, tuple(dict.fromkeys(sources)))
        store.put_memory(thread, episode.repository)
    else:
        log.warning("memory: thread memory left unchanged", reason=verdict.reason)
    merged = f"Thread {episode.thread} (tasks {', '.join(thread.sources) if thread else uuid}):\n" + (
        thread.text if thread else material
    )
    repo = store.memory("repository", episode.repository)
    answer = _ask(chat, update_messages(REPOSITORY_SYSTEM, repo.text if repo else None, merged, bound))
    verdict = judge(answer, merged, bound)
    outcome["repository"] = verdict.reason or "updated"
    if verdict.accepted:
        sources = tuple(dict.fromkeys((*(repo.sources if repo else ()), uuid)))
        store.put_memory(Memory("repository", episode.repository, verdict.text, now, sources), episode.repository)
    else:
        log.warning("memory: repository memory left unchanged", reason=verdict.reason)
    return outcome


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
        [vector] = embed_checked(embedder, [episode.text()])
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
        store = open_memory(settings)
    except Exception as exc:  # the recall tool answers the model; it never breaks the step
        return [f"(memory unavailable: {_why(exc)})"]
    try:
        repository = repository_key(request["task_key"], request.get("repo_path"))
        found = recall(store, repository, query, embedder=_embedder(settings, spent), now=utc_now(),
                       limit=settings.memory.recall_k)
    except Exception as exc:
        return [f"(memory unavailable: {_why(exc)})"]
    finally:
        store.close()
    return [
        f"task {h.episode.uuid} ({h.episode.status}, {h.episode.ended_at.date()}): {h.episode.task[:300]}\n"
        f"  outcome: {h.episode.final_summary[:500] or '-'}"
        for h in found.hits
        if h.episode.uuid != own_uuid
    ]


def _why(exc: Exception) -> str:
    """An error for the log and state.json: ours are one line already; anything else names its type."""
    return str(exc) if isinstance(exc, TasukiError) else f"{type(exc).__name__}: {exc}"
