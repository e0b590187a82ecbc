"""A memory keeps only what its tasks' own records support (issue 38): each line of a model's thread or repository
memory is checked before it is stored.

A weak model asked to merge memories makes things up: tasks that never ran, files nobody touched, pull requests
that were never opened, a success for a task that failed. What a task did is on record — its episode (task text,
status, result, summaries, files changed, failed commands, from its context's metadata, messages, tool calls and
state) and the paths its tool calls named — so a line is kept only when every task, file, pull request and branch
it names is on that record, and it does not claim success for tasks that all failed. A line the existing memory
already had was checked when it was written and is kept as it is. Pure functions; the worker logs each drop.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contexts import jsonl
from contexts.names import TOOLS_FILE
from memory.records import Episode

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE)
# The tasks a fact came from, as the repository prompt asks for them: "(uuid, uuid)" at the end of the line.
CITED = re.compile(r"\(([^()]*)\)\s*\.?\s*$")
CITED_TOKEN = re.compile(r"^[0-9a-f]{8}(?:-[0-9a-f]{1,12}){0,4}$", re.IGNORECASE)  # a UUID or its start
TASK_PREFIX = re.compile(r"\btasks? ([0-9a-f]{8})\b", re.IGNORECASE)  # a UUID shortened to its first 8 digits
QUOTED_TASK = re.compile(r"\btasks? [\"“']([^\"”']{4,})[\"”']", re.IGNORECASE)
EXTENSIONS = (
    "py", "pyi", "pyx", "js", "mjs", "cjs", "ts", "tsx", "jsx", "go", "rs", "java", "kt", "rb", "php", "c", "h",
    "cc", "cpp", "hpp", "cs", "swift", "scala", "sh", "bash", "md", "rst", "txt", "toml", "yaml", "yml", "json",
    "cfg", "ini", "lock", "html", "css", "scss", "sql", "xml", "proto", "gradle", "mk", "ipynb", "env",
)
PATH = re.compile(
    r"(?<![\w/.:-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:" + "|".join(EXTENSIONS) + r"))(?![\w/-])(?!\.\w)"
)
REQUEST = re.compile(r"(?:\b(?:PR|MR|pull request|merge request)\s*#?\s*|/pull/|/merge_requests/|(?<!\w)!)(\d+)\b",
                     re.IGNORECASE)
NOT_FILES = frozenset({"node.js", "vue.js", "next.js", "nuxt.js", "react.js", "express.js", "d3.js", "three.js"})
BRANCH = re.compile(r"\bbranch(?:es)? [`'\"]?([\w][\w./-]*[\w])[`'\"]?", re.IGNORECASE)
SUCCESS = re.compile(r"\b(succeeded|successful(?:ly)?|completed|fixed|resolved|merged|pass(?:es|ed|ing)?|solved"
                     r"|(?:now )?works?(?: now))\b", re.IGNORECASE)
FAILURE = re.compile(r"\b(fail(?:ed|s|ing|ure)?|error|broke|not (?:fixed|resolved)|unresolved|did not|didn't)\b",
                     re.IGNORECASE)
FAILED_STATUSES = frozenset({"failed", "timeout", "cancelled", "cannot_start"})  # contexts.names, and no context


@dataclass(frozen=True)
class Dropped:
    """A line left out of a memory, the claim that was not on record, and why."""

    line: str
    kind: str  # "task", "file", "request", "branch" or "result"
    claim: str
    reason: str


@dataclass(frozen=True)
class Evidence:
    """What the records of a memory's tasks hold: their episodes, and the paths their tool calls named."""

    episodes: dict[str, Episode]
    paths: frozenset[str] = frozenset()
    known: frozenset[str] = frozenset()  # further task UUIDs on record (the memory's sources whose episodes are gone)
    texts: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, episodes: Iterable[Episode], paths: Iterable[str] = (), known: Iterable[str] = ()) -> Evidence:
        """The evidence of ``episodes``, plus paths from their tool calls and UUIDs of their sources."""
        kept = {e.uuid: e for e in episodes}
        texts = tuple(_record_text(e) for e in kept.values())
        named = {p for text in texts for p in PATH.findall(text)}
        named |= {p for e in kept.values() for p in e.files_changed}
        named |= {p.strip() for p in paths if p and p.strip()}
        return cls(kept, frozenset(_clean(p) for p in named), frozenset(known) | frozenset(kept), texts)

    def has_task(self, token: str) -> bool:
        """Whether ``token`` names a task on record (its UUID, or its first eight digits)."""
        token = token.lower()
        return any(uuid.lower() == token or (len(token) >= 8 and uuid.lower().startswith(token)) for uuid in self.known)

    def has_path(self, claimed: str) -> bool:
        """Whether ``claimed`` is a path on record, written in full, shortened to its last parts, or prefixed."""
        claimed = _clean(claimed)
        return any(p == claimed or p.endswith("/" + claimed) or claimed.endswith("/" + p) for p in self.paths)

    def has_text(self, words: str) -> bool:
        """Whether ``words`` appear in a record (a task's title, a branch, a request number), case aside."""
        needle = words.lower()
        return any(needle in text.lower() for text in self.texts)


