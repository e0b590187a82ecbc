"""Issue 26 §1 with real workers: a holder stopped (SIGSTOP of its whole process tree) inside a tool call or at
the finish boundary, past the stale time, while a worker on another host takes the task over and finishes it;
continued afterwards (SIGCONT), it reaches nothing — not the branch, not the forge, not the context — and the
task has exactly one pull request, whose head is the commit ``state.json`` records.

Both layouts: the compose one (workspaces shared by the workers) and a workspace per host. Each case here is one
trial; ``python -m bench.fencing_trials`` loops them (docs/fencing-effects.md has the counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.ci import cannot_run
from tests.helpers.fencing_trial import LAYOUTS, can_set_hostnames, run_trial, trial_stack

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _hostnames() -> None:
    if not can_set_hostnames():
        cannot_run("workers cannot be given hostnames of their own here (unshare --uts needs root)")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("step", [0, 2])
def test_a_holder_stopped_inside_a_tool_call_reaches_nothing_after_its_takeover(
    tmp_path: Path, redis_url: str, redis_client: object, layout: str, step: int
) -> None:
    with trial_stack(tmp_path, redis_url, layout, "bash", step=step, steps=4) as trial:
        state = run_trial(trial)
    assert state["tool_call_count"] == 5  # four bash calls (the stopped one answered "not run") and the finish


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_holder_continued_while_the_new_holder_works_writes_nothing_into_its_tree(
    tmp_path: Path, redis_url: str, redis_client: object, layout: str
) -> None:
    """The issue's case: the stopped call finished after SIGCONT, its line landed in the reused checkout while the
    new holder was mid-task, and reached the pull request's branch."""
    with trial_stack(tmp_path, redis_url, layout, "bash-mid", step=1, steps=4) as trial:
        run_trial(trial)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_holder_stopped_at_the_finish_boundary_reaches_nothing_after_its_takeover(
    tmp_path: Path, redis_url: str, redis_client: object, layout: str
) -> None:
    with trial_stack(tmp_path, redis_url, layout, "finish", steps=3) as trial:
        run_trial(trial)
