"""A contexts root that fills up mid-task (issue 26, point 6), with real workers: the task ends visibly — its lock
given up so the monitor can act, the issue told, ``tasuki submit --wait`` back with a one-line reason — and once
there is room again it is finished, failed, from whole files.

Real parts: a 2 MB tmpfs as the contexts root (root only, skipped with the reason elsewhere), filled when the replay
model holds an answer (an event, never a delay); ``tasuki submit --wait`` as a real command; a real worker, the
beat and a maintenance worker as the monitor; the fake GitHub over HTTP and git; real Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.beat_process import BeatProcess
from tests.helpers.celery_worker import REPO_ROOT
from tests.helpers.fake_forge import FakeForge
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import make_buggy_repo
from tests.helpers.tmpfs import fill, mounted_tmpfs
from tests.helpers.worker_scenarios import bash_turn, finish_turn, running_stack

pytestmark = pytest.mark.integration

FORGE_TOKEN = "disk-full-forge-token-9c2e"
OWNER, REPO = "octo", "calc"
SIZE = 2 * 1024 * 1024
MONITOR_ENV = {"TASUKI__MONITOR__INTERVAL_S": "1", "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2"}
TIMEOUT_S = 120.0


def test_a_contexts_disk_that_fills_mid_task_ends_the_task_visibly_and_it_fails_once_there_is_room(
    tmp_path: Path, redis_url: str
) -> None:
    # The model holds its third answer at a gate until the test has filled the disk.
    turns = [bash_turn(0), bash_turn(1), {"gate": "full"}, bash_turn(2, lines=200), bash_turn(3), finish_turn()]
    with mounted_tmpfs(tmp_path / "tiny", SIZE) as tiny, FakeForge(tmp_path / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        item = forge.add_item(OWNER, REPO, 1, "Fix add()", "It subtracts.", labels=["bug"])
        contexts = tiny / "contexts"
        env = {**MONITOR_ENV, "TASUKI__CONTEXTS__BASE_DIR": str(contexts), "GITHUB_TOKEN": FORGE_TOKEN,
               "TASUKI__GITHUB__API_URL": forge.github_api_url,
               "TASUKI__MEMORY__PATH": str(tmp_path / "memory.db")}
        (tmp_path / "stack").mkdir()
        with running_stack(tmp_path / "stack", redis_url, turns, env=env) as (stack, server):
            stack.start_worker("w1", queues="tasks,compression")
            stack.start_worker("maint", queues="maintenance", pool="solo")
            beat = BeatProcess("beat", stack.env(), tmp_path).start()
            submit = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "submit", "--repo", f"{OWNER}/{REPO}", "--issue", "1", "--wait"],
                cwd=REPO_ROOT, env=stack.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                stack.wait_until(lambda: server.model.gate_reached("full"), TIMEOUT_S, "the third model request")
                filler = fill(tiny)  # the disk fills while the model thinks ...
                server.model.open_gate("full")

                out, err = submit.communicate(timeout=TIMEOUT_S)
                uuid = out.splitlines()[0].strip()
                running = contexts / "running" / uuid
                # ... submit --wait comes back at once with the reason, in one line, not waiting for room
                assert submit.returncode == 1, (out, err)
                assert "Traceback" not in err
                reasons = [line for line in out.splitlines() if line.startswith("failed: ")]
                assert len(reasons) == 1, out
                assert "could not be finished" in reasons[0]
                assert "no space left" in reasons[0].lower()
                assert running.is_dir()  # not finished: there was no room to record it ...
                # ... but its lock is given up (just after the stop is recorded, which submit saw), the monitor can act
                stack.wait_until(lambda: not (running / ".lock").exists(), TIMEOUT_S, "the lock given up")
                assert "coding agent failed" in item.labels  # the issue is told
                assert any("could not be finished" in comment.body for comment in item.comments)

                filler.unlink()  # room again: the task is finished as its worker ended it
                state = stack.wait_until(lambda: _final(contexts, uuid), TIMEOUT_S, "the task to be finished")
            finally:
                beat.stop()
                if submit.poll() is None:
                    submit.kill()
                    submit.communicate()
            assert state["status"] == "failed", state
            assert "could not be finished" in state["error"]
            assert not running.exists()
            completed = contexts / "completed" / uuid
            validate_context_dir(completed)  # every file whole: nothing half-written was kept
            assert not (completed / ".lock").exists()


def _final(contexts: Path, uuid: str) -> dict[str, object] | None:
    path = contexts / "completed" / uuid / "state.json"
    try:
        state: dict[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("status") in ("completed", "failed") else None