def _clean(path: str) -> str:
    return path.strip().strip("`'\"").removeprefix("./").removeprefix("/")


def _record_text(episode: Episode) -> str:
    """Everything an episode says, results included, as one text to look claims up in."""
    parts = [episode.task, episode.final_summary, episode.latest_summary, episode.error or "",
             " ".join(f"{k}={v}" for k, v in sorted(episode.result.items())), " ".join(episode.files_changed)]
    parts += [f"{c.get('command', '')}\n{c.get('error', '')}" for c in episode.failed_commands]
    return "\n".join(p for p in parts if p)


def _cited(line: str) -> list[str]:
    """The task identifiers a line cites: every UUID, an 8-digit prefix after "task", and the tokens of a
    trailing parenthesis that holds task identifiers only (``(1a2b3c4d, 5e6f7a8b-…)``); "(v2)" or "(2024)" is
    no citation."""
    found = UUID.findall(line) + TASK_PREFIX.findall(line)
    tail = CITED.search(line)
    if tail:
        tokens = [t.strip() for t in re.split(r"[,;]\s*|\s+and\s+", tail.group(1)) if t.strip()]
        identifiers = [t for t in tokens if CITED_TOKEN.match(t) and not t.isdigit()]
        if tokens and len(identifiers) == len(tokens):
            found += identifiers
    return list(dict.fromkeys(found))


def unsupported(line: str, evidence: Evidence) -> Dropped | None:
    """The first claim of ``line`` the records do not support, or None when every claim is on record."""
    return next(_unsupported_claims(line, evidence), None)


def _unsupported_claims(line: str, evidence: Evidence) -> Iterator[Dropped]:
    cited = _cited(line)
    for token in cited:
        if not evidence.has_task(token):
            yield Dropped(line, "task", token, f"names task {token}, which is not among this memory's tasks")
    for title in QUOTED_TASK.findall(line):
        if not evidence.has_text(title):
            yield Dropped(line, "task", title, f"names a task titled {title!r} that no task on record was asked")
    for path in PATH.findall(line):
        if path.lower() not in NOT_FILES and not evidence.has_path(path):
            yield Dropped(line, "file", path, f"names {path}, which no tool call or episode of these tasks touched")
    for number in REQUEST.findall(line):
        if not any(re.search(rf"(?<![\w-]){number}\b", text) for text in evidence.texts):  # not inside a hash
            yield Dropped(line, "request", number, f"names pull/merge request {number}, which no result records")
    for branch in BRANCH.findall(line):
        if "/" in branch and not evidence.has_text(branch):
            yield Dropped(line, "branch", branch, f"names branch {branch}, which no result records")
    statuses = {evidence.episodes[u].status for u in cited if u in evidence.episodes}
    success = SUCCESS.search(line)
    if statuses and statuses <= FAILED_STATUSES and success and not FAILURE.search(line):
        claim = success.group(1)
        yield Dropped(line, "result", claim, f"claims {claim!r} for tasks that ended {', '.join(sorted(statuses))}")


@dataclass(frozen=True)
class Checked:
    """A memory's text with only the supported lines, and what was dropped."""

    text: str
    dropped: list[Dropped]


def keep_supported(answer: str, evidence: Evidence, existing: str | None = None) -> Checked:
    """The lines of ``answer`` that the records support (lines of the ``existing`` memory are kept as they are:
    they were checked when written), in order, and the dropped ones with their reasons."""
    before = {line.strip() for line in (existing or "").splitlines() if line.strip()}
    kept: list[str] = []
    dropped: list[Dropped] = []
    for line in answer.splitlines():
        found = None if line.strip() in before else unsupported(line, evidence)
        if found is None:
            kept.append(line)
        else:
            dropped.append(found)
    return Checked("\n".join(kept).strip("\n"), dropped)


def tool_paths(records: Sequence[dict[str, object]]) -> set[str]:
    """The paths a task's tool calls named: a ``path`` argument of any tool, and paths in a command's text."""
    paths: set[str] = set()
    for record in records:
        arguments = record.get("arguments")
        if not isinstance(arguments, dict):
            continue
        for key in ("path", "file", "file_path"):
            if isinstance(arguments.get(key), str):
                paths.add(str(arguments[key]))
        command = arguments.get("command")
        if isinstance(command, str):
            paths.update(PATH.findall(command))
    return paths


def context_paths(directory: Path | None) -> set[str]:
    """The paths the tool calls of the finished context at ``directory`` named (none when it is gone or unreadable:
    the check then has the episodes alone)."""
    if directory is None or not (directory / TOOLS_FILE).is_file():
        return set()
    try:
        return tool_paths(list(jsonl.iter_records(directory / TOOLS_FILE)))
    except (OSError, ValueError):
        return set()
