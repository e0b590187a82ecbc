"""How ``tasuki memory`` prints: tables for a person, plain data for ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from cli.viewer import clip, first_line, safe
from memory import Episode, Hit, Memory, RepositoryCount, StoreStatus


def table(headings: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell; ``right`` columns (numbers) line up on the right."""
    widths = [max(len(row[i]) for row in (headings, *rows)) for i in range(len(headings))]
    lines = []
    for row in (headings, *rows):
        cells = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _day(episode: Episode) -> str:
    return episode.ended_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def format_status(status: StoreStatus, embedding: str) -> str:
    """``tasuki memory status``."""
    dimension = f" of {status.vector_dimension} dimensions" if status.vector_dimension else ""
    return "\n".join([
        f"Store:         {status.location}",
        f"Episodes:      {status.episodes:,} in {status.repositories:,} repositories, {status.threads:,} threads",
        f"Vectors:       {status.vectors:,}{dimension}",
        f"Embedding:     {embedding}",
        f"Last error:    {safe(status.last_error) if status.last_error else 'none'}",
    ])


def format_repositories(repositories: Sequence[RepositoryCount]) -> str:
    """``tasuki memory list``."""
    if not repositories:
        return "No memory yet."
    rows = [
        (
            safe(r.repository),
            f"{r.episodes:,}",
            f"{r.threads:,}",
            "yes" if r.has_memory else "no",
            r.last_episode_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if r.last_episode_at else "-",
        )
        for r in repositories
    ]
    return table(("REPOSITORY", "EPISODES", "THREADS", "MEMORY", "LAST EPISODE"), rows, frozenset({1, 2}))


def repository_json(r: RepositoryCount) -> dict[str, Any]:
    """One repository for ``--json``."""
    last = r.last_episode_at.isoformat() if r.last_episode_at else None
    return {"repository": r.repository, "episodes": r.episodes, "threads": r.threads, "has_memory": r.has_memory,
            "last_episode_at": last}


def format_episodes(episodes: Sequence[Episode], width: int) -> str:
    """``tasuki memory list --repo R``: UUID first."""
    if not episodes:
        return "No episodes."
    rows = [
        (e.uuid, _day(e), safe(e.status), safe(e.thread.rsplit("#", 1)[-1]), safe(first_line(e.task)))
        for e in episodes
    ]
    text = table(("UUID", "ENDED", "STATUS", "THREAD", "TASK"), rows)
    return "\n".join(clip(line, width) for line in text.splitlines())


def format_memories(repository: str, memory: Memory | None, threads: Sequence[Memory]) -> str:
    """``tasuki memory show R``: the repository memory, then each thread memory."""
    lines = [f"Repository memory of {safe(repository)}:"]
    lines += _memory_lines(memory)
    for thread in threads:
        lines += ["", f"Thread {safe(thread.key.rsplit('#', 1)[-1])}:"]
        lines += _memory_lines(thread)
    if not threads:
        lines += ["", "No thread memories."]
    return "\n".join(lines)


def _memory_lines(memory: Memory | None) -> list[str]:
    if memory is None:
        return ["  (none yet)"]
    stamp = memory.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    sources = ", ".join(memory.sources) or "-"
    return [f"  updated {stamp} from {sources}"] + ["  " + safe(line) for line in memory.text.splitlines()]


def memory_json(memory: Memory) -> dict[str, Any]:
    """A thread or repository memory for ``--json``."""
    return {"scope": memory.scope, "key": memory.key, "text": memory.text,
            "updated_at": memory.updated_at.isoformat(), "sources": list(memory.sources)}


def _rank(rank: int | None) -> str:
    return "-" if rank is None else str(rank)


def format_hits(hits: Sequence[Hit], note: str | None, width: int) -> str:
    """``tasuki memory search``: every figure that decided each hit."""
    lines = [f"note: {note}"] if note else []
    if not hits:
        return "\n".join([*lines, "No episode recalled."])
    rows = [
        (h.episode.uuid, _rank(h.bm25_rank), _rank(h.vector_rank), f"{h.fused:.3f}", f"{h.lexical:.3f}",
         f"{h.recency:.3f}", f"{h.score:.3f}", safe(first_line(h.episode.task)))
        for h in hits
    ]
    text = table(("UUID", "BM25", "VECTOR", "FUSED", "LEXICAL", "RECENCY", "SCORE", "TASK"), rows,
                 frozenset(range(1, 7)))
    return "\n".join([*lines, *(clip(line, width) for line in text.splitlines())])


def hit_json(hit: Hit) -> dict[str, Any]:
    """One hit for ``--json``."""
    return {"uuid": hit.episode.uuid, "bm25_rank": hit.bm25_rank, "vector_rank": hit.vector_rank,
            "bm25": hit.bm25, "vector": hit.vector, "fused": hit.fused, "lexical": hit.lexical,
            "recency": hit.recency, "score": hit.score, "episode": hit.episode.to_json()}
