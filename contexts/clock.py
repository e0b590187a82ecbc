"""Timestamps as the context files write them: ISO 8601, UTC, microseconds, a trailing ``Z``."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC; the one place the store reads the clock."""
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """Format ``moment`` the way every context file does."""
    m = moment if moment.tzinfo is UTC else moment.astimezone(UTC)
    # An f-string, not strftime: this runs for every record written, and strftime is twice as slow.
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}.{m.microsecond:06d}Z"
    )


def parse_iso(text: str) -> datetime:
    """Parse a timestamp written by :func:`iso` (or any ISO 8601 string with an offset or ``Z``)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment
