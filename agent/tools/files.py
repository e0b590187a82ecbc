"""``read_file``, ``write_file`` and ``edit_file``: repository files, always through :class:`Workspace`."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from agent.tools.lines import numbered, snippet, split_lines, window
from agent.tools.nearest import closest_span, has_line_numbers
from agent.tools.output import cap_output
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import ToolError, Workspace

# Repository files, not context files: readable by the tools a repository expects (linters, builds).
NEW_FILE_MODE = 0o644
# Larger files are read in parts with bash (sed -n, head, tail) rather than loaded whole.
MAX_FILE_BYTES = 10 * 1024 * 1024
# A NUL byte near the start is the usual sign of a binary file.
_BINARY_SNIFF_BYTES = 8192
# read_file's window when the model gives no limit (the output limit may stop it sooner).
DEFAULT_LIMIT = 2000
MAX_LISTED = 20  # lines named for an old_string that occurs many times
MAX_NEAREST_CHARS = 4000


_PATH = {"type": "string", "description": "File path relative to the repository root."}


def _read_bytes(workspace: Workspace, path: str) -> bytes:
    # O_NONBLOCK: opening a FIFO must not block the worker; it is refused below as not a regular file.
    try:
        fd = workspace.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise ToolError(f"no such file: {path}") from exc
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{path} is a directory; use bash (ls) to list it")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            size = info.st_size
            raise ToolError(f"{path} is {size} bytes, too large to read whole; use bash (sed -n, head) for parts")
        return handle.read()


def _write_bytes(workspace: Workspace, path: str, data: bytes, options: ToolOptions) -> None:
    """Write through an fd opened beneath the checkout (an existing file keeps its inode and so its mode:
    an executable script stays executable); missing parent directories are made beneath it too. A root worker
    gives what it made to the sandbox's user, whose commands change it next."""
    user = options.sandbox.user
    owner = (user.uid, user.gid) if user is not None else None
    parent, _ = workspace.open_parent(path, create=True, owner=owner)
    os.close(parent)
    try:
        fd = workspace.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, NEW_FILE_MODE)
    except IsADirectoryError as exc:
        raise ToolError(f"{path} is a directory") from exc
    with os.fdopen(fd, "wb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError(f"{path} is not a regular file")
        os.ftruncate(fd, 0)
        handle.write(data)
        if owner is not None:
            os.fchown(fd, *owner)


class ReadFileTool:
    """``read_file(path, offset?, limit?)``: a window of the file's lines, numbered."""

    name = "read_file"
    changes_checkout = False
    description = (
        "Read a text file of the repository as numbered lines ('<number><tab><line>'; the numbers and the tab are "
        f"not part of the file). Shows up to {DEFAULT_LIMIT} lines from offset, fewer when they would pass the "
        "output limit, and ends with a line saying which lines you saw of how many and the offset to continue "
        "from. For a long file, find the place first (search) and read a window around it."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "offset": {"type": "integer", "description": "The first line to show (1-based). Default 1."},
            "limit": {"type": "integer", "description": f"How many lines to show at most. Default {DEFAULT_LIMIT}."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Show the window; binary files and directories are refused, an offset past the end says the length."""
        path: str = arguments["path"]
        offset: int = arguments.get("offset", 1)
        limit: int = arguments.get("limit", DEFAULT_LIMIT)
        if offset < 1 or limit < 1:
            raise ToolError(f"offset and limit must be positive (got offset={offset}, limit={limit})")
        data = _read_bytes(workspace, path)
        if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
            raise ToolError(f"{path} looks like a binary file; inspect it with bash (file, xxd)")
        lines = split_lines(data.decode("utf-8", errors="replace"))
        if offset > max(len(lines), 1):
            raise ToolError(f"offset {offset} is past the end of {path}, which has {len(lines)} lines")
        budget = min(options.view_chars or options.max_output_chars, options.max_output_chars)
        shown = window(lines, offset, limit, budget)
        return ToolOutcome(f"{shown.body}\n{shown.footer}" if shown.body else shown.footer)


class WriteFileTool:
    """``write_file(path, content)``: create or replace a file."""

    name = "write_file"
    changes_checkout = True
    description = (
        "Create a file or replace its whole content. Missing parent directories are created. "
        "To change part of a file prefer edit_file."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "content": {"type": "string", "description": "The complete new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Write the content as UTF-8, creating parent directories inside the checkout."""
        path: str = arguments["path"]
        data = arguments["content"].encode("utf-8")
        _write_bytes(workspace, path, data, options)
        return ToolOutcome(f"wrote {len(data)} bytes to {workspace.display(workspace.resolve(path))}")


class EditFileTool:
    """``edit_file(path, old_string, new_string, replace_all?)``: replace one occurrence, or every one."""

    name = "edit_file"
    changes_checkout = True
    description = (
        "Replace old_string with new_string in a file. old_string must match the file character for character "
        "(whitespace and indentation included, without read_file's line-number prefixes) and occur exactly once: "
        "add surrounding lines to make it unique, or set replace_all to change every occurrence (e.g. a rename). "
        "When old_string is not found, the error shows the closest lines of the file to copy from. On success "
        "the changed lines are shown."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "old_string": {"type": "string", "description": "The exact text to replace."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence instead of exactly one. Default false.",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Replace the single occurrence (or all of them), or refuse and say where old_string is or comes closest."""
        path: str = arguments["path"]
        old: str = arguments["old_string"]
        new: str = arguments["new_string"]
        if not old:
            raise ToolError("old_string is empty; use write_file to create or replace a whole file")
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change")
        data = _read_bytes(workspace, path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolError(f"{path} is not UTF-8 text; edit it with bash") from exc
        if count_occurrences(text, old) == 0 and "\r\n" in text and "\n" in old and "\r" not in old:
            # A file with CRLF endings, an old_string typed with \n: the same lines, as the file writes them.
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        count = count_occurrences(text, old)
        if count == 0:
            raise ToolError(not_found(path, text, old))
        if count > 1 and not arguments.get("replace_all"):
            where = ", ".join(str(n) for n in occurrence_lines(text, old)) + (", ..." if count > MAX_LISTED else "")
            raise ToolError(f"old_string occurs {count} times in {path} (at lines {where}); add surrounding lines "
                            "to match once, or set replace_all to replace every occurrence")
        first = text.count("\n", 0, text.find(old)) + 1
        replaced = text.count(old) if arguments.get("replace_all") else 1
        changed = text.replace(old, new) if arguments.get("replace_all") else text.replace(old, new, 1)
        _write_bytes(workspace, path, changed.encode("utf-8"), options)
        lines = split_lines(changed)
        last = first + new.count("\n") - (1 if new.endswith("\n") else 0)
        shown = snippet(lines, first, max(last, first)) if lines else "(the file is now empty)"
        plural = "occurrence" if replaced == 1 else "occurrences"
        where = "; the first, now:" if replaced > 1 else "; now:"
        return ToolOutcome(f"replaced {replaced} {plural} in {workspace.display(workspace.resolve(path))}{where}\n"
                           f"{shown}")


def not_found(path: str, text: str, old: str) -> str:
    """The error for an old_string the file does not hold: what went wrong, and the closest lines to copy from."""
    if has_line_numbers(old):
        return (f"old_string not found in {path}: it starts with read_file's line numbers; leave out the number "
                "and the tab before each line")
    lines = split_lines(text)
    span = closest_span(lines, old)
    if span is None:
        return f"old_string not found in {path}, and no lines are close to it; read the file and copy the text exactly"
    hint = ("the same text but for indentation or whitespace" if span.ratio == 1.0
            else f"{round(span.ratio * 100)}% similar")
    closest = "\n".join(numbered(lines[n - 1], n) for n in range(span.first, span.last + 1))
    closest, _ = cap_output(closest, MAX_NEAREST_CHARS)
    return (f"old_string not found in {path}. The closest lines ({span.first}-{span.last}, {hint}):\n{closest}\n"
            "Copy the text exactly from these lines (without the line numbers and the tab) and try again.")


def occurrence_lines(text: str, sub: str, limit: int = MAX_LISTED) -> list[int]:
    """The line (1-based) on which each of the first ``limit`` occurrences of ``sub`` starts."""
    found: list[int] = []
    at = text.find(sub)
    while at != -1 and len(found) < limit:
        found.append(text.count("\n", 0, at) + 1)
        at = text.find(sub, at + 1)
    return found


def count_occurrences(text: str, sub: str) -> int:
    """How many times ``sub`` occurs in ``text``; overlapping matches count ("aa" is twice in "aaa")."""
    count = text.count(sub)
    if count == 1 and text.find(sub, text.find(sub) + 1) != -1:
        # str.count skips overlaps, yet an overlapping second match still makes the edit ambiguous.
        return 2
    return count
