"""``read_file``, ``write_file`` and ``edit_file``: repository files, always through :class:`Workspace`."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from agent.tools.output import cap_output
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import ToolError, Workspace

# Repository files, not context files: readable by the tools a repository expects (linters, builds).
NEW_FILE_MODE = 0o644
# Larger files are read in parts with bash (sed -n, head, tail) rather than loaded whole.
MAX_FILE_BYTES = 10 * 1024 * 1024
# A NUL byte near the start is the usual sign of a binary file.
_BINARY_SNIFF_BYTES = 8192


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
    """``read_file(path)``: the file's text."""

    name = "read_file"
    changes_checkout = False
    description = "Return the text of a file in the repository. Long files are cut in the middle."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"path": _PATH},
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Read the file; binary files and directories are refused."""
        data = _read_bytes(workspace, arguments["path"])
        if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
            raise ToolError(f"{arguments['path']} looks like a binary file; inspect it with bash (file, xxd)")
        text, _ = cap_output(data.decode("utf-8", errors="replace"), options.max_output_chars)
        return ToolOutcome(text)


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
    """``edit_file(path, old_string, new_string)``: replace exactly one occurrence."""

    name = "edit_file"
    changes_checkout = True
    description = (
        "Replace old_string with new_string in a file. old_string must occur exactly once, character for "
        "character (whitespace and indentation included); add surrounding lines to make it unique."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "old_string": {"type": "string", "description": "The exact text to replace; must occur once."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Replace the single occurrence, or refuse and say how many there are."""
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
        count = count_occurrences(text, old)
        if count == 0:
            raise ToolError(f"old_string not found in {path}; read the file and copy the text exactly")
        if count > 1:
            raise ToolError(f"old_string occurs {count} times in {path}; add surrounding lines to match once")
        _write_bytes(workspace, path, text.replace(old, new, 1).encode("utf-8"), options)
        return ToolOutcome(f"replaced 1 occurrence in {workspace.display(workspace.resolve(path))}")


def count_occurrences(text: str, sub: str) -> int:
    """How many times ``sub`` occurs in ``text``; overlapping matches count ("aa" is twice in "aaa")."""
    count = text.count(sub)
    if count == 1 and text.find(sub, text.find(sub) + 1) != -1:
        # str.count skips overlaps, yet an overlapping second match still makes the edit ambiguous.
        return 2
    return count
