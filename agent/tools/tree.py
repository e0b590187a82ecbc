"""The checkout's files as git would list them (tracked or not, minus what ``.gitignore`` ignores), walked on the
host without trusting anything the agent wrote there.

No git process runs (it would read the checkout's ``.git/config``: ``core.fsmonitor`` and the like run commands).
Every directory is opened from its parent's descriptor with ``O_NOFOLLOW``, so a symlink is never followed and a
directory swapped for one is refused; ``.gitignore`` files and ``.git/info/exclude`` are read as data, capped, and
matched by pathspec with git's own semantics on RE2, whose matching time is linear: a hostile pattern cannot stall
the worker.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pathspec

from agent.tools.workspace import ToolError, Workspace

MAX_DEPTH = 64
MAX_ENTRIES = 200_000  # directory entries looked at in one walk
MAX_IGNORE_BYTES = 256 * 1024  # read of one .gitignore; the rest of a larger one is left out
MAX_IGNORE_PATTERNS = 2000  # of one ignore file (GitHub's largest templates have a few hundred)
MAX_BRACE_EXPANSIONS = 64
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_QUOTED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


@dataclass(frozen=True)
class Entry:
    """A file of the walk: its path from the root and, while the walk is at it, its directory's descriptor."""

    path: str
    name: str
    dir_fd: int
    is_symlink: bool

    def open(self) -> int:
        """A descriptor of the file, never through a symlink and never blocking (a FIFO opens and is refused)."""
        return os.open(self.name, _FILE_FLAGS, dir_fd=self.dir_fd)


@dataclass
class Walk:
    """What a walk met besides its files."""

    entries: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Level:
    """One ignore file's patterns, for the paths below ``prefix`` (``""``: the root, or ``dir/``)."""

    prefix: str
    spec: pathspec.GitIgnoreSpec


def compile_patterns(lines: list[str]) -> pathspec.GitIgnoreSpec:
    """Gitignore-style patterns (git's wildmatch), matched with RE2; a pattern that cannot compile is an error."""
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines, backend="re2")
    except Exception as exc:  # pathspec raises re.error, ValueError, RE2's "failed to compile Set" and more
        raise ToolError(f"bad pattern: {exc}") from exc


def glob_filter(pattern: str) -> Callable[[str], bool]:
    """Whether a path (relative to where the walk starts) matches ``pattern``: ``*.py`` matches file names at any
    depth, ``src/**/*.ts`` matches from the start; ``{a,b}`` alternatives are expanded."""
    spec = compile_patterns([p for p in expand_braces(pattern.strip()) if p])
    return spec.match_file


def expand_braces(pattern: str) -> list[str]:
    """``*.{ts,tsx}`` → ``*.ts``, ``*.tsx`` (nested and repeated groups too, up to a cap)."""
    done: list[str] = []
    todo = [pattern]
    while todo:
        current = todo.pop()
        open_at = current.find("{")
        close_at = current.find("}", open_at)
        inner = current[open_at + 1 : close_at]
        if open_at < 0 or close_at < 0 or "," not in inner:
            done.append(current)
            continue
        nested = inner.rfind("{")  # expand the innermost group first
        if nested >= 0:
            open_at += nested + 1
            inner = current[open_at + 1 : close_at]
        todo.extend(current[:open_at] + choice + current[close_at + 1 :] for choice in inner.split(","))
        if len(done) + len(todo) > MAX_BRACE_EXPANSIONS:
            raise ToolError(f"the pattern {pattern!r} expands to more than {MAX_BRACE_EXPANSIONS} alternatives")
    return sorted(set(done))


