"""A mined row's problem statement (issue 39): the issue a change resolves, read through the forge when it answers,
else the change's own commit message.

A message that names ``#123`` ("Fix x (#123)", "Merge pull request #123 from ...") points at an issue or a pull
request. A pull request that says it ``fixes #120`` stands for that issue (as SWE-bench's rows do: the issue is the
task, the pull request its answer); otherwise the item named is the statement. The first forge error turns the forge
off for the rest of the run (a forge that does not answer costs its timeout once, not once per change).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from worker.forges.base import ForgeError, Item, ItemRef

log = structlog.get_logger(__name__)

_REFERENCE = re.compile(r"(?:^|[\s(\[])#(\d{1,7})\b")
_RESOLVES = re.compile(r"\b(?:fix(?:e[sd])?|close[sd]?|resolve[sd]?)\b:?\s+#(\d{1,7})\b", re.IGNORECASE)
MAX_ITEMS = 3  # issues joined into one statement at most


def references(text: str) -> list[int]:
    """The ``#N`` a text names, in order, each once."""
    return list(dict.fromkeys(int(number) for number in _REFERENCE.findall(text)))


def resolved_issues(text: str) -> list[int]:
    """The issues a pull request's text says it fixes, closes or resolves."""
    return list(dict.fromkeys(int(number) for number in _RESOLVES.findall(text)))


def item_text(item: Item) -> str:
    """An issue as a statement: its title, then its body."""
    return f"{item.title.strip()}\n\n{item.body.strip()}".strip()


@dataclass
class Statements:
    """Problem statements of one repository's changes; ``read`` is the forge's ``read_item`` (None: no forge)."""

    owner: str
    repo: str
    read: Callable[[ItemRef], Item] | None = None
    looked_up: int = 0
    from_forge: int = 0
    forge_error: str | None = None
    _cache: dict[int, Item | None] = field(default_factory=dict)

    def for_change(self, message: str) -> tuple[str, int | None]:
        """(statement, the number of the item the change names first, or None)."""
        numbers = references(message.splitlines()[0] if message else "") or references(message)
        first = numbers[0] if numbers else None
        if first is not None:
            found = self._from_forge(first)
            if found:
                self.from_forge += 1
                return found, first
        return message.strip(), first

    def _from_forge(self, number: int) -> str | None:
        item = self._item(number)
        if item is None:
            return None
        issues = [self._item(n) for n in resolved_issues(item.body) if n != number][:MAX_ITEMS]
        linked = [issue for issue in issues if issue is not None]
        return "\n\n".join(item_text(issue) for issue in linked) if linked else item_text(item)

    def _item(self, number: int) -> Item | None:
        if self.read is None:
            return None
        if number not in self._cache:
            self.looked_up += 1
            try:
                self._cache[number] = self.read(ItemRef(self.owner, self.repo, "issue", number))
            except ForgeError as exc:
                self._cache[number] = None
                if not _missing(exc):  # the forge does not answer: no more asking it in this run
                    self.forge_error = str(exc).splitlines()[0][:300]
                    log.warning("forge not reachable; problem statements from commit messages", error=self.forge_error)
                    self.read = None
        return self._cache[number]


def _missing(exc: ForgeError) -> bool:
    """The forge answered, and that item is not there (a number in a message that names no issue of this repo)."""
    return "HTTP 404" in str(exc) or "HTTP 410" in str(exc)
