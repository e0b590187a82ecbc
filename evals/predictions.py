"""An eval run's predictions in SWE-bench's format (issue 39): ``instance_id``, ``model_name_or_path``,
``model_patch``, one JSON line per finished task, so that the official harness can grade them too.

The patch is what the task pushed, read from its bare remote: ``git diff main..<branch>`` (the remote's ``main`` is
the row's base commit, and nothing else ever moves it); a task that pushed nothing has an empty patch. The model name
is the profile, and ``<profile>.<attempt>`` for the attempts after the first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evals.remotes import model_patch
from evals.rundir import RunDir, TaskKey


def predictions(run: RunDir) -> Iterator[dict[str, Any]]:
    """One prediction per finished task of ``run``, in the order they finished."""
    for entry in run.results():
        key = TaskKey.of(entry)
        name = key.profile if key.attempt == 1 else f"{key.profile}.{key.attempt}"
        yield {"instance_id": key.instance_id, "model_name_or_path": name,
               "model_patch": model_patch(run.remote(key), "refs/heads/main", entry.get("branch"))}


def write_predictions(run: RunDir, path: Path) -> int:
    """Write ``run``'s predictions as JSON Lines to ``path``; returns how many."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for prediction in predictions(run):
            out.write(json.dumps(prediction, ensure_ascii=False) + "\n")
            count += 1
    return count
