"""Scripted agents for an eval (issue 39): per row of a task set, the trajectory a replay model answers its task with.

- ``oracle``: the agent applies the row's gold patch through its own tools (``bash`` running ``git apply`` on a
  heredoc), then finishes: every row it is given should be resolved, which tests the eval's whole path (the bare
  remote, the worker, the grading, the report) without a real model;
- ``empty``: the agent finishes at once, changing nothing: no row is resolved, each for "no change";
- ``mixed``: the oracle for the rows chosen, the empty agent for the others: a known resolve rate.

Each trajectory finishes twice: with the finish gate off the first finish ends the task, with it on the gate answers
the first and accepts the second. A conversation finds its row's trajectory by the row's problem statement as the
task message quotes it (:func:`replay.model.route_needle`). The routes file ``python -m replay --routes FILE`` serves
is ``{"default": [entries], "routes": {needle: [entries]}}``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from replay.model import route_needle
from replay.trajectory import Turn, turns_from_entries

KINDS = ("oracle", "empty", "mixed")
_DELIMITER = "TASUKI_GOLD_PATCH"


class OracleRow(Protocol):
    """What a route needs of a task set's row (``evals.tasksets.Row`` has it)."""

    instance_id: str
    problem_statement: str
    patch: str | None


def finish_turns(summary: str) -> list[dict[str, Any]]:
    """Two finishes: the gate (when on) answers the first, the second is accepted."""
    call = {"name": "finish", "arguments": {"summary": summary}}
    return [{"content": "Done.", "tool_calls": [call]}, {"content": "Done, checked.", "tool_calls": [call]}]


def apply_command(patch: str) -> str:
    """A bash command that applies ``patch`` to the checkout with ``git apply`` from a quoted heredoc."""
    delimiter = _DELIMITER
    while delimiter in patch:
        delimiter += "_"
    body = patch if patch.endswith("\n") else patch + "\n"
    return f"git apply --whitespace=nowarn <<'{delimiter}'\n{body}{delimiter}\n"


def oracle_entries(patch: str) -> list[dict[str, Any]]:
    """Apply the gold ``patch``, show the diff, finish."""
    return [
        {"content": "Apply the fix.", "tool_calls": [{"name": "bash", "arguments": {"command": apply_command(patch)}}]},
        {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "git status --short"}}]},
        *finish_turns("Applied the fix."),
    ]


def empty_entries() -> list[dict[str, Any]]:
    """Finish without changing anything."""
    return finish_turns("Nothing to change.")


def route_entries(
    rows: Iterable[OracleRow], kind: str, chosen: Collection[str] = (), *,
    gates: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{needle: entries}`` for ``rows``: the ``kind`` agent for each (``mixed``: the oracle for the ``chosen``
    instance ids, the empty agent for the others); ``gates`` holds a row's first turn at a named gate until a test
    opens it (``{instance_id: gate name}``). A row without a gold patch gets the empty agent."""
    if kind not in KINDS:
        raise ValueError(f"unknown scripted agent {kind!r}: one of {', '.join(KINDS)}")
    routes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        wants_oracle = kind == "oracle" or (kind == "mixed" and row.instance_id in chosen)
        entries = oracle_entries(row.patch) if wants_oracle and row.patch else empty_entries()
        gate = (gates or {}).get(row.instance_id)
        if gate:
            entries = [{"gate": gate}, *entries]
        routes[route_needle(row.problem_statement)] = entries
    return routes


def routes_document(routes: Mapping[str, list[dict[str, Any]]], default: list[dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """The routes file's content: the default trajectory (the empty agent unless given) and the routes."""
    return {"default": empty_entries() if default is None else default, "routes": dict(routes)}


def load_routes(path: Path) -> tuple[list[Turn], dict[str, list[Turn]]]:
    """The default trajectory and the routes of a routes file; ``ValueError`` if it is malformed."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a routes file ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("routes"), dict):
        raise ValueError(f"{path}: a routes file is an object with 'routes' (needle: entries) and 'default'")
    default = turns_from_entries(list(document.get("default") or []), source=f"{path} default")
    routes = {str(needle): turns_from_entries(list(entries), source=f"{path} route {index}")
              for index, (needle, entries) in enumerate(document["routes"].items(), start=1)}
    return default, routes
