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
the test opens its gate (for every conversation, or for those carrying a mark it released). A request
past the last turn gets HTTP 400 "replay trajectory exhausted".

Several conversations may follow different trajectories (an eval's rows, :mod:`replay.oracle`): ``routes`` maps a
needle to a trajectory, and a conversation whose first user message (the pinned task) contains the needle follows it
(the longest needle found wins); any other conversation follows the default ``trajectory``. The task message quotes
the prompt (``agent.prompts.task_message``), so a needle is taken from the prompt as quoted (:func:`route_needle`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
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
    text_of,
    turn_marker,
)
from replay.trajectory import Turn

__all__ = ["Answer", "Gate", "ReplayModel", "route_needle"]


def route_needle(prompt: str) -> str:
    """The text of ``prompt`` as the task message quotes it: a needle that finds the conversation of that prompt."""
    return prompt.replace("</task>", "<\\/task>").strip()


@dataclass(frozen=True)
class Answer:
    """What the replay model says to one chat request: a turn, a summary, or an HTTP error."""

    kind: str  # "agent", "summary" or "memory"
    status: int = 200
    turn: int | None = None
    content: str | None = None
    tool_calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()  # (id, name, arguments)
    error: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # response headers of an error (a scripted fault's Retry-After)
    thinking: str | None = None  # the turn's readable reasoning, for the protocols that return one


@dataclass(frozen=True)
class Storm:
    """Every agent request is refused with ``status`` until ``until`` (``time.monotonic``)."""

    until: float
    status: int
    headers: tuple[tuple[str, str], ...]


@dataclass
class Gate:
    """A point where requests wait for the test: open to all, or to the conversations whose marks it released."""

    reached: list[str] = field(default_factory=list)  # the text of every request that arrived at it
    open: bool = False
    released: list[str] = field(default_factory=list)

    def passes(self, marks: set[str]) -> bool:
        """Open, or every mark the conversation carries released: a conversation that also quotes an earlier
        task's mark (its memory recalls that task) still waits for its own."""
        return self.open or (bool(marks) and marks <= set(self.released))


class ReplayModel:
    """Answers chat requests from ``trajectory``; records every request for tests (``GET /_requests``)."""

    def __init__(
        self, trajectory: list[Turn], *, context_window: int | None = None,
        routes: dict[str, list[Turn]] | None = None,
    ) -> None:
        self.trajectory = [turn for turn in trajectory if not turn.memory]
        # Longest needle first: a row whose prompt quotes another row's whole prompt still finds its own.
        self.routes = sorted(
            ((needle, [turn for turn in turns if not turn.memory])
             for needle, turns in (routes or {}).items() if needle),
            key=lambda route: -len(route[0]),
        )
        self._memory_answers = [str(turn.content or "") for turn in trajectory if turn.memory]  # scripted, in order
        self.context_window = context_window  # prompt tokens past which OpenAI-shaped requests are refused
        self.requests: list[dict[str, Any]] = []
        self._faults_served: dict[tuple[str, int], int] = {}
        self._delayed: set[tuple[str, int]] = set()
        self._summary_faults = [status for turn in trajectory for status in turn.summary_faults]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gates: dict[str, Gate] = {}
        self._gates_changed = threading.Condition(self._lock)
        self._storm: Storm | None = None

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
            "received_at": time.time(),  # wall-clock seconds: tests and benchmarks count requests per window
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
            with self._lock:
                scripted = self._memory_answers.pop(0) if self._memory_answers else None
            return Answer("memory", content=replay_memory(messages) if scripted is None else scripted)
        index = next_turn_index(messages)
        self.note(entry, kind="agent", turn=index)
        storm = self._storm
        if storm is not None and time.monotonic() < storm.until:
            return Answer("agent", status=storm.status, turn=index, error="rate limited (storm)", headers=storm.headers)
        trajectory = self.trajectory_for(messages)
        if index >= len(trajectory):
            error = f"replay trajectory exhausted: it has {len(trajectory)} turns, turn {index} was asked for"
            return Answer("agent", status=400, turn=index, error=error)
        turn = trajectory[index]
        key = (conversation_key(messages), index)
        with self._lock:
            served = self._faults_served.get(key, 0)
            if served < len(turn.faults):
                self._faults_served[key] = served + 1
                status = turn.faults[served]
                return Answer("agent", status=status, turn=index, error="scripted failure", headers=turn.fault_headers)
            delay = turn.delay_s if key not in self._delayed else 0.0
            self._delayed.add(key)
        if delay:
            self._stopping.wait(delay)  # cut short when the server stops
        if turn.gate is not None:
            self._pass_gate(turn.gate, turn.gate_when, messages)
        return Answer(
            "agent",
            turn=index,
            content=f"{turn_marker(index)} {turn.content or ''}".rstrip(),
            tool_calls=tuple(
                (call_id(index, k), call.name, dict(call.arguments)) for k, call in enumerate(turn.tool_calls)
            ),
            thinking=turn.thinking,
        )

    def trajectory_for(self, messages: list[dict[str, Any]]) -> list[Turn]:
        """The trajectory of the route whose needle the first user message contains, else the default one."""
        if not self.routes:
            return self.trajectory
        task = text_of(next((m.get("content") for m in messages if m.get("role") == "user"), ""))
        return next((turns for needle, turns in self.routes if needle in task), self.trajectory)

    def _answer_summary(self, messages: list[dict[str, Any]]) -> Answer:
        with self._lock:
            if self._summary_faults:
                return Answer("summary", status=self._summary_faults.pop(0), error="scripted failure")
        return Answer("summary", content=replay_summary(messages))

    def _pass_gate(self, name: str, when: str | None, messages: list[dict[str, Any]]) -> None:
        text = json.dumps(messages, ensure_ascii=False)
        marks = set(re.findall(when, text)) if when is not None else set()
        if when is not None and not marks:
            return  # the gate holds only conversations that carry a mark
        with self._gates_changed:
            gate = self._gates.setdefault(name, Gate())
            gate.reached.append(text)
            self._gates_changed.notify_all()
            while not (gate.passes(marks) or self._stopping.is_set()):
                self._gates_changed.wait(0.25)  # released by open_gate, or by stop()

    def open_gate(self, name: str, containing: str | None = None) -> None:
        """Let requests held at gate ``name`` have their answer: all of them, now and later, or (with
        ``containing``, a mark the gate's ``gate_when`` pattern finds) the conversations that carry it."""
        with self._gates_changed:
            gate = self._gates.setdefault(name, Gate())
            if containing is None:
                gate.open = True
            else:
                gate.released.append(containing)
            self._gates_changed.notify_all()

    def gate_reached(self, name: str, containing: str | None = None) -> bool:
        """True once a request has arrived at gate ``name`` (one whose text contains ``containing``, if given)."""
        with self._lock:
            gate = self._gates.get(name)
            return gate is not None and any(containing is None or containing in text for text in gate.reached)

    def gates(self) -> dict[str, dict[str, Any]]:
        """Every gate known so far: how many requests reached it, whether it is open, what it released."""
        with self._lock:
            return {
                name: {"reached": len(gate.reached), "open": gate.open, "released": list(gate.released)}
                for name, gate in sorted(self._gates.items())
            }

    def start_storm(self, seconds: float, status: int = 429, headers: dict[str, str] | None = None) -> None:
        """From now on and for ``seconds``, answer every agent request with ``status`` and ``headers`` (a rate-limit
        storm over the whole fleet, whatever the conversation; summaries and memory requests still pass)."""
        pairs = tuple((name, str(value)) for name, value in (headers or {}).items())
        self._storm = Storm(time.monotonic() + seconds, status, pairs)

    def stop(self) -> None:
        """Release requests waiting out a delay or held at a gate."""
        self._stopping.set()
