"""``tasuki fleet import`` (SPEC §12, issue 27): a one-host store copied into the fleet's PostgreSQL."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from cli.common import UsageError, out, warn

if TYPE_CHECKING:
    from worker.settings_models import Settings

EXIT_OK = 0
EXIT_PROBLEM = 1


def import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--contexts", type=Path, metavar="DIR", help="the one-host contexts root (default: contexts.base_dir)"
    )
    parser.add_argument(
        "--memory", type=Path, metavar="FILE", help="the one-host memory.db (default: memory.path, or beside DIR)"
    )
    parser.add_argument(
        "--host", default=socket.gethostname(), help="the host the contexts are on (default: this one's name)"
    )


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Copy the contexts, their index rows and memory of a one-host store into ``fleet.store``; run it again and
    it adds nothing. One line per problem, a summary line at the end; exit 1 when there was a problem."""
    from fleet.importer import import_contexts, import_memory
    from memory.sqlite import SQLiteMemoryStore
    from worker.stores import fleet_store, open_memory

    if not settings.fleet.store:
        raise UsageError("fleet.store is not set: there is no fleet to import into (TASUKI__FLEET__STORE)")
    root = args.contexts or Path(settings.contexts.base_dir)
    if not root.is_dir():
        raise UsageError(f"no context store at {root} (--contexts)")
    memory_db = args.memory or (settings.memory.path if settings.memory.path is not None else root.parent / "memory.db")
    summary = import_contexts(root, fleet_store(settings), args.host, warn)
    if memory_db.is_file():
        source = SQLiteMemoryStore(memory_db)
        target = open_memory(settings)
        try:
            import_memory(source, target, summary, warn)
        finally:
            source.close()
            target.close()
    out(summary.line())
    return EXIT_PROBLEM if summary.problems else EXIT_OK
