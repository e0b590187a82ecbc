"""Small shared pieces of the context-store tests: a task key, a config, a settable clock, polling."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

TASK_KEY: dict[str, Any] = {
    "task_source": "github",
    "owner": "octo",
    "repo": "hello",
    "task_type": "issue",
    "task_id": "42",
}
CONFIG: dict[str, Any] = {
    "llm_provider": "openai",
    "model": "gpt-test",
    "context_length": 8192,
    "compression_threshold": 0.7,
}

T = TypeVar("T")


class Clock:
    """A clock the test moves by hand; records how often it was read (to know a thread got that far)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
        self.reads = 0
        self._guard = threading.Lock()

    def __call__(self) -> datetime:
        with self._guard:
            self.reads += 1
            return self.now

    def advance(self, seconds: float) -> None:
        with self._guard:
            self.now += timedelta(seconds=seconds)


def shifted_clock(seconds: float) -> Callable[[], datetime]:
    """The real clock, ``seconds`` ahead: another store's view after that much time without heartbeats."""
    return lambda: datetime.now(UTC) + timedelta(seconds=seconds)


def wait_for(predicate: Callable[[], T | None], *, timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def modes_under(root: Path) -> dict[str, int]:
    """``{relative path: st_mode}`` of ``root`` and everything below it (entries that vanish are skipped)."""
    out = {".": os.lstat(root).st_mode}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            try:
                out[str(full.relative_to(root))] = os.lstat(full).st_mode
            except FileNotFoundError:  # a temporary file renamed away by a heartbeat meanwhile
                continue
    return out


def loose_modes(root: Path) -> dict[str, str]:
    """Entries below ``root`` that are not 0700 (directories) or 0600 (files), with their modes."""
    bad = {}
    for rel, mode in modes_under(root).items():
        expected = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != expected:
            bad[rel] = oct(stat.S_IMODE(mode))
    return bad


def waiting_in(thread: threading.Thread, module_part: str) -> bool:
    """True while ``thread`` is executing code from a file whose path contains ``module_part``.

    Lets a test know that another thread is blocked inside, say, ``filelock`` without sleeping.
    """
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if module_part in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def store_bases(root: Path) -> list[Path]:
    """Every context store base directory below ``root`` (recognised by its ``.staging`` directory)."""
    return sorted(staging.parent for staging in root.rglob(".staging") if staging.is_dir())


@pytest.fixture(autouse=True)
def every_context_is_valid(tmp_path: Path) -> Iterator[None]:
    """After the test: every context it left below ``tmp_path`` matches the schemas, and no staging remains.

    Test modules import this fixture so that no context a test produces escapes validation.
    """
    yield
    from tests.helpers.schemas import validate_context_dir

    for base in store_bases(tmp_path):
        assert list((base / ".staging").iterdir()) == [], f"{base}: staging left behind"
        for location in ("running", "completed"):
            for directory in sorted((base / location).iterdir()):
                if not directory.name.startswith("."):
                    validate_context_dir(directory)
