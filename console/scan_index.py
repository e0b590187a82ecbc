"""A stand-in for the context index while the store has none (``ContextStore.index`` arrives with the index
branch): the same answers, from a scan of every context. Only used when ``store.index`` is missing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contexts.queries import ContextSummary, read_contexts
from contexts.store import ContextStore


@dataclass(frozen=True)
class ScannedEntry:
    """An index row made from a context's summary."""

    uuid: str
    status: str
    created_at: datetime
    ended_at: datetime | None
    repository: str
    user: str | None
    task_type: str
    task_id: str
    title: str | None
    steps: int
    tokens: int


def _entry(item: ContextSummary) -> ScannedEntry:
    key = item.task_key
    return ScannedEntry(
        uuid=item.uuid, status=item.status, created_at=item.created_at, ended_at=item.completed_at,
        repository=f"{key.get('task_source')}/{key.get('owner')}/{key.get('repo')}", user=item.user,
        task_type=str(key.get("task_type")), task_id=str(key.get("task_id")), title=None,
        steps=item.llm_call_count, tokens=item.total_tokens_used,
    )


class ScanIndex:
    """Every context read on each call: fine for a handful, the reason the real index exists."""

    def __init__(self, store: ContextStore) -> None:
        self.store = store

    def _matching(self, status: str | None, repository: str | None, user: str | None,
                  uuid_prefix: str | None) -> list[ScannedEntry]:
        entries = [_entry(item) for item in read_contexts(self.store, status=status, user=user).items]
        return [e for e in entries if (repository is None or e.repository == repository)
                and (uuid_prefix is None or e.uuid.startswith(uuid_prefix.lower()))]

    def page(self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
             uuid_prefix: str | None = None, limit: int = 50, offset: int = 0) -> list[Any]:
        """Entries newest first."""
        return self._matching(status, repository, user, uuid_prefix)[offset:offset + limit]

    def count(self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
              uuid_prefix: str | None = None) -> int:
        """How many entries match."""
        return len(self._matching(status, repository, user, uuid_prefix))

    def ended_since(self, since: datetime) -> dict[str, int]:
        """Tasks that ended since ``since``, by final status."""
        counts: dict[str, int] = {}
        for entry in self._matching(None, None, None, None):
            if entry.ended_at is not None and entry.ended_at >= since:
                counts[entry.status] = counts.get(entry.status, 0) + 1
        return counts
