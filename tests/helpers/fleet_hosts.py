"""Hosts of a fleet for tests: context stores with directories and hostnames of their own on one real PostgreSQL
(tests/helpers/postgres.py), and what the tests read of the lease behind them.

Fixture (registered in tests/conftest.py): ``host`` — ``host("a", lease_s=0.5)`` is host a's context store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from contexts.context import Context
from contexts.store import ContextStore
from fleet.durable import PostgresCopy
from fleet.index import PostgresIndex
from fleet.store import FleetStore

HostFactory = Callable[..., ContextStore]


@pytest.fixture
def host(tmp_path: Path, fleet_dsn: str) -> Iterator[HostFactory]:
    """``host("a")``: a context store of its own directory and hostname on the test's database; ``indexed=True``:
    its index in that database too (fleet/index.py), as ``tasuki`` on a fleet host has it."""
    stores: list[FleetStore] = []

    def make(name: str, lease_s: float = 60, *, indexed: bool = False, **options: Any) -> ContextStore:
        fleet = FleetStore(fleet_dsn, lease_s=lease_s)
        stores.append(fleet)
        if indexed:
            options["index"] = lambda root: PostgresIndex(fleet, root, host=f"host-{name}")
        return ContextStore(
            tmp_path / name / "contexts", hostname=f"host-{name}", fsync="never", durable=PostgresCopy(fleet), **options
        )

    yield make
    for fleet in stores:
        fleet.close()


def one_step(ctx: Context, text: str) -> None:
    """An agent step's records: the model's answer, a tool call and its result, then the step's commit."""
    ctx.append_message("assistant", text, tool_calls=[{"id": "c1", "type": "function"}])
    ctx.append_tool("bash", {"command": "ls"}, "success", 12, result="README.md")
    ctx.append_message("tool", "README.md", tool_call_id="c1")
    ctx.stage_state(add={"llm_call_count": 1, "tool_call_count": 1}, status="processing")
    ctx.step_done()


def committed_state(dsn: str, uuid: str) -> dict[str, Any]:
    """The context's ``state.json`` as its last commit left it in the database."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state FROM tasuki_contexts WHERE uuid = %s", (uuid,)).fetchone()
    assert row is not None
    state: dict[str, Any] = row[0]
    return state


def lease_expired(dsn: str, uuid: str) -> bool:
    """Whether the task's lease ran out, by the database's clock."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT expires_at <= now() FROM tasuki_leases WHERE uuid = %s", (uuid,)).fetchone()
    return bool(row and row[0])


def waiting_for_a_lock(dsn: str) -> bool:
    """Whether a session of this database waits for a lock in a statement on the leases (a taker held off by a
    holder); other tests' databases on the same server are not looked at."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE '%tasuki_leases%'"
        ).fetchone()
    return bool(row and row[0])


TASUKI = [sys.executable, "-m", "cli.main"]  # the command, as an operator runs it on a host


def host_cli_options(base: Path, dsn: str | None, **extra: str) -> dict[str, Any]:
    """The environment and directory of a ``tasuki`` command on a host whose contexts are under ``base``, in the fleet
    of ``dsn`` (None: one host); ``extra`` adds to its environment (``TASUKI__BROKER__URL``, say)."""
    config = base.parent / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env |= {"TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base), "COLUMNS": "100", **extra}
    env["PYTHONSAFEPATH"] = "1"  # `-m` in a directory holding `contexts/` must not import it as the package
    if dsn:
        env["TASUKI__FLEET__STORE"] = dsn
    return {"env": env, "cwd": base.parent}


def host_cli(base: Path, dsn: str | None, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``tasuki ARGS`` on a host whose contexts are under ``base``, in the fleet of ``dsn``."""
    return subprocess.run(
        [*TASUKI, *args],
        **host_cli_options(base, dsn, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
