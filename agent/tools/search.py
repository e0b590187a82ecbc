"""``search`` (lines matching a regular expression or a literal) and ``glob`` (file paths matching a pattern) over
the checkout, as git lists it (see :mod:`agent.tools.tree`); both read only, capped, sorted by path."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

from agent.tools.files import MAX_FILE_BYTES
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.tree import Entry, Walk, glob_filter, shown_path, walk
from agent.tools.workspace import ToolError, Workspace

MAX_MATCHES = 100
MAX_FILES = 500  # paths glob lists
MAX_MATCH_CHARS = 300  # of one matching line
MAX_SCANNED_BYTES = 256 * 1024 * 1024  # read by one search, whatever the checkout holds
_BINARY_SNIFF_BYTES = 8192
_RE2_MAX_MEM = 64 * 1024 * 1024
# Characters that some readers take for a line break, or that move the cursor: shown escaped in a matching line.
_UNSAFE = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, 0x85]}
_UNSAFE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})

_PATH_ARG = {
    "type": "string",
    "description": "A directory (or one file) to look in, relative to the repository root. Default: the whole "
    "repository.",
}
_GLOB_ARG = {
    "type": "string",
    "description": "Only files whose path matches this glob, e.g. '*.py' (a name at any depth), 'src/**/*.ts' "
    "(from path), '*.{js,jsx}'.",
}


@dataclass(frozen=True)
class _Found:
    """A search's matching lines (the first ``MAX_MATCHES``) and how many there were in all."""

    lines: list[str]
    total: int
    files: int
    too_large: int  # files over read_file's limit, not searched (binary ones are skipped without a word)


