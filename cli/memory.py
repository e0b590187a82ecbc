"""``tasuki memory status|list|show|search|forget|prune`` (SPEC §13, 003's operations): thin, over the store."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cli.common import UsageError, out, terminal_width
from memory import MemoryUnavailable, parse_repository

if TYPE_CHECKING:
    from memory.store import MemoryStore
    from worker.settings_models import Settings

EXIT_OK = 0
EXIT_PROBLEM = 1


@contextmanager
def opened(settings: Settings) -> Iterator[MemoryStore]:
    """The configured memory store, which must exist already: looking never creates one."""
    from worker.stores import open_memory

    store = open_memory(settings, must_exist=True)
    try:
        yield store
    finally:
        store.close()


def _repository(args: argparse.Namespace, value: str) -> str:
    return parse_repository(value, args.source)


def _source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=("github", "gitlab", "gitea"), default="github",
                        help="the forge of an OWNER/NAME repository (default github)")


def _embedding(settings: Settings) -> str:
    if settings.memory.embeddings == "local":
        from worker.local_embeddings import local_available

        installed = "" if local_available() else ", but tasuki[embeddings] is not installed: BM25 only"
        return f"{settings.memory.embedder}{installed}"
    model = settings.memory.embedding_model
    return f"{model} ({settings.llm.provider})" if model else "none configured: BM25 only"


# -- status ----------------------------------------------------------------------------------------


def status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Store, counts, embedding model in use (or BM25 only), last error; a store that cannot open is named."""
    from dataclasses import asdict

    from cli.memory_view import format_status
    from cli.viewer import to_json
    from worker.stores import open_memory

    path = settings.memory.database(settings.contexts)
    if not path.is_file():
        out(f"No memory store yet at {path} (the first finished task creates it).")
        out(f"Embedding:     {_embedding(settings)}")
        return EXIT_OK
    try:
        store = open_memory(settings, must_exist=True)
    except MemoryUnavailable as exc:
        out(f"Store:         {path}\nProblem:       {exc}\nEmbedding:     {_embedding(settings)}")
        return EXIT_PROBLEM
    try:
        status = store.status()
    finally:
        store.close()
    embedding = _embedding(settings)
    out(to_json({**asdict(status), "embedding": embedding}) if args.json else format_status(status, embedding))
    return EXIT_OK


# -- list and show ---------------------------------------------------------------------------------


def list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", metavar="R", help="this repository's episodes (OWNER/NAME or a local path)")
    _source(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """Repositories with memory; with ``--repo``, its episodes, newest first."""
    from cli.memory_view import format_episodes, format_repositories, repository_json
    from cli.viewer import to_json

    with opened(settings) as store:
        if args.repo is None:
            repositories = store.repositories()
            out(to_json([repository_json(r) for r in repositories]) if args.json else format_repositories(repositories))
            return EXIT_OK
        episodes = store.episodes(_repository(args, args.repo), limit=10_000)
    out(to_json([e.to_json() for e in episodes]) if args.json else format_episodes(episodes, terminal_width()))
    return EXIT_OK


def show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="R", help="the repository (OWNER/NAME or a local path)")
    _source(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """The repository memory and its thread memories."""
    from cli.memory_view import format_memories, memory_json
    from cli.viewer import to_json

    repository = _repository(args, args.repo)
    with opened(settings) as store:
        memory = store.memory("repository", repository)
        threads = store.thread_memories(repository)
    if args.json:
        out(to_json({"repository": repository, "memory": memory_json(memory) if memory else None,
                     "threads": [memory_json(t) for t in threads]}))
    else:
        out(format_memories(repository, memory, threads))
    return EXIT_OK


# -- search ----------------------------------------------------------------------------------------


def search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", metavar="QUERY", help="what to recall")
    parser.add_argument("--repo", metavar="R", required=True, help="the repository (OWNER/NAME or a local path)")
    _source(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    """Recall as a task would; each hit with its BM25 rank, vector rank, fused score, lexical, recency and score."""
    from cli.memory_view import format_hits, hit_json
    from cli.viewer import to_json
    from contexts.clock import utc_now
    from memory.search import recall
    from worker.embeddings import embedder_for

    if not args.query.strip():
        raise UsageError("QUERY is empty")
    repository = _repository(args, args.repo)
    with opened(settings) as store:
        if repository not in {known.repository for known in store.repositories()}:
            # Said, not an empty answer: a mistyped name or the wrong --source looks exactly like "nothing found".
            raise MemoryUnavailable(f"no memory of {repository} (`tasuki memory list` names the repositories)")
        found = recall(store, repository, args.query, embedder=embedder_for(settings),
                       now=utc_now(), limit=settings.memory.recall_k, vector_weight=settings.memory.vector_weight)
    if args.json:
        out(to_json({"mode": found.mode, "note": found.note, "hits": [hit_json(h) for h in found.hits]}))
    else:
        out(format_hits(found.hits, found.note, terminal_width()))
    return EXIT_OK


# -- forget and prune -----------------------------------------------------------------------------


def forget_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--episode", metavar="UUID", help="one task's episode")
    which.add_argument("--thread", metavar="T", help="a thread's episodes and memory (as `memory show` names it)")
    which.add_argument("--repo", metavar="R", help="everything of a repository (OWNER/NAME or a local path)")
    _source(parser)


def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    """Delete for good: rows, full-text entries, vectors."""
    with opened(settings) as store:
        if args.episode:
            count, what = store.forget_episode(args.episode), f"episode {args.episode}"
        elif args.thread:
            count, what = store.forget_thread(args.thread), f"thread {args.thread}"
        else:
            repository = _repository(args, args.repo)
            count, what = store.forget_repository(repository), f"repository {repository}"
    if args.episode and count == 0:
        raise MemoryUnavailable(f"no episode {args.episode} in memory")
    out(f"Forgot {what}: {count} episode{'s' if count != 1 else ''} deleted.")
    return EXIT_OK


def prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only list what would be deleted")


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    """Delete episodes older than memory.prune_after_days."""
    from contexts.clock import utc_now
    from memory.upkeep import prune_old

    days = settings.memory.prune_after_days
    with opened(settings) as store:
        pruned = prune_old(store, utc_now(), days, dry_run=args.dry_run)
    verb = "Would delete" if args.dry_run else "Deleted"
    out("\n".join([f"{verb} {len(pruned)} episodes older than {days} days.", *pruned]))
    return EXIT_OK
