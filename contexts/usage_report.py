"""``tasuki usage`` and ``tasuki usage rebuild`` read the contexts' spend totals (SPEC §16): grouped by
repository, user, model profile and model, or UTC day; and the figures of one day that Redis's daily counters
hold."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

from contexts.queries import ContextSummary
from contexts.usage import repo_of

GROUPINGS = ("repo", "user", "model", "day")


@dataclass
class UsageRow:
    """Spend of one group: how many tasks, tokens and USD (``None``: nothing of it was priced)."""

    key: str
    tasks: int = 0
    tokens: int = 0
    cost_usd: float | None = None

    def add(self, tokens: int, cost: float | None) -> None:
        """One more share of spend (a task's day, model or whole total)."""
        self.tokens += tokens
        if cost is not None:
            self.cost_usd = round((self.cost_usd or 0.0) + float(cost), 9)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _shares(item: ContextSummary, by: str, date_from: date | None, date_to: date | None
            ) -> Iterator[tuple[str, int, float | None]]:
    """(group key, tokens, cost) of one task's spend on the days between ``date_from`` and ``date_to``."""
    usage = item.usage or {}
    if by == "model":  # per profile and model, not per day: the task counts when it was created in range
        if _within(item.created_at.date(), date_from, date_to):
            models: dict[str, tuple[int, float | None]] = {}
            for bucket in (usage.get("by_call") or {}).values():
                key = model_key(str(bucket["model"]), bucket.get("profile"))
                tokens, cost = models.get(key, (0, None))
                priced = bucket.get("cost_usd")
                models[key] = (tokens + int(bucket["tokens"]),
                               cost if priced is None else (cost or 0.0) + float(priced))
            for model, (tokens, cost) in models.items():
                yield model, tokens, cost
        return
    for day, figures in (usage.get("by_day") or {}).items():
        if not _within(date.fromisoformat(day), date_from, date_to):
            continue
        key = {"repo": repo_of(item.task_key), "user": item.user or "(none)", "day": day}[by]
        yield key, int(figures.get("tokens", 0)), figures.get("cost_usd")


def model_key(model: str, profile: object) -> str:
    """The ``--by model`` group of calls: ``PROFILE: MODEL`` (the model profile they were made with and the model
    that answered), the model alone for calls recorded before profiles."""
    return f"{profile}: {model}" if isinstance(profile, str) and profile else model


def _within(day: date, date_from: date | None, date_to: date | None) -> bool:
    return (date_from is None or day >= date_from) and (date_to is None or day <= date_to)


def usage_rows(
    items: Iterable[ContextSummary],
    *,
    by: str = "repo",
    repo: str | None = None,
    user: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
) -> list[UsageRow]:
    """Spend grouped ``by`` repo, user, model or day, biggest first (days in order)."""
    rows: dict[str, UsageRow] = {}
    for item in items:
        if (repo is not None and repo_of(item.task_key) != repo) or (user is not None and item.user != user):
            continue
        seen: set[str] = set()
        for key, tokens, cost in _shares(item, by, date_from, date_to):
            row = rows.setdefault(key, UsageRow(key))
            row.add(tokens, cost)
            if key not in seen:
                row.tasks += 1
                seen.add(key)
    if by == "day":
        return sorted(rows.values(), key=lambda row: row.key)
    return sorted(rows.values(), key=lambda row: (-row.tokens, row.key))


def day_counters(items: Iterable[ContextSummary], day: date) -> tuple[dict[str, tuple[int, float]], dict[str, int]]:
    """What the daily counters of ``day`` should hold: each repository's tokens and USD spent that day, and
    each user's tasks created that day (triggers that never got a context are not known here)."""
    repos: dict[str, tuple[int, float]] = {}
    users: dict[str, int] = {}
    for item in items:
        figures = ((item.usage or {}).get("by_day") or {}).get(day.isoformat())
        if figures:
            tokens, cost = repos.get(repo_of(item.task_key), (0, 0.0))
            repos[repo_of(item.task_key)] = (tokens + int(figures["tokens"]),
                                             cost + float(figures.get("cost_usd") or 0.0))
        if item.user and item.created_at.date() == day:
            users[item.user] = users.get(item.user, 0) + 1
    return repos, users
