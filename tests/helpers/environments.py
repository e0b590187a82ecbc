"""Environments for the snapshot tests and the lead's benchmarks: a real virtualenv, and a timed restore."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from sandbox.snapshots import Snapshot, SnapshotStore
from tests.helpers.context_support import wait_for


def make_venv(target: Path) -> Path:
    """A real virtualenv made by the system's ``python3`` (without pip, for speed) with ``kept_module`` in it."""
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(target)], check=True, timeout=120)
    (site,) = target.glob("lib/python3*/site-packages")
    (site / "kept_module.py").write_text("ANSWER = 42\n")
    return target


def venv_runs(python: Path) -> str:
    """``sys.prefix`` and ``kept_module.ANSWER`` as the virtualenv's own python prints them."""
    ran = subprocess.run(
        [str(python), "-c", "import sys, kept_module; print(sys.prefix, kept_module.ANSWER)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return ran.stdout.strip()


def time_restore(store: SnapshotStore, snapshot: Snapshot, scratch: Path) -> float:
    """Seconds one restore of ``snapshot`` takes into a fresh home and checkout under ``scratch`` (then removed)."""
    home, checkout = scratch / "home", scratch / "checkout"
    home.mkdir(parents=True, mode=0o700)
    checkout.mkdir()
    started = time.perf_counter()
    store.restore(snapshot, home, checkout)
    elapsed = time.perf_counter() - started
    shutil.rmtree(scratch)
    return elapsed


def next_clock_tick(scratch: Path, made: Path) -> None:
    """Wait until a file changed now gets a later change time than ``made`` (file times move in clock ticks): in a
    task, the agent's first command starts long after its environment was made."""

    def later() -> bool:
        probe = scratch / "tick"
        probe.unlink(missing_ok=True)
        probe.write_text("")
        return probe.stat().st_ctime_ns > newest_change(made)

    wait_for(later, what="the next tick of the file clock")


def newest_change(path: Path) -> int:
    return max(entry.lstat().st_ctime_ns for entry in [path, *(path.rglob("*") if path.is_dir() else [])])
