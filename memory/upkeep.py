"""Keeping memory in shape: pruning old episodes (the retention job and ``tasuki memory prune``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from memory.store import MemoryStore


def prune_old(store: MemoryStore, now: datetime, after_days: int, *, dry_run: bool = False) -> list[str]:
    """Episodes that ended more than ``after_days`` before ``now``: deleted (or only listed)."""
    return store.prune(now - timedelta(days=after_days), dry_run=dry_run)
