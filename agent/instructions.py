"""The repository owner's instructions in the conversation (SPEC §13, issue 38 item 4).

The root's instruction files open the task as a system message; a nested ``AGENTS.md`` or ``CLAUDE.md`` joins the
conversation as a system message when a tool call first touches a path below its directory. Their authority sits
above the task's text (quoted data) and below Tasuki's rules (the system prompt).

Only the files of the commit the task started from count (:class:`InstructionFiles`): an instruction file the agent
writes in its checkout never gains authority. Each message records the files it gave (``instructions`` on its
``messages.jsonl`` record), so a resumed task neither gives one twice nor loses one; a file whose message a summary
replaced is given again at its next touch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from agent.llm.base import parse_arguments
from contexts import Context, jsonl
from contexts.names import MESSAGES_FILE
from contexts.tokens import estimate_tokens
from memory.instructions import INSTRUCTION_FILES, nested_candidates

INSTRUCTIONS_FIELD = "instructions"  # on a messages.jsonl record: the instruction files its content gives
ROOT_HEADING = (
    "Repository instructions (from the repository owner, in the files below as they are in the commit this task "
    "started from; follow them unless they conflict with Tasuki's rules):"
)
NESTED_HEADING = (
    "Repository instructions for {scope} (from the repository owner, in the files below as they are in the commit "
    "this task started from; they apply to the files under {scope} and take precedence over the root's there; "
    "follow them unless they conflict with Tasuki's rules):"
)
CUT = "\n[… cut to fit the prompt]"
ROOT_SHARE = 0.1  # of the model's window: the most the root's instruction files take (a longer text is cut)
NESTED_SHARE = 0.05  # of the model's window: the most one nested message takes
PATH_ARGUMENTS = ("path",)  # the arguments of a file tool (read, write, edit, search, list) that name a checkout path


class InstructionFiles(Protocol):
    """The instruction files of the commit a task started from (the worker reads them from its own git directory)."""

    def names(self) -> frozenset[str]:
        """Paths (relative to the root) of the instruction files that commit holds."""
        ...

    def read(self, path: str) -> str | None:
        """The text of ``path`` in that commit (None: not there, or not readable as text)."""
        ...


def fenced(path: str, text: str) -> str:
    """One file's text in its own block, which the text cannot close."""
    body = text.replace("</instructions>", "<\\/instructions>").rstrip("\n")
    return f'<instructions file="{path}">\n{body}\n</instructions>'


def message_text(heading: str, files: Iterable[tuple[str, str]], budget_tokens: int) -> tuple[str, list[str]]:
    """The heading and each file's block, within ``budget_tokens`` (a file that does not fit whole is cut, the
    rest left out); the text and the files it gives ("" and [] when none fits)."""
    parts = [heading]
    given: list[str] = []
    room = budget_tokens - estimate_tokens(heading)
    for path, text in files:
        block = fenced(path, text)
        cost = estimate_tokens(block) + 1
        if cost > room:
            if room < 50:
                break
            block = fenced(path, _cut(text, room - estimate_tokens(fenced(path, "")) - 1))
            cost = room
        parts.append(block)
        given.append(path)
        room -= cost
    return ("\n\n".join(parts), given) if given else ("", [])


def _cut(text: str, room_tokens: int) -> str:
    limit = max(room_tokens - estimate_tokens(CUT), 0) * 4
    return text.encode()[:limit].decode("utf-8", errors="ignore") + CUT


def root_message(files: InstructionFiles, root_names: Iterable[str], budget_tokens: int) -> tuple[str, list[str]]:
    """The system message of the root's instruction files (``root_names``, in SPEC §13's order) the commit holds."""
    present = files.names()
    texts = [(name, files.read(name)) for name in root_names if name in present]
    return message_text(ROOT_HEADING, [(n, t) for n, t in texts if t and t.strip()], budget_tokens)


