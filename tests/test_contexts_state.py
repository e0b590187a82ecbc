"""``state.json``: atomic replacement, counters under ``.state.lock`` across processes, masking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contexts import Context, ContextStore
from contexts.state import read_state, update_state
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    Clock,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)
from tests.helpers.schemas import validate_context_dir

REPO_ROOT = Path(__file__).resolve().parents[1]

INCREMENTER = """
import sys
from pathlib import Path
from contexts.clock import utc_now
from contexts.state import update_state
directory, times = Path(sys.argv[1]), int(sys.argv[2])
for _ in range(times):
    update_state(directory, utc_now(), fsync=False, add={"llm_call_count": 1, "total_tokens_used": 7})
update_state(directory, utc_now(), fsync=False, set_fields={"cancel_requested": True})
"""


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return ContextStore(tmp_path, fsync="step").create(TASK_KEY, CONFIG, heartbeat=False)


def test_state_is_replaced_atomically_never_rewritten_in_place(ctx: Context) -> None:
    state_file = ctx.path / "state.json"
    before_inode = state_file.stat().st_ino
    with open(state_file, "rb") as old:
        ctx.update_state(status="processing", last_activity="x" * 10_000)
        assert json.loads(old.read())["status"] == "initializing"  # the old file is whole and unchanged
    assert state_file.stat().st_ino != before_inode
    assert read_state(ctx.path)["status"] == "processing"
    assert not [p.name for p in ctx.path.iterdir() if p.name.endswith(".tmp")]


def test_readers_never_see_a_half_written_state(ctx: Context) -> None:
    bad: list[str] = []
    reads = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not done.is_set():
            raw = (ctx.path / "state.json").read_bytes()
            reads += 1
            try:
                json.loads(raw)
            except ValueError:
                bad.append(raw[:80].decode(errors="replace"))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(150):
            ctx.update_state(last_activity=f"step {n} " + "y" * (n * 300))
    finally:
        done.set()
        thread.join()
    assert bad == []
    assert reads > 0


def test_counters_add_up_across_processes_without_lost_updates(ctx: Context) -> None:
    processes = [
        subprocess.Popen([sys.executable, "-c", INCREMENTER, str(ctx.path), "25"], cwd=REPO_ROOT) for _ in range(4)
    ]
    for _ in range(25):
        ctx.update_state(add={"llm_call_count": 1, "tool_call_count": 2})
    for process in processes:
        assert process.wait(timeout=60) == 0

    state = ctx.read_state()
    assert state["llm_call_count"] == 125
    assert state["total_tokens_used"] == 4 * 25 * 7
    assert state["tool_call_count"] == 50
    assert state["cancel_requested"] is True
    validate_context_dir(ctx.path)


def test_update_state_sets_fields_adds_counters_and_stamps_updated_at(tmp_path: Path) -> None:
    clock = Clock(datetime(2025, 3, 1, tzinfo=UTC))
    ctx = ContextStore(tmp_path, clock=clock).create(TASK_KEY, CONFIG, heartbeat=False)
    clock.advance(90)

    new = ctx.update_state(add={"llm_call_count": 2, "current_context_tokens": 900}, status="processing")

    assert (new["llm_call_count"], new["current_context_tokens"], new["status"]) == (2, 900, "processing")
    assert new["updated_at"] == "2025-03-01T00:01:30.000000Z"
    assert new["started_at"] == "2025-03-01T00:00:00.000000Z"
    assert ctx.read_state() == new
    assert ctx.update_state(add={"llm_call_count": 1})["llm_call_count"] == 3


def test_state_fields_are_masked_before_they_are_written(ctx: Context) -> None:
    ctx.update_state(error="push failed: https://x:ghp_A1b2C3d4E5f6G7h8I9j0K1@github.com/o/r", status="failed")
    raw = (ctx.path / "state.json").read_text()
    assert "ghp_A1b2" not in raw
    assert read_state(ctx.path)["error"] == "push failed: https://[CREDENTIALS]@github.com/o/r"


def test_update_state_works_on_a_context_nobody_holds(ctx: Context) -> None:
    """The monitor and the cancel API write state without holding the lock, under ``.state.lock``."""
    ctx.release()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    new = update_state(ctx.path, now, fsync=True, set_fields={"cancel_requested": True}, add={"attempt": 1})
    assert new["cancel_requested"] is True
    assert new["attempt"] == 2
    assert new["updated_at"] == "2030-01-01T00:00:00.000000Z"
    assert (ctx.path / ".state.lock").exists()
    assert oct(os.stat(ctx.path / ".state.lock").st_mode & 0o777) == "0o600"


def test_open_records_the_new_worker_and_attempt(tmp_path: Path) -> None:
    first = ContextStore(tmp_path, hostname="a").create(TASK_KEY, CONFIG, heartbeat=False)
    first.detach()
    later = ContextStore(tmp_path, hostname="b", clock=lambda: datetime.now(UTC) + timedelta(minutes=5))
    second = later.open(first.uuid, heartbeat=False)
    state = second.read_state()
    assert state["worker"] == f"b:{os.getpid()}"
    assert state["attempt"] == 2
    second.release()
    validate_context_dir(second.path)


def test_the_finishing_steps_state_is_written_by_the_completing_write_not_before(tmp_path: Path) -> None:
    ctx = ContextStore(tmp_path).create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.stage_state(add={"llm_call_count": 1, "tool_call_count": 1}, last_activity="tool:finish")

    ctx.step_done(write_state=False)
    assert ctx.read_state()["llm_call_count"] == 0  # still staged: no write of its own
    done = read_state(ctx.finish("completed"))

    assert (done["llm_call_count"], done["tool_call_count"], done["status"]) == (1, 1, "completed")
    assert done["last_activity"] == "tool:finish"
