"""What every SQLite file of the context store shares (the context index, the outcome store): created private,
opened in WAL mode, written in immediate transactions."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def create_private(path: Path) -> bool:
    """Create the file 0600 unless it exists (SQLite gives its -wal and -shm files the same mode); True if new."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def open_wal(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, usable from any thread of its process."""
    db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # a lost commit after a power cut is repaired like a crash
    except BaseException:
        db.close()
        raise
    return db


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One immediate transaction: concurrent writers queue on SQLite's lock instead of failing."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
