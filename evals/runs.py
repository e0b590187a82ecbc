"""``tasuki eval run``: every (row, profile, attempt) of a task set as a real task through the fleet (issue 39).

Per task: a local bare remote holding only the history up to the row's base commit (:mod:`evals.remotes`), a UUID
chosen and journaled, then ``worker.submit.enqueue`` with the row's environment and grading (the worker grades the
work in the sandbox and puts ``result["grade"]`` in the task's result); then the runner polls the context store until
every task is finished or the deadline passes, and appends each finished task's record to ``results.jsonl``
(:mod:`evals.rundir`). Run again with the same name, it continues: finished tasks are never run again, journaled ones
are waited for, and sent again under the same UUID only when no context of theirs exists (the one-active-task rule
makes that a no-op for a task still queued).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid as uuid_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from evals.outcome import ENVIRONMENT_ERROR, task_record
from evals.remotes import base_repository, changed_lines, source_for, task_remote
from evals.rundir import EvalError, RunDir, TaskKey, check_name
from worker.profiles import PROFILE_KEY

POLL_S = 0.25
TASK_TYPE = "eval"


class EvalRow(Protocol):
    """What the runner reads of a task set's row (``evals.tasksets.Row``)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str


def row_value(row: object, name: str) -> Any:
    """A row's field by its SWE-bench name or its lower-case one (``FAIL_TO_PASS`` / ``fail_to_pass``)."""
    for attribute in (name, name.lower(), name.upper()):
        if hasattr(row, attribute):
            return getattr(row, attribute)
    return None


def _tests(value: Any) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return [str(test) for test in value or []]


def set_hash(rows: Sequence[EvalRow]) -> str:
    """What identifies a set's content for a run: each row's id, base commit and test patch, in order."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps([row.instance_id, row.base_commit, row.test_patch]).encode())
    return digest.hexdigest()[:16]


def make_plan(name: str, set_path: str, rows: Sequence[EvalRow], profiles: Sequence[str], attempts: int,
              now: datetime) -> dict[str, Any]:
    """``set.json`` of a new run."""
    return {"name": name, "set": set_path, "set_hash": set_hash(rows), "rows": [row.instance_id for row in rows],
            "profiles": list(profiles), "attempts": attempts, "created_at": now.isoformat()}


def task_request(run: str, row: EvalRow, key: TaskKey, remote: Path) -> dict[str, Any]:
    """The ``run_task`` request of one eval task: a local task on its bare remote, graded by the worker."""
    return {
        "task_key": {"task_source": "local", "owner": f"eval-{run}", "repo": key.instance_id,
                     "task_type": TASK_TYPE, "task_id": f"{key.profile}.{key.attempt}"},
        "repo_path": str(remote.absolute()),
        "prompt": row.problem_statement,
        "user": "eval",
        "config": {PROFILE_KEY: key.profile},
        "trigger": {"kind": "eval", "run": run},
        "environment": {"repository": row.repo, "setup": row_value(row, "setup") or None},
        "grading": {
            "test_patch": row.test_patch,
            "fail_to_pass": _tests(row_value(row, "FAIL_TO_PASS")),
            "pass_to_pass": _tests(row_value(row, "PASS_TO_PASS")),
            "test_command": row_value(row, "test_command") or None,
            "parser": row_value(row, "test_parser") or "pytest",
        },
    }


@dataclass(frozen=True)
class Fleet:
    """How the runner reaches the fleet (``evals.fleet.local_fleet`` for the real one)."""

    enqueue: Callable[[dict[str, Any], str], None]
    """Queue ``run_task`` under the UUID (a no-op when that task is already queued or running)."""
    final_state: Callable[[str], dict[str, Any] | None]
    """The task's state once it is finished (completed and final), else None."""
    started: Callable[[str], bool]
    """A context of the task exists (running or finished)."""


@dataclass
class Progress:
    """Where a run is: tasks in all, finished (resolved of them), running, queued."""

    total: int
    finished: int = 0
    resolved: int = 0
    running: int = 0
    queued: int = 0


@dataclass
class Timings:
    """The harness's own time, for the benchmark: preparing remotes, submitting, reading finished tasks."""

    prepare_s: float = 0.0
    submit_s: float = 0.0
    collect_s: float = 0.0
    submitted: int = 0
    collected: int = 0