def touched_paths(tool_calls: Iterable[Mapping[str, Any]]) -> list[str]:
    """The checkout paths a reply's stored tool calls name (their ``path`` arguments)."""
    paths = []
    for call in tool_calls:
        arguments, _ = parse_arguments((call.get("function") or {}).get("arguments"))
        for key in PATH_ARGUMENTS:
            value = arguments.get(key)
            if isinstance(value, str) and value.strip():
                paths.append(value.strip().strip("/"))
    return paths


class OwnerInstructions:
    """Gives the nested instruction files of the directories a task's calls touch, each once."""

    def __init__(self, files: InstructionFiles, budget_tokens: int) -> None:
        self.files = files
        self.budget_tokens = budget_tokens  # one nested message's share of the prompt
        self._given: set[str] | None = None  # read back from the records once, then kept up to date
        self._boundary = -1

    def due(self, paths: Iterable[str], records_after: Iterator[dict[str, Any]] | None, boundary: int) -> list[str]:
        """The nested instruction files above ``paths`` that the conversation after ``boundary`` (the pinned
        messages and the latest summary) does not give yet; ``records_after``: its records, newest first."""
        present = self.files.names()
        wanted = [name for path in paths for name in nested_candidates(path) if name in present]
        if not wanted:
            return []
        if self._given is None or boundary != self._boundary:
            self._given = given_in(records_after or iter(()), boundary)
            self._boundary = boundary
        return [name for name in dict.fromkeys(wanted) if name not in self._given]

    def message(self, names: list[str]) -> tuple[str, list[str]]:
        """The system message that gives ``names`` (outermost directory first) and the files it gives."""
        read = [(name, self.files.read(name)) for name in names]
        self.given(n for n, t in read if not (t and t.strip()))  # an empty or unreadable file: not asked for again
        texts = [(n, t) for n, t in read if t and t.strip()]
        if not texts:
            return "", []
        scopes = sorted({name.rsplit("/", 1)[0] + "/" for name, _ in texts}, key=len)
        text, given = message_text(NESTED_HEADING.format(scope=", ".join(scopes)), texts, self.budget_tokens)
        return text, given

    def given(self, names: Iterable[str]) -> None:
        """``names`` are in the conversation now (unreadable ones too: they are not asked for again)."""
        if self._given is not None:
            self._given.update(names)


def given_in(newest_first: Iterator[dict[str, Any]], boundary: int) -> set[str]:
    """The instruction files the records after ``boundary`` give."""
    found: set[str] = set()
    for record in newest_first:
        if int(record.get("seq", 0)) <= boundary:
            break
        found.update(str(name) for name in record.get(INSTRUCTIONS_FIELD) or [])
    return found


def open_with_instructions(ctx: Context, files: InstructionFiles, context_length: int) -> list[str]:
    """Before the task's first user message: the root's instruction files as a system message, once (a resumed
    task finds it pinned). Returns the files it gives."""
    if any(INSTRUCTIONS_FIELD in record for record in ctx.pinned):
        return []
    text, given = root_message(files, INSTRUCTION_FILES, int(ROOT_SHARE * context_length))
    if text:
        ctx.append_message("system", text, **{INSTRUCTIONS_FIELD: given})
    return given


def give_nested(ctx: Context, owner: OwnerInstructions) -> list[str]:
    """Before a model call: the nested instruction files above the paths the newest reply's calls touched that the
    conversation does not give yet, as one system message after their results. Returns the files it gives."""
    boundary = ctx.boundary_seq
    reply = None
    for record in jsonl.iter_records_reversed(ctx.path / MESSAGES_FILE):
        if int(record["seq"]) <= boundary:
            break
        if record.get("role") == "assistant":
            reply = record
            break
    if reply is None or not reply.get("tool_calls"):
        return []
    due = owner.due(touched_paths(reply["tool_calls"]), jsonl.iter_records_reversed(ctx.path / MESSAGES_FILE),
                    boundary)
    if not due:
        return []
    text, given = owner.message(due)
    if text:
        ctx.append_message("system", text, **{INSTRUCTIONS_FIELD: given})
    owner.given(given)
    return given
