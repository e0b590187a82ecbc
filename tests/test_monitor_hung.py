"""A hung holder loses its task on its own host too (issue 26, point 3): a real worker's pool child stopped
with SIGSTOP (``kill -0`` still answers for it) is taken over once its heartbeat is older than
``contexts.hung_after_s``, the monitor kills it (the same incarnation, checked through a pidfd), and the task
completes on another worker."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from contexts.lock import process_alive
from tests.helpers.beat_process import children_of
from tests.test_monitor_chaos import (
    FINISH_TIMEOUT_S,
    assert_one_history,
    chaos_stack,
    holder_pid,
    mid_task_on,
    running_state,
    send_tasks,
    sleepy_turns,
)

pytestmark = pytest.mark.integration

HUNG_AFTER_S = "6"  # beside the stack's heartbeat 1 s and stale 3 s


def test_a_stopped_pool_child_on_the_monitors_host_is_killed_and_its_task_resumed_elsewhere(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    entries = sleepy_turns(8)
    with chaos_stack(tmp_path, redis_url, entries, TASUKI__CONTEXTS__HUNG_AFTER_S=HUNG_AFTER_S) as (stack, server):
        first = stack.start_worker("w1", queues="tasks")
        [uuid] = send_tasks(stack, tmp_path, 1)
        stack.wait_until(lambda: mid_task_on(stack, [uuid], first, min_steps=2), what="the task running on w1")
        stuck = holder_pid(running_state(stack, uuid))
        os.kill(stuck, signal.SIGSTOP)  # wedged: alive to kill -0, silent to the heartbeat index
        second = stack.start_worker("w2", queues="tasks")
        finished = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
        state = assert_one_history(stack, server, uuid, len(entries)) if finished else {}
        stack.wait_until(lambda: not process_alive(stuck), what="the stuck process to be gone")
        monitor_log = "\n".join(w.log_text() for w in stack.workers if w.name == "maint")
        pools = children_of(first.pid) | children_of(second.pid)  # w1 replaces its killed child: either may resume
    assert (state["status"], state["attempt"]) == ("completed", 2)
    assert holder_pid(state) in pools - {stuck}
    assert "monitor killed a hung holder" in monitor_log
