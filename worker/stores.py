"""One way to build the context store (SPEC §3) and the memory store (§13) from settings: every command,
task and server uses these."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from contexts.clock import utc_now
from contexts.durable import ONE_HOST, DurableCopy
from contexts.errors import ContextNotFoundError
from contexts.index import ContextIndex, Index
from contexts.names import OUTCOMES_FILE
from contexts.outcomes import OutcomeStore
from contexts.outcomes_sqlite import SQLiteOutcomeStore
from contexts.store import ContextStore
from memory.errors import MemoryUnavailable
from memory.sqlite import SQLiteMemoryStore
from memory.store import MemoryStore
from worker.settings_models import Settings

if TYPE_CHECKING:
    from fleet.store import FleetStore


def _one_host(settings: Settings) -> DurableCopy:
    return ONE_HOST


def fleet_store(settings: Settings) -> FleetStore:
    """The process's one pool on the fleet's PostgreSQL, shared by every store built from these settings; connected
    at its first use, so a reader that never needs it never waits for it."""
    from fleet.store import FleetStore  # fleet mode only: one host never loads the driver

    config = settings.fleet
    assert config.store is not None  # noqa: S101 - chosen by its scheme
    key = (os.getpid(), config.store)  # a forked child makes its own: a pool's connections are not shared
    if key not in _fleet_stores:
        _fleet_stores[key] = FleetStore(
            config.store, lease_s=config.lease_s, connect_timeout_s=config.connect_timeout_s, open=False
        )
    return _fleet_stores[key]


def _postgresql(settings: Settings) -> DurableCopy:
    from fleet.durable import PostgresCopy

    return PostgresCopy(fleet_store(settings))


_fleet_stores: dict[tuple[int, str], FleetStore] = {}

DURABLE_COPIES: dict[str, Callable[[Settings], DurableCopy]] = {
    "": _one_host,  # fleet.store unset: the directories are the only copy (SPEC §12 "One host")
    "postgresql": _postgresql,
    "postgres": _postgresql,
}
"""Where contexts are kept beside the host's directories, by the scheme of ``fleet.store``'s URL."""


def durable_copy(settings: Settings) -> DurableCopy:
    """The configured durable copy (fleet.store's scheme picks it); FleetUnavailable when its store is unreachable."""
    return DURABLE_COPIES[urlsplit(settings.fleet.store or "").scheme](settings)


def _sqlite_index(settings: Settings) -> Callable[[Path], Index]:
    return ContextIndex


def _postgresql_index(settings: Settings) -> Callable[[Path], Index]:
    from fleet.index import PostgresIndex

    fleet = fleet_store(settings)
    return lambda root: PostgresIndex(fleet, root)


CONTEXT_INDEXES: dict[str, Callable[[Settings], Callable[[Path], Index]]] = {
    "": _sqlite_index,  # one host: index.sqlite3 beside running/ and completed/
    "postgresql": _postgresql_index,  # every host's contexts in the fleet's database (fleet/index.py)
    "postgres": _postgresql_index,
}
"""Where the context index is kept, by the scheme of ``fleet.store``'s URL: a factory of the store's root."""


def context_index(settings: Settings) -> Callable[[Path], Index]:
    """The configured context index's factory (fleet.store's scheme picks it)."""
    return CONTEXT_INDEXES[urlsplit(settings.fleet.store or "").scheme](settings)


def open_store(
    settings: Settings,
    *,
    must_exist: bool = True,
    on_heartbeat: Callable[[str, datetime, str], None] | None = None,
    clock: Callable[[], datetime] | None = None,
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
        hung_after_s=config.hung_after,
        fsync=config.fsync,
        on_heartbeat=on_heartbeat,
        clock=clock or utc_now,
        durable=durable_copy(settings),
        index=context_index(settings),
    )


def open_outcomes(settings: Settings) -> OutcomeStore:
    """The configured outcome store (issue 28): what became of the pull/merge requests tasks opened."""
    base = Path(settings.contexts.base_dir)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return SQLiteOutcomeStore(base)


def find_outcomes(settings: Settings) -> OutcomeStore | None:
    """The outcome store for readers: None when no request was ever recorded (looking never creates it)."""
    if not (Path(settings.contexts.base_dir) / OUTCOMES_FILE).is_file():
        return None
    return open_outcomes(settings)


def _sqlite_memory(settings: Settings, must_exist: bool) -> SQLiteMemoryStore:
    path = settings.memory.database(settings.contexts)
    if must_exist and not path.is_file():
        raise MemoryUnavailable(f"no memory store at {path} (memory.path)")
    return SQLiteMemoryStore(path)


def _postgresql_memory(settings: Settings, must_exist: bool) -> MemoryStore:
    from fleet.memory import PostgresMemoryStore

    return PostgresMemoryStore(fleet_store(settings))  # the fleet's schema is made by whoever connects first


MEMORY_STORES: dict[str, Callable[[Settings, bool], MemoryStore]] = {
    "": _sqlite_memory,  # one host: memory.db beside the contexts root
    "postgresql": _postgresql_memory,
    "postgres": _postgresql_memory,
}
"""Where memory is kept, by the scheme of ``fleet.store``'s URL (SPEC §12: no host writes SQLite on a shared disk)."""


def open_memory(settings: Settings, *, must_exist: bool = False) -> MemoryStore:
    """The configured memory store (SPEC §13); MemoryUnavailable when it cannot be opened. Readers pass
    ``must_exist`` so that looking never creates a database."""
    return MEMORY_STORES[urlsplit(settings.fleet.store or "").scheme](settings, must_exist)


@contextmanager
def kept_memory(settings: Settings) -> Iterator[MemoryStore]:
    """The process's own connection to the memory store, kept from task to task: opening one loads sqlite-vec and
    checks the schema, and closing the last one checkpoints the WAL, at every task otherwise. Made again when the
    file was replaced or removed meanwhile, and after any error (a store damaged since is found at the next open).
    Not shared: a nested use, another thread's or a forked child's opens a connection of its own."""
    if settings.fleet.store:  # the fleet's store keeps its own pool per process
        yield open_memory(settings)
        return
    path = settings.memory.database(settings.contexts)
    key = (os.getpid(), str(path))
    kept = _kept.pop(key, None)
    if kept is not None and kept[1] != _identity(path):
        with suppress(Exception):
            kept[0].close()
        kept = None
    if kept is None:
        store = _sqlite_memory(settings, must_exist=False)
        kept = (store, _identity(path))
    try:
        yield kept[0]
    except BaseException:
        with suppress(Exception):
            kept[0].close()
        raise
    _kept[key] = kept


_kept: dict[tuple[int, str], tuple[SQLiteMemoryStore, tuple[int, int] | None]] = {}


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino
