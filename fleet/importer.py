"""``tasuki fleet import``: a one-host store (context directories, their index, memory.db) copied into the fleet's
PostgreSQL (SPEC §12, issue 27).

Idempotent: a context the fleet already has is left as it is (its lines are inserted ``ON CONFLICT DO NOTHING``,
its row only ever replaced as the index's own rule allows), an episode it has is not added again, so a second run
adds nothing. Each problem is one line handed to ``report``; the run goes on past it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contexts import jsonl
from contexts.atomic import open_no_follow, read_json
from contexts.errors import CorruptRecordError, TasukiError
from contexts.index_schema import row_of
from contexts.names import COMPLETED_DIR, GZIP_SUFFIX, METADATA_FILE, RECORD_FILES, RUNNING_DIR
from contexts.state import read_state
from contexts.summary import context_uuids, summarize
from fleet.index import UPSERT, pg_row
from fleet.lease import Conn
from fleet.store import FleetStore
from memory.store import MemoryStore

ID_FIELDS = {
    "messages.jsonl": "seq", "tools.jsonl": "seq", "summaries.jsonl": "summary_id", "requests.jsonl": "request_id"
}
EVERY = 2**31  # an episode list with no end

_CONTEXT = """
INSERT INTO tasuki_contexts (uuid, metadata, state, epoch) VALUES (%s, %s::jsonb, %s::jsonb, 0)
ON CONFLICT (uuid) DO NOTHING RETURNING uuid"""
_LINES = """
INSERT INTO tasuki_records (uuid, file, id, epoch, line)
SELECT %s, r.file, r.id, 0, r.line::json FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS r(file, id, line)
ON CONFLICT (uuid, file, id) DO NOTHING"""


@dataclass
class ImportSummary:
    """What one run copied, found already there, and could not copy."""

    contexts: int = 0
    present: int = 0
    episodes: int = 0
    memories: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The run's last line."""
        return (
            f"imported {self.contexts:,} contexts ({self.present:,} already in the fleet), {self.episodes:,} "
            f"episodes, {self.memories:,} memories; {len(self.problems):,} problems"
        )


def raw_lines(path: Path) -> list[str]:
    """The complete lines of a JSONL file as written (``.jsonl.gz`` after retention too); a torn last line is left."""
    path = jsonl.resolve(path)
    if not path.exists():
        return []
    with open_no_follow(path) as raw:
        data = gzip.decompress(raw.read()) if path.suffix == GZIP_SUFFIX else raw.read()
    complete = data[: data.rfind(b"\n") + 1]
    return [line.decode() for line in complete.splitlines() if line.strip()]


def _lines(directory: Path) -> tuple[list[str], list[int], list[str]]:
    """Every complete line of the context's JSONL files (``requests.jsonl`` where it has one), each with its own id,
    its text byte for byte."""
    files: list[str] = []
    ids: list[int] = []
    lines: list[str] = []
    for name in RECORD_FILES:
        for line in raw_lines(directory / name):
            files.append(name)
            ids.append(int(json.loads(line)[ID_FIELDS[name]]))
            lines.append(line)
    return files, ids, lines


def _one_context(conn: Conn, directory: Path, host: str) -> bool:
    """Copy one context in the caller's transaction; False when the fleet already had it."""
    metadata = read_json(directory / METADATA_FILE)
    state = read_state(directory)
    row = pg_row(host, row_of(summarize(directory), directory))
    files, ids, lines = _lines(directory)
    created = conn.execute(_CONTEXT, (directory.name, json.dumps(metadata), json.dumps(state))).fetchone()
    conn.execute(_LINES, (directory.name, files, ids, lines))
    conn.execute(UPSERT, row)
    return created is not None


def import_contexts(root: Path, fleet: FleetStore, host: str, report: Callable[[str], None]) -> ImportSummary:
    """Copy every context under ``root`` (running/ and completed/) into the fleet, one transaction each."""
    summary = ImportSummary()
    for location in (RUNNING_DIR, COMPLETED_DIR):
        for uuid in context_uuids(root / location):
            directory = root / location / uuid
            try:
                with fleet.connection() as conn, conn.transaction():
                    created = _one_context(conn, directory, host)
            except (OSError, ValueError, KeyError, CorruptRecordError) as exc:
                problem = f"context {uuid}: not imported: {type(exc).__name__}: {exc}"
                summary.problems.append(problem)
                report(problem)
                continue
            if created:
                summary.contexts += 1
            else:
                summary.present += 1
    return summary


def import_memory(
    source: MemoryStore, target: MemoryStore, summary: ImportSummary, report: Callable[[str], None]
) -> None:
    """Copy every episode (with its vector) and every thread memory the target does not have yet, and every newer
    memory."""
    for repository in source.repositories():
        for episode in source.episodes(repository.repository, limit=EVERY):
            try:
                if target.episode(episode.uuid) is None:
                    target.add_episode(episode, source.vector(episode.uuid))
                    summary.episodes += 1
            except TasukiError as exc:
                problem = f"episode {episode.uuid}: not imported: {exc}"
                summary.problems.append(problem)
                report(problem)
        own = source.memory("repository", repository.repository)
        for memory in [*source.thread_memories(repository.repository), *([own] if own else [])]:
            found = target.memory(memory.scope, memory.key)
            if found is None or found.updated_at < memory.updated_at:
                target.put_memory(memory, repository.repository)
                summary.memories += 1
