"""Live progress of one task for ``tasuki submit --wait`` and ``tasuki demo``: its environment as it is set up (and a
failed setup's last lines), then status, step, tokens."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.environment_view import environment_line, failure_tail, setup_record
from contexts import ContextStore
from contexts.names import FINAL_STATUSES
from contexts.state import read_state

POLL_S = 0.5


def progress_line(state: dict[str, Any]) -> str:
    """One line: status, step, tokens, compressions, last activity."""
    return (
        f"{state.get('status', '?'):<12} step {state.get('llm_call_count', 0):>3} · "
        f"tools {state.get('tool_call_count', 0):>3} · tokens {state.get('total_tokens_used', 0):>7,} · "
        f"compressions {state.get('compression_count', 0)} · attempt {state.get('attempt', 1)} · "
        f"{state.get('last_activity') or ''}"
    ).rstrip(" ·")


def current_state(store: ContextStore, uuid: str) -> dict[str, Any] | None:
    """The task's state wherever its context is now, or ``None`` while it is still queued."""
    located = _located_state(store, uuid)
    return located[1] if located else None


def _located_state(store: ContextStore, uuid: str) -> tuple[Path, dict[str, Any]] | None:
    for directory in (store.running_path(uuid), store.completed_path(uuid)):
        try:
            return directory, read_state(directory)
        except (FileNotFoundError, ValueError):
            continue
    return None


def environment_lines(directory: Path, state: dict[str, Any]) -> list[str]:
    """``environment  built in 3.2 s (declared by ...)``; a failed setup's last lines below its line."""
    line = environment_line(state.get("environment"))
    if not line:
        return []
    lines = [f"{'environment':<12} {line}"]
    if (state.get("environment") or {}).get("outcome") == "failed":
        tail = failure_tail(setup_record(directory))
        if tail:
            lines += ["             its last lines:", *(f"             | {text}" for text in tail)]
    return lines


def watch(
    store: ContextStore,
    uuid: str,
    say: Callable[[str], None],
    *,
    timeout_s: float | None = None,
    alive: Callable[[], bool] = lambda: True,
    stopped: Callable[[], dict[str, Any] | None] = lambda: None,
) -> dict[str, Any] | None:
    """Print a line whenever the task's progress changes; return the final state (``None`` on timeout), or how
    its worker ended it when the context could not be finished (``stopped``: a full disk)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = ""
    last_environment = ""
    said_queued = False
    while deadline is None or time.monotonic() < deadline:
        located = _located_state(store, uuid)
        if located is None:
            if not said_queued:
                say("queued       waiting for a worker")
                said_queued = True
        else:
            directory, state = located
            environment = environment_lines(directory, state)
            if environment and environment[0] != last_environment:
                for text in environment:
                    say(text)
                last_environment = environment[0]
            line = progress_line(state)
            if line != last:
                say(line)
                last = line
            if state.get("status") in FINAL_STATUSES and store.completed_path(uuid).is_dir():
                return state
        stop = stopped()
        if stop is not None:
            return stop
        if not alive():
            return None
        time.sleep(POLL_S)  # the files are the interface: there is nothing to block on
    return None