def shown_path(path: str) -> str:
    """``path`` as one line of output: C-quoted, as git's ``core.quotePath`` does, when it holds a control
    character, a quote, a backslash or a byte that is not UTF-8, so a file name cannot forge a result line."""
    if path.isprintable() and '"' not in path and "\\" not in path:
        return path
    out = []
    for char in path:
        if char in _QUOTED:
            out.append(_QUOTED[char])
        elif char.isprintable() and not 0xD800 <= ord(char) <= 0xDFFF:
            out.append(char)
        else:
            out.extend(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogateescape"))
    return '"' + "".join(out) + '"'


def walk(workspace: Workspace, under: str, walked: Walk) -> Iterator[Entry]:
    """The files (regular ones and symlinks, never followed) below ``under`` (``""``: the root), sorted by path,
    without ``.git`` and what the ignore files ignore; a directory named explicitly is walked even if ignored."""
    parts = [p for p in under.split("/") if p not in ("", ".")]
    if parts:
        workspace.resolve(under)  # the model's path: the usual refusals (.., absolute, .git, outside)
    root_fd = os.open(workspace.root, _DIR_FLAGS)
    levels = [*_exclude_level(root_fd, walked), *_ignore_level(root_fd, "", walked)]
    fd = root_fd
    prefix = ""
    try:
        for part in parts:
            try:
                following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                yield from _single_file(fd, prefix, part, under)
                return
            except FileNotFoundError as exc:
                raise ToolError(f"no such file or directory: {under}") from exc
            except OSError as exc:
                raise ToolError(f"{under!r} cannot be walked: {exc.strerror} (a symlink is not followed)") from exc
            os.close(fd)
            fd, prefix = following, f"{prefix}{part}/"
            if _ignored(levels, prefix):
                levels = []  # asked for by name: the patterns that ignore it do not apply inside
            levels += _ignore_level(fd, prefix, walked)
        yield from _walk_dir(fd, prefix, levels, 0, walked)
    finally:
        os.close(fd)


def _single_file(dir_fd: int, prefix: str, name: str, under: str) -> Iterator[Entry]:
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        raise ToolError(f"{under} is not a regular file or a directory")
    yield Entry(prefix + name, name, dir_fd, stat.S_ISLNK(info.st_mode))


def _walk_dir(fd: int, prefix: str, levels: list[_Level], depth: int, walked: Walk) -> Iterator[Entry]:
    """Depth first, in name order; ``fd`` stays open (and the caller's) while the entries below it are used."""
    with os.scandir(fd) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        walked.entries += 1
        if walked.entries > MAX_ENTRIES:
            if not walked.notes or "stopped" not in walked.notes[-1]:
                walked.notes.append(f"stopped after {MAX_ENTRIES} directory entries; give a path to narrow it")
            return
        path = prefix + entry.name
        if entry.name == ".git":
            continue
        if entry.is_dir(follow_symlinks=False):
            if _ignored(levels, path + "/"):
                continue
            if depth + 1 >= MAX_DEPTH:
                walked.notes.append(f"not entered (deeper than {MAX_DEPTH} directories): {shown_path(path)}/")
                continue
            yield from _enter(fd, entry.name, path + "/", levels, depth + 1, walked)
        elif (entry.is_file(follow_symlinks=False) or entry.is_symlink()) and not _ignored(levels, path):
            yield Entry(path, entry.name, fd, entry.is_symlink())


def _enter(parent: int, name: str, prefix: str, levels: list[_Level], depth: int, walked: Walk) -> Iterator[Entry]:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:  # swapped for a symlink or a file since it was listed, or unreadable: not walked
        return
    try:
        yield from _walk_dir(fd, prefix, [*levels, *_ignore_level(fd, prefix, walked)], depth, walked)
    finally:
        os.close(fd)


def _ignored(levels: list[_Level], path: str) -> bool:
    """Git's precedence: the deepest ignore file with a matching pattern decides, and in it the last match."""
    for level in reversed(levels):
        if not path.startswith(level.prefix):
            continue
        verdict = level.spec.check_file(path[len(level.prefix) :]).include
        if verdict is not None:
            return bool(verdict)
    return False


def _ignore_level(dir_fd: int, prefix: str, walked: Walk) -> list[_Level]:
    return _patterns_level(_read_small(dir_fd, ".gitignore"), prefix, walked, f"{prefix}.gitignore")


def _exclude_level(root_fd: int, walked: Walk) -> list[_Level]:
    """``.git/info/exclude``: the repository's own ignores, below every ``.gitignore`` in precedence."""
    try:
        git_fd = os.open(".git", _DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return []
    try:
        info_fd = os.open("info", _DIR_FLAGS, dir_fd=git_fd)
    except OSError:
        return []
    finally:
        os.close(git_fd)
    try:
        return _patterns_level(_read_small(info_fd, "exclude"), "", walked, ".git/info/exclude")
    finally:
        os.close(info_fd)


def _patterns_level(text: str, prefix: str, walked: Walk, source: str) -> list[_Level]:
    """One ignore file's level; a pattern that does not compile is skipped (git skips it too), and a file whose
    patterns still do not compile together is left out, with a note: more files shown, never fewer."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) > MAX_IGNORE_PATTERNS:
        walked.notes.append(f"{shown_path(source)}: only its first {MAX_IGNORE_PATTERNS} patterns applied")
        lines = lines[:MAX_IGNORE_PATTERNS]
    if not lines:
        return []
    try:
        return [_Level(prefix, compile_patterns(lines))]
    except ToolError:
        lines = [line for line in lines if _compiles(line)]
    try:
        return [_Level(prefix, compile_patterns(lines))] if lines else []
    except ToolError:
        walked.notes.append(f"{shown_path(source)}: its patterns could not be used; nothing it names is left out")
        return []


def _compiles(line: str) -> bool:
    try:
        compile_patterns([line])
    except ToolError:
        return False
    return True


def _read_small(dir_fd: int, name: str) -> str:
    """A regular file's first bytes as text, or ``""`` (missing, a symlink, a FIFO, unreadable)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return ""
    with contextlib.closing(os.fdopen(fd, "rb")) as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = handle.read(MAX_IGNORE_BYTES)
    if len(data) == MAX_IGNORE_BYTES:
        data = data[: data.rfind(b"\n") + 1]  # a pattern cut in the middle would ignore something else
    return data.decode("utf-8", errors="replace")
