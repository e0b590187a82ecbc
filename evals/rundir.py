"""An eval run's directory, ``<var_dir>/evals/<run>/``: what makes a run resumable after a kill (issue 39).

- ``set.json``: the run's plan — the rows' ids, the set's hash, the profiles and attempts — written once; a second
  ``eval run`` with the same name must have the same plan;
- ``journal.jsonl``: one line per task submitted (``instance_id``, ``profile``, ``attempt``, ``uuid``), written and
  fsynced BEFORE the task is enqueued, with a UUID chosen first: a run killed between the two finds the UUID and
  sends the same task again (the one-active-task rule keeps it single), never a second one;
- ``results.jsonl``: one line per finished task (:func:`evals.outcome.task_record`); a finished task is never run
  again;
- ``remotes/<instance_id>/<profile>.<attempt>.git``: each task's bare remote (:mod:`evals.remotes`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contexts.atomic import write_json_atomic
from contexts.errors import TasukiError

SET_FILE, JOURNAL_FILE, RESULTS_FILE = "set.json", "journal.jsonl", "results.jsonl"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class EvalError(TasukiError):
    """An eval cannot run or be read: a bad name, a plan that differs from the run's, a missing run."""


@dataclass(frozen=True, order=True)
class TaskKey:
    """One task of a run: a row, a profile, an attempt (1-based)."""

    instance_id: str
    profile: str
    attempt: int

    def to_json(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "profile": self.profile, "attempt": self.attempt}

    @classmethod
    def of(cls, data: dict[str, Any]) -> TaskKey:
        return cls(str(data["instance_id"]), str(data["profile"]), int(data["attempt"]))


def check_name(name: str) -> str:
    """A run name or row id that is safe as a directory and a part of a task key."""
    if not _NAME.match(name):
        raise EvalError(f"name {name!r}: letters, digits, '.', '_' and '-' only, at most 100, not starting with "
                        "'.' or '-'")
    return name


def evals_dir(var_dir: Path) -> Path:
    """Where every run's directory is."""
    return Path(var_dir) / "evals"


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run: that task is simply not recorded yet
        if isinstance(entry, dict):
            yield entry


def _append(path: Path, entry: dict[str, Any]) -> None:
    data = (json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunDir:
    """The files of one eval run."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return (self.path / SET_FILE).is_file()

    def plan(self) -> dict[str, Any]:
        """``set.json``; :class:`EvalError` when the run does not exist."""
        try:
            data = json.loads((self.path / SET_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EvalError(f"no eval run {self.name!r} (no {self.path / SET_FILE})") from None
        except ValueError:
            raise EvalError(f"{self.path / SET_FILE} is not JSON") from None
        if not isinstance(data, dict):
            raise EvalError(f"{self.path / SET_FILE} is not a JSON object")
        return data

    def start(self, plan: dict[str, Any]) -> bool:
        """Write the plan of a new run, or check it against the existing one's; True when the run continues."""
        if self.exists():
            existing = self.plan()
            for field in ("set_hash", "profiles", "attempts"):
                if existing.get(field) != plan.get(field):
                    raise EvalError(f"eval run {self.name!r} was started with other {field.replace('_', ' ')} "
                                    f"({existing.get(field)!r}); give another --name")
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / SET_FILE, plan)
        return False

    def journal(self) -> dict[TaskKey, str]:
        """The UUID of every task submitted so far."""
        return {TaskKey.of(entry): str(entry["uuid"]) for entry in _lines(self.path / JOURNAL_FILE)}

    def submitted(self, key: TaskKey, uuid: str) -> None:
        """Journal a task before it is enqueued."""
        _append(self.path / JOURNAL_FILE, {**key.to_json(), "uuid": uuid})

    def results(self) -> list[dict[str, Any]]:
        """Every finished task's record, in the order they finished."""
        return list(_lines(self.path / RESULTS_FILE))

    def finished(self) -> set[TaskKey]:
        return {TaskKey.of(entry) for entry in self.results()}

    def record(self, entry: dict[str, Any]) -> None:
        """Append a finished task's record."""
        _append(self.path / RESULTS_FILE, entry)

    def remote(self, key: TaskKey) -> Path:
        return self.path / "remotes" / key.instance_id / f"{key.profile}.{key.attempt}.git"


def list_runs(var_dir: Path) -> list[RunDir]:
    """Every run under ``var_dir``, newest first."""
    root = evals_dir(var_dir)
    if not root.is_dir():
        return []
    runs = [RunDir(path) for path in root.iterdir() if (path / SET_FILE).is_file()]
    return sorted(runs, key=lambda run: (run.path / SET_FILE).stat().st_mtime, reverse=True)
