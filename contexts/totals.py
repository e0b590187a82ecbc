"""Counts and sums over contexts: the tallies the index keeps per (location, status, user), and their fold."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contexts.summary import ContextSummary


@dataclass(frozen=True)
class Totals:
    """Counts and sums over a set of indexed contexts."""

    by_status: dict[str, int]  # most first; ties: the status of the newest context first
    tokens: int
    disk_bytes: int
    count: int = 0
    by_location: dict[str, int] = field(default_factory=dict)
    by_user: dict[str, int] = field(default_factory=dict)  # "(none)" for contexts without a user
    messages: int = 0
    compressions: int = 0
    duration_s: float = 0.0  # summed over the contexts with a start and an end
    durations: int = 0
    newest_by_status: dict[str, float] = field(default_factory=dict)  # epoch seconds: merge order for callers
    newest_by_user: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tally:
    """Counts and sums of the contexts of one (location, status, user); ``user_key`` is "" for no user."""

    location: str
    status: str
    user_key: str
    n: int
    tokens: int
    messages: int
    compressions: int
    duration_us: int
    durations: int
    disk_bytes: int
    newest: float


def tally_of(item: ContextSummary) -> Tally:
    """One context as a tally of one (what a context read from its directory adds to the index's totals)."""
    duration = item.duration_s
    return Tally(
        location=item.location, status=item.status, user_key=item.user or "", n=1, tokens=item.total_tokens_used,
        messages=item.message_count, compressions=item.compression_count,
        duration_us=0 if duration is None else round(duration * 1_000_000), durations=duration is not None,
        disk_bytes=0, newest=item.created_at.timestamp(),
    )


def _ordered(counts: dict[str, int], newest: dict[str, float]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], -newest.get(kv[0], 0.0))))


def fold(tallies: Iterable[Tally]) -> Totals:
    """Totals from tally rows (the index's own, or a filtered aggregate of context rows)."""
    by_status: dict[str, int] = {}
    by_user: dict[str, int] = {}
    by_location: dict[str, int] = {}
    newest_status: dict[str, float] = {}
    newest_user: dict[str, float] = {}
    sums = {"tokens": 0, "messages": 0, "compressions": 0, "duration_us": 0, "durations": 0, "disk_bytes": 0}
    for t in tallies:
        user = t.user_key or "(none)"
        by_status[t.status] = by_status.get(t.status, 0) + t.n
        by_user[user] = by_user.get(user, 0) + t.n
        by_location[t.location] = by_location.get(t.location, 0) + t.n
        newest_status[t.status] = max(newest_status.get(t.status, 0.0), t.newest)
        newest_user[user] = max(newest_user.get(user, 0.0), t.newest)
        for name in sums:
            sums[name] += getattr(t, name)
    return Totals(
        by_status=_ordered(by_status, newest_status),
        tokens=sums["tokens"],
        disk_bytes=sums["disk_bytes"],
        count=sum(by_status.values()),
        by_location=by_location,
        by_user=_ordered(by_user, newest_user),
        messages=sums["messages"],
        compressions=sums["compressions"],
        duration_s=sums["duration_us"] / 1_000_000,
        durations=sums["durations"],
        newest_by_status=newest_status,
        newest_by_user=newest_user,
    )
