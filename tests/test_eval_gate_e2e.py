"""The oracle agent of replay/oracle.py with the finish gate on (issue 39): the gate answers its first finish with
its review and the second is accepted, and the task is resolved. Its own module: the other eval tests' workers run
with the gate off on a module-long stack, which must not take this test's task."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.outcome import task_record
from evals.remotes import base_repository, task_remote
from evals.rundir import TaskKey
from evals.runs import task_request
from tests.helpers.eval_sets import make_set, profiles_env, scripted
from tests.helpers.stack import Stack

pytestmark = pytest.mark.integration


def test_the_oracle_is_resolved_with_the_finish_gate_on_too(tmp_path: Path, redis_url: str) -> None:
    """The gate answers the oracle's first finish with its review; the second is accepted (four steps)."""
    synthetic = make_set(tmp_path / "set", rows=1)
    row = synthetic.rows[0]
    model = scripted(synthetic.rows, "oracle")
    stack = Stack(tmp_path, redis_url, model.url, env_overrides={
        **profiles_env({"oracle": model}), "TASUKI__AGENT__FINISH_GATE": "true"})
    try:
        stack.start_worker("gated")
        base = base_repository(synthetic.source, row.base_commit, tmp_path / "base.git")
        remote = task_remote(base, tmp_path / "remote.git")
        uuid = stack.send(task_request("gate-on", row, TaskKey(row.instance_id, "oracle", 1), remote))
        state = stack.wait_finished(uuid, timeout_s=180)
    finally:
        stack.stop()
        model.stop()
    record = task_record({"instance_id": row.instance_id, "profile": "oracle", "attempt": 1}, uuid, state)
    assert (record["resolved"], record["steps"]) == (True, 4), record
