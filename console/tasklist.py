"""The tasks page's source: the context store's index (``store.index``, "A busy fleet stays fast"), never a
scan of every context directory. The Protocol is what the console needs of it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

PAGE_SIZE = 50


class Entry(Protocol):
    """One row of the index."""

    uuid: str
    status: str
    created_at: Any
    ended_at: Any
    repository: Any
    user: Any
    task_type: Any
    task_id: Any
    title: Any
    steps: Any
    tokens: Any


class TaskIndex(Protocol):
    """What the console reads of the index."""

    def page(self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
             uuid_prefix: str | None = None, limit: int = PAGE_SIZE, offset: int = 0) -> list[Any]:
        """Entries newest first."""
        ...

    def count(self, *, status: str | None = None, repository: str | None = None, user: str | None = None,
              uuid_prefix: str | None = None) -> int:
        """How many entries match."""
        ...

    def ended_since(self, since: datetime) -> dict[str, int]:
        """Tasks that ended since ``since``, by final status."""
        ...


@dataclass(frozen=True)
class Filters:
    """The tasks page's filters, as given in its query string (empty: no filter)."""

    status: str | None = None
    repository: str | None = None
    user: str | None = None
    uuid_prefix: str | None = None

    def as_kwargs(self) -> dict[str, str | None]:
        """Keyword arguments of the index's ``page`` and ``count``."""
        return {"status": self.status, "repository": self.repository, "user": self.user,
                "uuid_prefix": self.uuid_prefix}


@dataclass(frozen=True)
class TaskPage:
    """One page of the tasks list."""

    entries: list[Any]
    total: int
    page: int
    pages: int


def read_page(index: TaskIndex, filters: Filters, page: int, size: int = PAGE_SIZE) -> TaskPage:
    """Page ``page`` (from 1) of the entries matching ``filters``, newest first."""
    total = index.count(**filters.as_kwargs())
    pages = max((total + size - 1) // size, 1)
    page = min(max(page, 1), pages)
    entries = index.page(**filters.as_kwargs(), limit=size, offset=(page - 1) * size)
    return TaskPage(entries, total, page, pages)