class SearchTool:
    """``search(pattern, path?, glob?, literal?, ignore_case?)``: matching lines as ``path:line: text``."""

    name = "search"
    changes_checkout = False
    description = (
        "Search the repository's files for lines matching a regular expression (RE2 syntax, like ripgrep's: "
        "no lookaround or backreferences) or, with literal=true, an exact string. Files ignored by .gitignore, "
        "binary files and .git are skipped. Returns 'path:line: text' lines sorted by path, at most "
        f"{MAX_MATCHES}; narrow a search that says it was cut with path or glob. Use it to find where something "
        "is defined or used, then read_file with offset to see it in context."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The regular expression (or literal text) to look for."},
            "path": _PATH_ARG,
            "glob": _GLOB_ARG,
            "literal": {"type": "boolean", "description": "Match pattern as plain text, not a regex. Default false."},
            "ignore_case": {"type": "boolean", "description": "Match regardless of case. Default false."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Walk the files below ``path`` and report matching lines."""
        pattern: str = arguments["pattern"]
        if not pattern:
            raise ToolError("pattern is empty; say what to look for")
        literal, ignore_case = bool(arguments.get("literal")), bool(arguments.get("ignore_case"))
        matcher = _compile(pattern, literal=literal, ignore_case=ignore_case)
        wanted = glob_filter(arguments["glob"]) if arguments.get("glob") else None
        walked = Walk()
        found = _search(walk(workspace, arguments.get("path", ""), walked), matcher, wanted, _under(arguments), walked)
        if not found.total:
            body = f"no matches for {pattern!r}"
        else:
            body = "\n".join(found.lines)
            if found.total > len(found.lines):
                body += (f"\n[search: the first {len(found.lines)} of {found.total} matching lines "
                         f"({found.files} files); narrow it with path or glob]")
        if found.too_large:
            body += f"\n[search: {found.too_large} files over {MAX_FILE_BYTES // 2**20} MB not searched]"
        return ToolOutcome(_with_notes(body, walked, _budget(options)))


class GlobTool:
    """``glob(pattern, path?)``: the paths of the files matching a glob."""

    name = "glob"
    changes_checkout = False
    description = (
        "List the repository's files whose path matches a glob pattern, sorted by path, at most "
        f"{MAX_FILES}. '*.py' matches names at any depth, 'src/**/*.ts' paths from the start (of path, if given), "
        "'*.{js,jsx}' either. Files ignored by .gitignore and .git are left out. Use it to find files by name."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The glob, e.g. '**/test_*.py' or 'docs/*.md'."},
            "path": _PATH_ARG,
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Walk the files below ``path`` and list those the pattern matches."""
        pattern: str = arguments["pattern"].strip()
        if not pattern:
            raise ToolError("pattern is empty; give a glob such as '**/*.py'")
        wanted = glob_filter(pattern)
        under = _under(arguments)
        walked = Walk()
        paths = [shown_path(e.path) for e in walk(workspace, arguments.get("path", ""), walked)
                 if wanted(e.path.removeprefix(under))]
        if not paths:
            body = f"no files match {pattern!r}"
        else:
            body = "\n".join(paths[:MAX_FILES])
            if len(paths) > MAX_FILES:
                body += f"\n[glob: the first {MAX_FILES} of {len(paths)} files; narrow the pattern or give a path]"
        return ToolOutcome(_with_notes(body, walked, _budget(options)))


@dataclass(frozen=True)
class _Matcher:
    """Tests one line; ``may_hold`` rules out a whole file in one pass (it may say yes wrongly, never no)."""

    line: Callable[[str], bool]
    may_hold: Callable[[str], bool]


def _compile(pattern: str, *, literal: bool, ignore_case: bool) -> _Matcher:
    """RE2 (linear time: no pattern stalls the worker, whatever the files hold), or a plain substring test."""
    if literal:
        if ignore_case:
            folded = pattern.casefold()
            return _Matcher(lambda line: folded in line.casefold(), lambda text: folded in text.casefold())
        return _Matcher(lambda line: pattern in line, lambda text: pattern in text)
    compiled = _re2(pattern, ignore_case)
    if "\\A" in pattern or "\\z" in pattern:  # the text's start and end are not each line's: no shortcut
        return _Matcher(lambda line: compiled.search(line) is not None, lambda text: True)
    # With (?m), ^ and $ also match at each line's start and end, so a line that matches makes the text match.
    whole = _re2(f"(?m){pattern}", ignore_case)
    return _Matcher(lambda line: compiled.search(line) is not None,
                    lambda text: whole.search(text.replace("\r\n", "\n")) is not None)


def _re2(pattern: str, ignore_case: bool) -> Any:
    settings = re2.Options()
    settings.log_errors = False  # the error goes back to the model, not to the worker's stderr
    settings.case_sensitive = not ignore_case
    settings.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(pattern, settings)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ToolError(f"bad regular expression {pattern!r}: {reason} (RE2 syntax; or set literal=true)") from exc


def _search(
    entries: Iterator[Entry], matcher: _Matcher, wanted: Callable[[str], bool] | None, under: str, walked: Walk
) -> _Found:
    lines: list[str] = []
    total = files = too_large = scanned = 0
    for entry in entries:
        if entry.is_symlink or (wanted is not None and not wanted(entry.path.removeprefix(under))):
            continue
        if scanned > MAX_SCANNED_BYTES:
            walked.notes.append(f"stopped after reading {MAX_SCANNED_BYTES // 2**20} MB; give a path or glob")
            break
        text, oversized = _text(entry)
        too_large += oversized
        if text is None:
            continue
        scanned += len(text)
        if not matcher.may_hold(text):
            continue
        hits = [(n, line) for n, line in enumerate(text.split("\n"), 1) if matcher.line(line.removesuffix("\r"))]
        total += len(hits)
        files += bool(hits)
        for number, line in hits[: max(MAX_MATCHES - len(lines), 0)]:
            lines.append(f"{shown_path(entry.path)}:{number}: {_shown_line(line.removesuffix(chr(13)))}")
    return _Found(lines, total, files, too_large)


def _text(entry: Entry) -> tuple[str | None, bool]:
    """The file's text, or None for a file not to search (not regular, binary, larger than read_file reads); and
    whether it was left out for its size."""
    try:
        fd = entry.open()
    except OSError:
        return None, False
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, False
        if info.st_size > MAX_FILE_BYTES:
            return None, True
        data = handle.read(MAX_FILE_BYTES + 1)  # a file that grew since fstat is still read no further
    if len(data) > MAX_FILE_BYTES:
        return None, True
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        return None, False
    return data.decode("utf-8", errors="replace"), False


def _shown_line(line: str) -> str:
    line = line.translate(_UNSAFE)
    if len(line) > MAX_MATCH_CHARS:
        return f"{line[:MAX_MATCH_CHARS]}… [{len(line) - MAX_MATCH_CHARS} more characters]"
    return line


def _under(arguments: Mapping[str, Any]) -> str:
    """The prefix a glob is matched after: the directory given as ``path``, with a slash."""
    parts = [p for p in str(arguments.get("path", "")).split("/") if p not in ("", ".")]
    return "/".join(parts) + "/" if parts else ""


def _budget(options: ToolOptions) -> int:
    return min(options.view_chars or options.max_output_chars, options.max_output_chars)


def _with_notes(body: str, walked: Walk, budget: int) -> str:
    """The body cut to whole lines within ``budget`` (the notes at the end always shown)."""
    notes = "".join(f"\n[{note}]" for note in walked.notes[:5])
    room = max(budget - len(notes) - 100, 0)
    if len(body) > room:
        cut = body.rfind("\n", 0, room)
        kept = body[: max(cut, 0)]
        body = f"{kept}\n[output cut at {room} characters after {kept.count(chr(10)) + bool(kept)} lines; narrow it]"
    return body + notes
