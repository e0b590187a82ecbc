"""``state.json``: read-modify-write under ``.state.lock``, replaced atomically (SPEC §3 rule 5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import filelock

from contexts.atomic import read_json, write_json_atomic
from contexts.clock import iso
from contexts.errors import ContextError
from contexts.filelocks import flock_in_place
from contexts.masking import mask_value
from contexts.names import STATE_FILE, STATE_LOCK_FILE, STATE_LOCK_TIMEOUT_S
from contexts.overlap import meanwhile
from contexts.usage import Usage, add_usage


def initial_state(now: datetime, worker: str) -> dict[str, Any]:
    """The state of a context that was just created (001 §3.2 plus Tasuki's fields)."""
    return {
        "status": "initializing",
        "started_at": iso(now),
        "updated_at": iso(now),
        "completed_at": None,
        "llm_call_count": 0,
        "tool_call_count": 0,
        "total_tokens_used": 0,
        "current_context_tokens": 0,
        "compression_count": 0,
        "last_activity": None,
        "error": None,
        "attempt": 1,
        "worker": worker,
        "cancel_requested": False,
        "token_calibration": 1.0,
    }


def read_state(directory: Path) -> dict[str, Any]:
    """The current ``state.json`` of a context directory."""
    data = read_json(directory / STATE_FILE)
    if not isinstance(data, dict):
        raise ContextError(f"{directory / STATE_FILE}: not a JSON object")
    return data


def add_calls(state: dict[str, Any], usage: Sequence[tuple[Usage, float | None]], now: datetime) -> None:
    """Add model calls' ``(usage, cost)`` to ``state``'s totals (the day's figures under ``now``'s date), and stamp
    it ``updated_at`` ``now``; the same for a ``state.json`` and a durable copy's committed state."""
    for call, cost in usage:
        state["usage"] = add_usage(state.get("usage"), call, cost, now.date().isoformat())
        state["total_tokens_used"] = int(state.get("total_tokens_used", 0)) + call.tokens
    state["updated_at"] = iso(now)


def update_state(
    directory: Path,
    now: datetime,
    *,
    fsync: bool,
    set_fields: Mapping[str, Any] | None = None,
    add: Mapping[str, int] | None = None,
    usage: Sequence[tuple[Usage, float | None]] = (),
    first: Callable[[], None] | None = None,
    alongside: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Apply ``set_fields``, counter increments ``add`` and model calls' ``(usage, cost)`` to ``state.json``;
    return the new state.

    ``first`` runs just before the write (the step's lines made durable before the state that counts them).
    ``alongside`` gets the new state on another thread while ``first`` and the write run on this one (the fleet's
    commit to its database beside the host's own fsyncs); the call returns once both are done, and never holds
    ``.state.lock`` while it waits for ``alongside`` alone (a commit retrying a database out of reach must not
    hold up the heartbeat's write)."""
    try:
        with meanwhile() as start, flock_in_place(directory / STATE_LOCK_FILE, STATE_LOCK_TIMEOUT_S):
            state = read_state(directory)
            if set_fields:
                state.update(mask_value(dict(set_fields)))  # type: ignore[call-overload]
            for key, delta in (add or {}).items():
                state[key] = int(state.get(key, 0)) + delta
            add_calls(state, usage, now)
            if alongside is not None:
                start(lambda: alongside(state))
            if first is not None:
                first()
            write_json_atomic(directory / STATE_FILE, state, fsync=fsync)
            return state
    except filelock.Timeout as exc:
        raise ContextError(f"{directory.name}: state.json is locked for more than {STATE_LOCK_TIMEOUT_S}s") from exc
