"""A fleet step's commit beside the host's fsyncs (contexts/overlap.py): it waits for the database without holding
``.state.lock``, the step returns only once it is done, and its refusal (fenced) still stops the step."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore
from contexts.durable import DurableWriter
from contexts.errors import FencedError
from contexts.state import update_state

TASK_KEY = {"task_source": "local", "owner": "o", "repo": "r", "task_type": "prompt", "task_id": "1"}


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.01)


class HeldCommit:
    """A durable writer whose commits wait for the test to let them through (a database that is slow to answer)."""

    epoch = 1

    def __init__(self) -> None:
        self.through = threading.Event()
        self.waiting = threading.Event()
        self.committed: list[Mapping[str, Any] | None] = []
        self.refuse = False

    def check(self) -> None:
        return None

    def renew(self) -> None:
        return None

    def record(self, file: str, record_id: int, line: str) -> None:
        return None

    def commit(self, state: Mapping[str, Any] | None) -> None:
        self.waiting.set()
        assert self.through.wait(timeout=60)
        if self.refuse:
            raise FencedError("fenced: another holder's epoch")
        self.committed.append(state)

    def release(self) -> None:
        return None


class HeldCopy:
    def __init__(self, writer: HeldCommit) -> None:
        self.writer = writer

    def create(self, uuid: str, holder: str, metadata: Mapping[str, Any], state: Mapping[str, Any]) -> DurableWriter:
        return self.writer

    def take(self, uuid: str, holder: str) -> DurableWriter:
        return self.writer

    def rebuild(self, uuid: str, directory: Path) -> None:
        raise AssertionError("not rebuilt here")

    def knows(self, uuid: str) -> bool:
        return False


def test_a_step_waits_for_its_commit_without_holding_the_state_lock(tmp_path: Path) -> None:
    writer = HeldCommit()
    writer.through.set()  # the first write (creation) goes through
    ctx = ContextStore(tmp_path, fsync="step", durable=HeldCopy(writer)).create(TASK_KEY, {}, heartbeat=False)
    ctx.append_message("user", "Fix it.")
    writer.through.clear()
    writer.waiting.clear()
    ctx.append_message("assistant", "Done.")
    ctx.stage_state(add={"llm_call_count": 1})
    done = threading.Event()
    step = threading.Thread(target=lambda: (ctx.step_done(), done.set()))
    step.start()
    wait_until(writer.waiting.is_set, what="the step's commit under way")
    # The host's write is done and its lock free while the commit waits: another writer (the heartbeat, a cancel)
    # gets in at once; it would time out after 5 s on the lock otherwise.
    wait_until(lambda: ctx.read_state()["llm_call_count"] == 1, what="the step's state on the host")
    update_state(ctx.home, ctx.store.clock(), fsync=False, set_fields={"cancel_requested": True})
    assert not done.is_set()  # the step returns only once its commit is done
    writer.through.set()
    step.join(timeout=60)
    assert done.is_set()
    assert writer.committed[-1] is not None
    assert writer.committed[-1]["llm_call_count"] == 1


def test_a_refused_commit_stops_the_step_after_the_hosts_write(tmp_path: Path) -> None:
    writer = HeldCommit()
    writer.through.set()
    ctx = ContextStore(tmp_path, fsync="step", durable=HeldCopy(writer)).create(TASK_KEY, {}, heartbeat=False)
    ctx.append_message("assistant", "Done.")
    ctx.stage_state(add={"llm_call_count": 1})
    writer.refuse = True
    with pytest.raises(FencedError):
        ctx.step_done()
    ctx.append_message("assistant", "Again.")
    with pytest.raises(FencedError):  # the lines alone (no state staged) are refused as well
        ctx.step_done()
