"""Trajectories for the replay model: the ordered assistant turns it answers with, plus scripted faults.

A trajectory file is JSON Lines (one entry per line) or YAML (a list of the same entries):

- a **turn**: ``{"content": "text or null", "tool_calls": [{"name": "bash", "arguments": {...}}]}``;
  ``arguments`` may also be a JSON string, and OpenAI's ``{"function": {...}}`` shape is accepted; an optional
  ``"thinking": "text"`` is the turn's readable reasoning (``reasoning_content`` of compatible servers, Ollama's
  ``thinking``, a Responses reasoning summary);
- a **fault** for the next turn: ``{"fail": 500}`` (HTTP status, answered once) or
  ``{"fail": 429, "times": 3}``; with ``"for": "summary"`` it is answered to summary requests instead; with
  ``"headers": {"Retry-After": "2"}`` the turn's failures carry those response headers;
- a **delay** for the next turn: ``{"delay_s": 2.5}`` (the turn's first answer waits that long);
- a **gate** for the next turn: ``{"gate": "NAME"}`` (every answer to that turn waits until the gate is opened:
  ``ReplayModel.open_gate`` in a test, ``POST /_gates/NAME`` over HTTP), so a test can hold a task at a step
  of its choosing instead of racing it; with ``"gate_when": "REGEX"`` only conversations in which the pattern
  finds a mark wait, each until every mark it carries is released (``open_gate(NAME, containing=MARK)``), so
  a trajectory shared by several tests holds only the tasks a test marked;
- a **memory answer**: ``{"for": "memory", "content": "..."}`` answers the next memory update request (SPEC §13)
  instead of the replay model's own condensation, in order (a weak model's answer, made-up facts and all);
  ``fail``/``times``/``delay_s``/``gate`` may also sit on a turn entry itself.

The ``messages.jsonl`` of an earlier run is a trajectory too: its ``assistant`` records, in order, are the
turns (other roles are skipped; a torn last line is ignored; ``.jsonl.gz`` is read as well).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.llm.base import parse_arguments

MARKER_PATTERN = re.compile(r"\[tasuki-replay turn=(\d+)\]")


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call of a scripted turn."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One assistant answer of the trajectory, with the faults and delay that come before it."""

    content: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    thinking: str | None = None
    faults: tuple[int, ...] = ()
    fault_headers: tuple[tuple[str, str], ...] = ()
    """Response headers sent with each of ``faults`` (a ``Retry-After``)."""
    delay_s: float = 0.0
    summary_faults: tuple[int, ...] = ()
    gate: str | None = None
    gate_when: str | None = None
    memory: bool = False
    """An answer to a memory update request, not an agent turn."""


def load_trajectory(path: Path) -> list[Turn]:
    """Read a scripted trajectory (JSONL or YAML) or a ``messages.jsonl``; raise ``ValueError`` if malformed."""
    if path.suffix in {".yaml", ".yml"}:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        if not isinstance(entries, list):
            raise ValueError(f"{path}: a YAML trajectory is a list of entries")
    else:
        entries = _read_jsonl(path)
    return turns_from_entries(entries, source=str(path))


def _read_jsonl(path: Path) -> list[Any]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = raw.decode("utf-8").split("\n")
    entries: list[Any] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            if number == len(lines):  # no newline after it: a torn last line from a crash mid-write
                break
            raise ValueError(f"{path}: line {number} is not valid JSON") from None
    return entries


def turns_from_entries(entries: list[Any], source: str = "trajectory") -> list[Turn]:
    """Fold fault and delay entries into the turn that follows them."""
    turns: list[Turn] = []
    faults: list[int] = []
    fault_headers: tuple[tuple[str, str], ...] = ()
    summary_faults: list[int] = []
    delay_s = 0.0
    gate: str | None = None
    gate_when: str | None = None
    for index, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"{source}: entry {index} is not an object")
        if ("role" in entry and entry["role"] != "assistant") or _took_memory_answer(entry, turns):
            continue  # a messages.jsonl record of the user, a tool or the system prompt; or a memory answer
        if "fail" in entry:
            status = entry["fail"]
            if not isinstance(status, int) or not 400 <= status <= 599:
                raise ValueError(f"{source}: entry {index}: 'fail' must be an HTTP status 400-599")
            target = summary_faults if entry.get("for") == "summary" else faults
            target.extend([status] * int(entry.get("times", 1)))
            headers = entry.get("headers", {})
            if not isinstance(headers, dict) or not all(isinstance(v, str | int) for v in headers.values()):
                raise ValueError(f"{source}: entry {index}: 'headers' must map names to strings")
            if entry.get("for") != "summary":
                fault_headers += tuple((str(name), str(value)) for name, value in headers.items())
        delay_s = float(entry.get("delay_s", delay_s))
        if "gate" in entry:
            if not isinstance(entry["gate"], str) or not entry["gate"]:
                raise ValueError(f"{source}: entry {index}: 'gate' must be a non-empty name")
            gate = entry["gate"]
            gate_when = entry.get("gate_when")
            try:
                re.compile(gate_when or "")
            except (re.error, TypeError):
                raise ValueError(f"{source}: entry {index}: 'gate_when' must be a regular expression") from None
        if not ({"content", "tool_calls"} & entry.keys() or entry.get("role") == "assistant"):
            continue
        turns.append(
            Turn(
                content=strip_marker(entry.get("content")),
                thinking=entry["thinking"] if isinstance(entry.get("thinking"), str) else None,
                tool_calls=tuple(
                    _scripted_call(call, source, index, recorded="role" in entry)
                    for call in entry.get("tool_calls") or []
                ),
                faults=tuple(faults),
                fault_headers=fault_headers,
                delay_s=delay_s,
                summary_faults=tuple(summary_faults),
                gate=gate,
                gate_when=gate_when,
            )
        )
        faults, summary_faults, delay_s, gate, gate_when = [], [], 0.0, None, None
        fault_headers = ()
    if faults or summary_faults or delay_s or gate:
        raise ValueError(f"{source}: a fail, delay or gate entry at the end has no turn after it to apply to")
    return turns


def _took_memory_answer(entry: dict[str, Any], turns: list[Turn]) -> bool:
    """Append a memory answer (``{"for": "memory", "content": ...}``) to ``turns``; False for any other entry."""
    if entry.get("for") != "memory" or "fail" in entry:
        return False
    turns.append(Turn(content=str(entry.get("content") or ""), memory=True))
    return True


def _scripted_call(call: Any, source: str, index: int, *, recorded: bool) -> ScriptedCall:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"{source}: entry {index}: a tool call needs a 'name'")
    arguments, raw = parse_arguments(function.get("arguments"))
    # A recorded model may have sent broken JSON (its tool then failed); replay that as empty arguments.
    if raw is not None and not recorded:
        raise ValueError(f"{source}: entry {index}: arguments of {function['name']!r} are not a JSON object")
    return ScriptedCall(name=function["name"], arguments=arguments)


def strip_marker(content: str | None) -> str | None:
    """Content without a replay marker (a trajectory recorded from a replayed run carries them)."""
    if content is None:
        return None
    stripped = MARKER_PATTERN.sub("", content, count=1).strip()
    return stripped or None
