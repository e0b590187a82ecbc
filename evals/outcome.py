"""What one finished eval task came to: resolved or not, why not, and what it cost (pure; issue 39).

A task's final ``state.json`` is everything the runner reads: ``result["grade"]`` (the worker grades the work in the
sandbox, ``sandbox.test_results.Grade``), ``result["unchanged"]``, the final status and its ``reason`` (a limit or
the model), the step and token counters and the metered cost. The reasons an unresolved task gets:

- ``no change``: the agent changed nothing;
- ``tests fail``: it changed something and the held-back tests did not all pass;
- ``limit``: a step, time or budget limit stopped it;
- ``model error``: its model stayed down or stopped writing calls;
- ``environment error``: anything else (the grading could not run, the clone or the environment failed, a crash).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

NO_CHANGE, TESTS_FAIL, LIMIT, MODEL_ERROR, ENVIRONMENT_ERROR = (
    "no change", "tests fail", "limit", "model error", "environment error")
REASONS = (NO_CHANGE, TESTS_FAIL, LIMIT, MODEL_ERROR, ENVIRONMENT_ERROR)
_LIMIT_STOPS = ("steps", "time", "budget")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def unresolved_reason(state: Mapping[str, Any]) -> str | None:
    """Why a finished task did not resolve its row; None when it did (its grade says every test passed)."""
    result = _mapping(state.get("result"))
    grade = result.get("grade") if isinstance(result.get("grade"), Mapping) else None
    if grade is not None and grade.get("resolved") is True:
        return None
    stop = state.get("reason")
    if stop in _LIMIT_STOPS or state.get("status") == "timeout":
        why = LIMIT
    elif stop == "model":
        why = MODEL_ERROR
    elif result.get("unchanged") or (grade is None and state.get("status") == "completed"
                                     and not result.get("branch")):
        why = NO_CHANGE
    elif grade is not None:
        why = ENVIRONMENT_ERROR if grade.get("error") else TESTS_FAIL
    else:
        why = ENVIRONMENT_ERROR
    return why


def _seconds_between(start: object, end: object) -> float | None:
    try:
        return max((datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds(), 0.0)
    except ValueError:
        return None


def task_record(key: Mapping[str, Any], uuid: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """The ``results.jsonl`` line of a finished task: its key (instance_id, profile, attempt), the outcome, the
    figures (steps, tool calls, tokens, cost in USD or None when unpriced, wall seconds from start to completion)."""
    result = _mapping(state.get("result"))
    usage = _mapping(state.get("usage"))
    reason = unresolved_reason(state)
    grade = result.get("grade") if isinstance(result.get("grade"), Mapping) else None
    cost = usage.get("cost_usd")
    return {
        "instance_id": key["instance_id"],
        "profile": key["profile"],
        "attempt": int(key["attempt"]),
        "uuid": uuid,
        "status": state.get("status"),
        "resolved": reason is None,
        "reason": reason,
        "error": state.get("error"),
        "grade": dict(grade) if grade is not None else None,
        "branch": result.get("branch"),
        "checks": result.get("checks"),  # "failed" when the finish gate's checks failed on the delivered tree
        "changed_lines": None,  # filled in from the task's remote by the runner
        "steps": int(state.get("llm_call_count") or 0),
        "tool_calls": int(state.get("tool_call_count") or 0),
        "tokens": int(usage.get("tokens") or state.get("total_tokens_used") or 0),
        "cost_usd": float(cost) if cost is not None else None,
        "wall_s": _seconds_between(state.get("started_at"), state.get("completed_at")),
        "completed_at": state.get("completed_at"),
    }
