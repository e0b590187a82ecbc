"""One way to build the context store (SPEC §3) and the memory store (§13) from settings: every command,
task and server uses these."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from contexts.errors import ContextNotFoundError
from contexts.store import ContextStore
from memory.errors import MemoryUnavailable
from memory.sqlite import SQLiteMemoryStore
from worker.settings_models import Settings


def open_store(
    settings: Settings,
    *,
    must_exist: bool = True,
    on_heartbeat: Callable[[str, datetime, str], None] | None = None,
) -> ContextStore:
    """The configured context store. Readers pass ``must_exist`` so that looking never creates a store elsewhere."""
    base = Path(settings.contexts.base_dir)
    if must_exist and not base.is_dir():
        raise ContextNotFoundError(f"no context store at {base.absolute()} (contexts.base_dir)")
    config = settings.contexts
    return ContextStore(
        base,
        heartbeat_interval_s=config.heartbeat_interval_s,
        stale_after_s=config.stale_after_s,
        fsync=config.fsync,
        on_heartbeat=on_heartbeat,
    )


def open_memory(settings: Settings, *, must_exist: bool = False) -> SQLiteMemoryStore:
    """The configured memory store (SPEC §13); MemoryUnavailable when it cannot be opened. Readers pass
    ``must_exist`` so that looking never creates a database."""
    path = settings.memory.database(settings.contexts)
    if must_exist and not path.is_file():
        raise MemoryUnavailable(f"no memory store at {path} (memory.path)")
    return SQLiteMemoryStore(path)
