"""Pure rules of the replay model: which turn a request gets, summary requests, and their answers."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from contexts.tokens import estimate_message_tokens, estimate_tokens
from replay.trajectory import MARKER_PATTERN

SUMMARY_SYSTEM_PREFIX = "You summarize"
MEMORY_SYSTEM_PREFIX = "You keep the memory"  # the memory updater's requests (SPEC §13)
SUMMARY_SHARE = 0.35  # a summary is at most this share of its input (SPEC §6: 30-40 %)
_CALL_ID_PATTERN = re.compile(r"^call_t(\d+)_\d+$")
_EXTENSIONS = "py|md|rst|txt|toml|ya?ml|json|cfg|ini|js|ts|tsx|go|rs|java|rb|sh|c|h|cpp|html|css|lock"
# A path has a directory and an extension, or a well-known extension; URLs and calls like json.dumps( are not.
_PATH_PATTERN = re.compile(rf"(?<![\w@:/.-])(?:(?:[\w.-]+/)+[\w-]+\.\w{{1,8}}|[\w-]+\.(?:{_EXTENSIONS}))\b(?![(/])")
_COMMAND_PATTERNS = (
    re.compile(r'"command"\s*:\s*"((?:[^"\\]|\\.){1,200})"'),
    re.compile(r"^\s*\$ (.{1,200})$", re.MULTILINE),
)


def turn_marker(index: int) -> str:
    """The tag that opens every replayed answer's content and every replay summary."""
    return f"[tasuki-replay turn={index}]"


def call_id(turn: int, position: int) -> str:
    """The id of a replayed tool call: it names its turn, so OpenAI-style requests carry the turn twice."""
    return f"call_t{turn}_{position}"


def text_of(content: Any) -> str:
    """A message's content as text (a string, or the text parts of an OpenAI content list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def is_summary_request(messages: list[dict[str, Any]]) -> bool:
    """True for the summarizer's stateless request: its system prompt starts with "You summarize"."""
    for message in messages:
        if message.get("role") == "system":
            return text_of(message.get("content")).lstrip().startswith(SUMMARY_SYSTEM_PREFIX)
    return False


def is_memory_request(messages: list[dict[str, Any]]) -> bool:
    """True for a memory update (existing memory + new material): its system prompt starts "You keep the memory"."""
    system = next((m for m in messages if m.get("role") == "system"), None)
    return system is not None and text_of(system.get("content")).lstrip().startswith(MEMORY_SYSTEM_PREFIX)


_MEMORY = re.compile(r"<memory>\n?(.*?)\n?</memory>", re.DOTALL)
_MATERIAL = re.compile(r"<material>\n?(.*?)\n?</material>", re.DOTALL)
_BOUND = re.compile(r"at most (\d+) tokens")


def replay_memory(messages: list[dict[str, Any]]) -> str:
    """A deterministic memory update: the existing memory's lines plus one bullet condensing the new material
    (its first 35 %), oldest lines dropped to stay within the bound the request names."""
    system = next((text_of(m.get("content")) for m in messages if m.get("role") == "system"), "")
    user = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
    existing = _MEMORY.search(user)
    material = _MATERIAL.search(user)
    lines = [] if existing is None or existing.group(1).strip() == "(empty)" else existing.group(1).splitlines()
    flat = " ".join((material.group(1) if material else "").split())
    if flat:
        lines.append("- " + flat[: max(int(len(flat) * SUMMARY_SHARE), 1)].rstrip() + " (replay)")
    bound = _BOUND.search(system)
    limit = int(bound.group(1)) if bound else 2000
    while len(lines) > 1 and estimate_tokens("\n".join(lines)) > limit:
        lines.pop(0)
    return "\n".join(lines)


def latest_replayed_turn(
    messages: list[dict[str, Any]], *, include_tool_output: bool = False, skip_task: bool = False
) -> int | None:
    """The highest turn index any replay marker or replayed call id in ``messages`` names, or ``None``;
    ``skip_task``: not the markers the pinned task quotes (an agent's conversation, whose task carries memory)."""
    seen: list[int] = []
    task = next((m for m in messages if m.get("role") == "user"), None) if skip_task else None
    for message in messages:
        role = message.get("role")
        # Tool output is untrusted text, and the pinned task quotes earlier tasks' memory: either may quote a
        # marker of another conversation. Replies, call ids and summaries are this conversation's own.
        if (role != "tool" or include_tool_output) and message is not task:
            seen.extend(int(n) for n in MARKER_PATTERN.findall(text_of(message.get("content"))))
        ids = [call.get("id", "") for call in message.get("tool_calls") or [] if isinstance(call, dict)]
        ids.append(message.get("tool_call_id", ""))
        seen.extend(int(m.group(1)) for i in ids if isinstance(i, str) and (m := _CALL_ID_PATTERN.match(i)))
    return max(seen, default=None)


def next_turn_index(messages: list[dict[str, Any]]) -> int:
    """The turn an agent request gets: one past the latest turn its conversation already holds."""
    latest = latest_replayed_turn(messages, skip_task=True)
    return 0 if latest is None else latest + 1


def conversation_key(messages: list[dict[str, Any]]) -> str:
    """A short id of the conversation: the system prompt and the pinned task, which compression keeps."""
    system = next((m for m in messages if m.get("role") == "system"), {})
    task = next((m for m in messages if m.get("role") == "user"), {})
    seed = json.dumps([text_of(system.get("content")), text_of(task.get("content"))], ensure_ascii=False)
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def prompt_token_estimate(messages: list[dict[str, Any]], tools: Any = None) -> int:
    """Tokens of everything a real provider counts in ``prompt_tokens``: every message's content and tool
    calls (UTF-8 bytes / 4, plus framing, as the context store estimates them) and the tool schemas."""
    total = sum(estimate_message_tokens(text_of(m.get("content")), m.get("tool_calls") or None) for m in messages)
    if tools:
        total += estimate_tokens(json.dumps(tools))
    return total


def cached_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """What a provider's prompt cache would serve of a later turn: the pinned system prompt and task, which
    every request of a conversation starts with (OpenAI reports it as ``prompt_tokens_details.cached_tokens``)."""
    pinned = [m for m in messages[:2] if m.get("role") in ("system", "user")]
    return sum(estimate_message_tokens(text_of(m.get("content")), None) for m in pinned)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(item.strip() for item in items if item.strip()))


def replay_summary(messages: list[dict[str, Any]]) -> str:
    """A deterministic summary of a summary request: the files and commands its span mentions.

    It opens with the replay marker of the latest turn it covers, so requests whose replayed turns were
    all compressed away still name them. Never empty; at most 35 % of the input unless that is tiny.
    """
    span = [m for m in messages if m.get("role") != "system"]
    text = "\n".join(text_of(m.get("content")) for m in span)
    latest = latest_replayed_turn(span)
    header = (turn_marker(latest) + " " if latest is not None else "") + "Summary of earlier work (replay)."
    paths = _unique(_PATH_PATTERN.findall(text))
    commands = _unique([c for pattern in _COMMAND_PATTERNS for c in pattern.findall(text)])
    body = ""
    if paths:
        body += "\nFiles: " + ", ".join(paths)
    if commands:
        body += "\nCommands: " + "; ".join(commands)
    budget = int(len(text) * SUMMARY_SHARE)
    if len(header) + len(body) > budget:
        body = body[: max(budget - len(header) - 3, 0)].rstrip()
        body = body + "..." if body else ""
    return header + body