@dataclass
class EvalRun:
    """One run of ``rows`` x ``profiles`` x ``attempts`` tasks, resumable from its directory."""

    run: RunDir
    rows: Sequence[EvalRow]
    profiles: Sequence[str]
    attempts: int
    fleet: Fleet
    repos_dir: Path | None = None
    cache_dir: Path | None = None
    clock: Callable[[], float] = time.monotonic
    timings: Timings = field(default_factory=Timings)

    def keys(self) -> list[TaskKey]:
        """Every task of the run, row by row (a row's profiles and attempts side by side)."""
        return [TaskKey(row.instance_id, profile, attempt) for row in self.rows for attempt in
                range(1, self.attempts + 1) for profile in self.profiles]

    def submit(self, on_progress: Callable[[Progress], None] | None = None) -> dict[TaskKey, str]:
        """Send every task not finished and not journaled; send again a journaled one that never started.
        Returns the UUID of every task still to wait for."""
        finished = self.run.finished()
        journal = self.run.journal()
        rows = {row.instance_id: row for row in self.rows}
        waiting: dict[TaskKey, str] = {}
        for key in self.keys():
            if key in finished:
                continue
            row = rows[key.instance_id]
            uuid = journal.get(key)
            if uuid is not None and self.fleet.started(uuid):
                waiting[key] = uuid
                continue
            started = self.clock()
            try:
                remote = self.run.remote(key)
                if uuid is None or not (remote / "HEAD").is_file():
                    self._prepare(row, key)
            except EvalError as exc:
                self.run.record(_unprepared(key, str(exc)))
                continue
            finally:
                self.timings.prepare_s += self.clock() - started
            started = self.clock()
            if uuid is None:
                uuid = str(uuid_module.uuid4())
                self.run.submitted(key, uuid)  # journaled before it is queued: a kill in between sends it again
            self.fleet.enqueue(task_request(self.run.name, row, key, self.run.remote(key)), uuid)
            self.timings.submit_s += self.clock() - started
            self.timings.submitted += 1
            waiting[key] = uuid
            if on_progress is not None:
                on_progress(self.progress(waiting))
        return waiting

    def _prepare(self, row: EvalRow, key: TaskKey) -> None:
        check_name(row.instance_id)  # a directory of the run and a part of the task key: no "/" or ".."
        cache = self.cache_dir or self.run.path.parent / "repositories"
        source = source_for(row.repo, self.repos_dir, cache)
        base = base_repository(source, row.base_commit, self.run.path / "bases" / f"{row.instance_id}.git")
        task_remote(base, self.run.remote(key))

    def progress(self, waiting: dict[TaskKey, str]) -> Progress:
        results = self.run.results()
        running = sum(1 for uuid in waiting.values() if self.fleet.started(uuid))
        return Progress(total=len(self.keys()), finished=len(results),
                        resolved=sum(1 for r in results if r.get("resolved")), running=running,
                        queued=len(waiting) - running)

    def wait(self, waiting: dict[TaskKey, str], timeout_s: float | None,
             on_progress: Callable[[Progress], None] | None = None) -> dict[TaskKey, str]:
        """Poll until every task in ``waiting`` is finished (its record appended) or ``timeout_s`` passes; returns
        the tasks still not finished."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        pending = dict(waiting)
        last: Progress | None = None
        while pending:
            for key, uuid in list(pending.items()):
                state = self.fleet.final_state(uuid)
                if state is None:
                    continue
                started = self.clock()
                record = task_record(key.to_json(), uuid, state)
                record["changed_lines"] = changed_lines(self.run.remote(key), "refs/heads/main", record["branch"])
                self.run.record(record)
                self.timings.collect_s += self.clock() - started
                self.timings.collected += 1
                del pending[key]
            now = self.progress(pending)
            if on_progress is not None and now != last:
                on_progress(now)
                last = now
            if not pending or (deadline is not None and self.clock() >= deadline):
                break
            time.sleep(POLL_S)  # the context files are the interface: there is nothing to block on
        return pending

    def execute(self, timeout_s: float | None = None,
                on_progress: Callable[[Progress], None] | None = None) -> dict[TaskKey, str]:
        """Submit what is left and wait for it; returns the tasks not finished by the deadline."""
        return self.wait(self.submit(on_progress), timeout_s, on_progress)


def _unprepared(key: TaskKey, why: str) -> dict[str, Any]:
    """The record of a task that could not start: its remote could not be made (a missing clone or commit)."""
    return {**key.to_json(), "uuid": None, "status": "failed", "resolved": False, "reason": ENVIRONMENT_ERROR,
            "error": why, "grade": None, "branch": None, "steps": 0, "tool_calls": 0, "tokens": 0,
            "cost_usd": None, "wall_s": None, "completed_at": datetime.now(UTC).isoformat()}


def open_run(var_dir: Path, name: str) -> RunDir:
    """The directory of run ``name`` under ``var_dir``."""
    from evals.rundir import evals_dir

    return RunDir(evals_dir(var_dir) / check_name(name))
