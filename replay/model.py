"""Tasuki's replay model (SPEC §11): an HTTP server speaking the OpenAI and Ollama chat APIs from a trajectory.

Which turn a request gets is decided by the request alone, so the answer is deterministic and survives
both compression and a worker crash:

- every replayed answer's content opens with ``[tasuki-replay turn=N]`` and its tool calls have ids
  ``call_t{N}_{k}``; the agent writes both to ``messages.jsonl`` and sends them back in later prompts;
- a summary request (system prompt starting "You summarize") is answered with a summary that opens with
  the marker of the latest turn in its span, so the summary carries it once those turns are compressed;
- an agent request gets turn ``1 + the highest N`` named by any marker (system, user or assistant
  content; never tool output, which is untrusted) or replayed call id it contains, and turn 0 when none.

A resumed worker re-sends the conversation as it is on disk: if its reply to turn N was written before
the crash it gets N+1, otherwise N again. Only scripted faults and delays keep server-side state: each is
served once per conversation (keyed by the system prompt and the pinned task). A gated turn is held until
its gate opens (every conversation, every time, until then). A request past the last turn gets HTTP 400
"replay trajectory exhausted".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from replay.rules import (
    call_id,
    conversation_key,
    is_memory_request,
    is_summary_request,
    next_turn_index,
    prompt_token_estimate,
    replay_memory,
    replay_summary,
    turn_marker,
)
from replay.trajectory import Turn

__all__ = ["Answer", "ReplayModel"]


@dataclass(frozen=True)
class Answer:
    """What the replay model says to one chat request: a turn, a summary, or an HTTP error."""

    kind: str  # "agent", "summary" or "memory"
    status: int = 200
    turn: int | None = None
    content: str | None = None
    tool_calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()  # (id, name, arguments)
    error: str | None = None


class ReplayModel:
    """Answers chat requests from ``trajectory``; records every request for tests (``GET /_requests``)."""

    def __init__(self, trajectory: list[Turn]) -> None:
        self.trajectory = trajectory
        self.requests: list[dict[str, Any]] = []
        self._faults_served: dict[tuple[str, int], int] = {}
        self._delayed: set[tuple[str, int]] = set()
        self._summary_faults = [status for turn in trajectory for status in turn.summary_faults]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gates_open: dict[str, threading.Event] = {}
        self._gates_reached: dict[str, threading.Event] = {}

    def record(self, method: str, path: str, body: Any) -> dict[str, Any]:
        """Log a request on arrival; ``kind`` and ``turn`` are filled in when chosen, ``status`` when sent."""
        messages = body.get("messages") if isinstance(body, dict) else None
        entry: dict[str, Any] = {
            "method": method,
            "path": path,
            "body": body,
            "prompt_tokens": prompt_token_estimate(messages, body.get("tools")) if isinstance(messages, list) else 0,
            "kind": None,
            "turn": None,
            "status": None,
        }
        with self._lock:
            self.requests.append(entry)
        return entry

    def note(self, entry: dict[str, Any] | None, **fields: Any) -> None:
        """Fill in fields of a logged request (under the lock that ``snapshot`` takes)."""
        if entry is not None:
            with self._lock:
                entry.update(fields)

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the request log, safe to serialize while requests keep arriving."""
        with self._lock:
            return [dict(entry) for entry in self.requests]

    def answer(self, messages: list[dict[str, Any]], entry: dict[str, Any] | None = None) -> Answer:
        """The answer to one chat request; waits out a scripted delay (``entry`` shows the turn meanwhile)."""
        if is_summary_request(messages):
            self.note(entry, kind="summary")
            return self._answer_summary(messages)
        if is_memory_request(messages):
            self.note(entry, kind="memory")
            return Answer("memory", content=replay_memory(messages))
        index = next_turn_index(messages)
        self.note(entry, kind="agent", turn=index)
        if index >= len(self.trajectory):
            error = f"replay trajectory exhausted: it has {len(self.trajectory)} turns, turn {index} was asked for"
            return Answer("agent", status=400, turn=index, error=error)
        turn = self.trajectory[index]
        key = (conversation_key(messages), index)
        with self._lock:
            served = self._faults_served.get(key, 0)
            if served < len(turn.faults):
                self._faults_served[key] = served + 1
                return Answer("agent", status=turn.faults[served], turn=index, error="scripted failure")
            delay = turn.delay_s if key not in self._delayed else 0.0
            self._delayed.add(key)
        if delay:
            self._stopping.wait(delay)  # cut short when the server stops
        if turn.gate is not None:
            self._pass_gate(turn.gate)
        return Answer(
            "agent",
            turn=index,
            content=f"{turn_marker(index)} {turn.content or ''}".rstrip(),
            tool_calls=tuple(
                (call_id(index, k), call.name, dict(call.arguments)) for k, call in enumerate(turn.tool_calls)
            ),
        )

    def _answer_summary(self, messages: list[dict[str, Any]]) -> Answer:
        with self._lock:
            if self._summary_faults:
                return Answer("summary", status=self._summary_faults.pop(0), error="scripted failure")
        return Answer("summary", content=replay_summary(messages))

    def _gate(self, name: str) -> tuple[threading.Event, threading.Event]:
        with self._lock:
            return (
                self._gates_reached.setdefault(name, threading.Event()),
                self._gates_open.setdefault(name, threading.Event()),
            )

    def _pass_gate(self, name: str) -> None:
        reached, opened = self._gate(name)
        reached.set()
        while not opened.wait(0.05) and not self._stopping.is_set():
            pass  # released by open_gate, or by stop()

    def open_gate(self, name: str) -> None:
        """Let every request held at gate ``name`` (and every later one) have its answer."""
        self._gate(name)[1].set()

    def gate_reached(self, name: str) -> bool:
        """True once a request has arrived at gate ``name`` (whether or not it was opened since)."""
        return self._gate(name)[0].is_set()

    def gates(self) -> dict[str, dict[str, bool]]:
        """Every gate known so far: whether a request reached it and whether it is open."""
        with self._lock:
            names = set(self._gates_reached) | set(self._gates_open)
            return {
                name: {
                    "reached": name in self._gates_reached and self._gates_reached[name].is_set(),
                    "open": name in self._gates_open and self._gates_open[name].is_set(),
                }
                for name in sorted(names)
            }

    def stop(self) -> None:
        """Release requests waiting out a delay or held at a gate."""
        self._stopping.set()
