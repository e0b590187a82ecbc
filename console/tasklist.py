"""The tasks page's source: the context store's index (``store.index``), never a scan of every context."""

from __future__ import annotations

from dataclasses import dataclass

from contexts.index import Index, IndexEntry

PAGE_SIZE = 50


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

    entries: list[IndexEntry]
    total: int
    page: int
    pages: int


def read_page(index: Index, filters: Filters, page: int, size: int = PAGE_SIZE) -> TaskPage:
    """Page ``page`` (from 1) of the entries matching ``filters``, newest first."""
    total = index.count(**filters.as_kwargs())
    pages = max((total + size - 1) // size, 1)
    page = min(max(page, 1), pages)
    entries = index.page(**filters.as_kwargs(), limit=size, offset=(page - 1) * size)
    return TaskPage(entries, total, page, pages)
