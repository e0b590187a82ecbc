"""Which new files look like scratch, and which changed files are tests (the finish gate's rules, docs/finish-gate.md).

A new file is **scratch** when its name says it was made to try something, not to be kept: a reproduction or debug
script (``reproduce*``, ``repro_*``, ``debug_*``, ``scratch*``, ``tmp_*``/``temp_*``, ``try_*``), a patch's leftovers
(``*.orig``, ``*.rej``), a backup or an editor's swap file (``*.bak``, ``*~``, ``*.swp``), or an output dump (``*.log``,
``*.out``). Only new files are judged: a file the repository already had is never scratch, whatever its name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SCRATCH_NAMES = re.compile(
    r"^(reproduce|repro[_.-]|debug[_.-]|scratch|tmp[_.-]|temp[_.-]|try[_.-])", re.IGNORECASE
)
_SCRATCH_SUFFIXES = (".orig", ".rej", ".bak", "~", ".swp", ".swo", ".log", ".out")
_TEST_DIRS = frozenset({"test", "tests", "__tests__", "spec", "specs", "testing"})
_TEST_NAMES = re.compile(r"^(test_.+|.+_test\.\w+|.+\.(test|spec)\.\w+|tests?\.\w+|conftest\.py)$")


def scratch_reason(path: str) -> str | None:
    """Why the new file ``path`` looks like scratch, or None when it looks like part of the change."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(_SCRATCH_SUFFIXES):
        return "a leftover or output file by its name"
    if _SCRATCH_NAMES.match(name):
        return "a reproduction or debug script by its name"
    return None


def is_test_file(path: str) -> bool:
    """Whether ``path`` is a test by its name or a directory it is in (``tests/``, ``test_x.py``, ``x_test.go``,
    ``x.test.ts``, ``conftest.py``)."""
    parts = path.split("/")
    return bool(_TEST_DIRS.intersection(parts[:-1])) or bool(_TEST_NAMES.match(parts[-1]))


def kept_paths(keep: object) -> set[str]:
    """The paths the agent named in ``finish``'s ``keep``: a list, or a string of paths separated by spaces, commas or
    new lines (a small model's way); ``./`` dropped."""
    text = keep if isinstance(keep, str) else ""
    words = [str(w) for w in keep] if isinstance(keep, list) else re.split(r"[\s,]+", text)
    return {word.strip().removeprefix("./") for word in words if word.strip().strip("./")}


def scratch_files(new_files: Iterable[str], keep: set[str]) -> list[str]:
    """The new files that look like scratch and that the agent did not keep, in order."""
    return [path for path in new_files if path not in keep and scratch_reason(path) is not None]
