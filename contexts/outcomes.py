"""What became of the pull/merge requests tasks opened (issue 28): merged, closed unmerged or still open, with
what the thread spent on them; and the report ``tasuki outcomes`` and the console print from them.

An outcome is recorded per pull/merge request a task opened, on its thread (the issue's task key): the first task,
each follow-up task's UUID and spend, the review comments people left and the last of them, and the ending the
forge announced. The records are kept behind the :class:`OutcomeStore` Protocol (the embedded store is SQLite beside
the contexts, :mod:`contexts.outcomes_sqlite`); the figures are pure functions of what the store aggregates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol

STATES = ("open", "merged", "closed")  # closed: closed without being merged
GROUPINGS = ("repo", "model", "week")
LAST_REVIEW_ENTRIES = 5  # the review remarks kept per request: the newest, what a rejection is remembered by
REVIEW_CHARS = 1500


def week_of(moment: datetime) -> str:
    """The UTC week a moment falls in, named by its Monday (``2026-11-23``)."""
    day = moment.date()
    return (day - timedelta(days=day.weekday())).isoformat()


@dataclass(frozen=True)
class PullOutcome:
    """One pull/merge request a task opened, and what became of it."""

    pull: str  # source/owner/repo/type/N: the request as a task key
    thread: str  # source/owner/repo/type/N of the issue the work started from
    repository: str  # source/owner/name, as ``tasuki usage`` names it
    number: int
    url: str
    branch: str
    model: str  # the model of the task that opened it
    first_uuid: str
    started_at: datetime  # the first task's creation: time to merge counts from here
    opened_at: datetime
    state: str = "open"
    closed_at: datetime | None = None  # merged or closed
    followups: int = 0  # follow-up tasks on the request (reviews, comments, CI fixes, retries)
    review_comments: int = 0
    tokens: int = 0  # every task of the request's thread: the first and its follow-ups
    cost_usd: float | None = None  # None: none of them was priced
    tasks: tuple[str, ...] = ()
    last_review: tuple[dict[str, Any], ...] = ()  # {author, body, path, line, at}, oldest first, masked

    @property
    def time_to_merge_s(self) -> float | None:
        """Seconds from the first task's creation to the merge; None unless merged."""
        if self.state != "merged" or self.closed_at is None:
            return None
        return max((self.closed_at - self.started_at).total_seconds(), 0.0)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (times as ISO 8601)."""
        data = asdict(self)
        for name in ("started_at", "opened_at", "closed_at"):
            data[name] = data[name].isoformat() if data[name] else None
        data["time_to_merge_s"] = self.time_to_merge_s
        return data


@dataclass(frozen=True)
class OutcomeGroup:
    """What the store aggregates for one group (a repository, a model, a week, or everything)."""

    key: str
    counts: dict[str, int] = field(default_factory=dict)  # by state
    followups: int = 0
    review_comments: int = 0
    tokens: int = 0
    cost_usd: float | None = None
    median_merge_s: float | None = None  # the merged requests' median time to merge


@dataclass(frozen=True)
class OutcomeRow:
    """The figures of one group, as ``tasuki outcomes`` prints them."""

    key: str
    opened: int
    merged: int
    closed_unmerged: int
    still_open: int
    merge_rate: float | None  # merged / (merged + closed unmerged): of the requests decided
    cost_usd: float | None
    cost_per_merged_usd: float | None  # every request's spend / the merged ones
    median_time_to_merge_s: float | None
    followups_per_pr: float | None
    review_comments: int
    tokens: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def row_of(group: OutcomeGroup) -> OutcomeRow:
    """A group's figures: rates and medians from its counts and sums."""
    merged, closed = group.counts.get("merged", 0), group.counts.get("closed", 0)
    opened = sum(group.counts.values())
    decided = merged + closed
    cost = group.cost_usd
    return OutcomeRow(
        key=group.key,
        opened=opened,
        merged=merged,
        closed_unmerged=closed,
        still_open=group.counts.get("open", 0),
        merge_rate=round(merged / decided, 4) if decided else None,
        cost_usd=cost,
        cost_per_merged_usd=round(cost / merged, 6) if cost is not None and merged else None,
        median_time_to_merge_s=group.median_merge_s,
        followups_per_pr=round(group.followups / opened, 3) if opened else None,
        review_comments=group.review_comments,
        tokens=group.tokens,
    )


@dataclass(frozen=True)
class Selection:
    """Which requests a report covers: those opened on ``since``..``until`` (UTC days, inclusive) of ``repository``."""

    repository: str | None = None
    since: date | None = None
    until: date | None = None


class OutcomeStore(Protocol):
    """Where outcomes are kept. The embedded store is one SQLite file; a fleet beyond one host puts a server-backed
    store behind the same methods, so nothing here assumes a file."""

    def opened(self, outcome: PullOutcome) -> bool:
        """Record a request a task opened; False when it was recorded already (a redelivered ending)."""
        ...

    def add_task(self, pull: str, uuid: str, *, followup: bool, tokens: int, cost_usd: float | None) -> bool:
        """Count a task of the request's thread (its spend as of its ending; again: replaced). False: no such
        request."""
        ...

    def note_review(self, pull: str, entries: Sequence[dict[str, Any]]) -> bool:
        """Count review comments on the request and keep the newest (``LAST_REVIEW_ENTRIES``). False: the request
        is not recorded yet; the review is kept and counted when it is (``opened``)."""
        ...

    def ended(self, pull: str, *, merged: bool, at: datetime, review_comments: int | None = None) -> str | None:
        """The forge says the request was merged or closed: its previous state, None when no task opened it.
        ``review_comments``: the forge's own count, when it gives one (never lowers the count)."""
        ...

    def reopened(self, pull: str) -> str | None:
        """The request was reopened: its previous state, None when no task opened it."""
        ...

    def get(self, pull: str) -> PullOutcome | None:
        """One request's outcome."""
        ...

    def groups(self, by: str | None, selection: Selection) -> list[OutcomeGroup]:
        """The selection's aggregates, grouped ``by`` repo, model or week (None: one group, ``all``)."""
        ...

    def close(self) -> None:
        """Let go of the store's resources."""
        ...


def report(store: OutcomeStore, by: str | None, selection: Selection) -> tuple[list[OutcomeRow], OutcomeRow]:
    """The rows of ``tasuki outcomes`` (grouped ``by``, biggest first; weeks in order) and their total."""
    rows = [row_of(group) for group in store.groups(by, selection)]
    if by == "week":
        rows.sort(key=lambda row: row.key)
    else:
        rows.sort(key=lambda row: (-row.opened, row.key))
    total = store.groups(None, selection) if by is not None else []
    whole = row_of(total[0]) if total else (rows[0] if rows and by is None else row_of(OutcomeGroup("all")))
    return rows, whole


def weekly(store: OutcomeStore, now: datetime, weeks: int) -> list[OutcomeRow]:
    """The last ``weeks`` weeks (this one included), one row each, empty weeks too: the console's chart."""
    first = date.fromisoformat(week_of(now)) - timedelta(weeks=weeks - 1)
    found = {group.key: group for group in store.groups("week", Selection(since=first))}
    keys = [(first + timedelta(weeks=n)).isoformat() for n in range(weeks)]
    return [row_of(found.get(key, OutcomeGroup(key))) for key in keys]
