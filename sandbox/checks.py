"""Which checks the finish gate runs (docs/finish-gate.md): the repository's ``.tasuki/checks``, else the operator's
``agent.checks``, else the test command its files suggest.

Everything here reads the repository **as of the task's base commit** through ``read`` (a path -> its text, None when
absent) and ``names`` (the base's top-level entries): the agent writes the working tree, so what it writes there can
never choose which checks judge its own change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

CHECKS_FILE = ".tasuki/checks"
MAX_CHECKS = 20  # lines of .tasuki/checks taken; more is a mistake, not a test plan
MAX_CHECK_CHARS = 2000  # one command line
NPM_DEFAULT_TEST = "no test specified"  # `npm init`'s placeholder test script, which always fails

PYTHON_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "pytest.ini", "tests", "test")
# pytest when the project's environment has it, else the standard library's runner; the environment's own
# interpreter (/workspace/.venv, made by environments.auto) when there is one.
PYTHON_TESTS = (
    'if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; '
    'if "$py" -c "import pytest" 2>/dev/null; then "$py" -m pytest -q; else "$py" -m unittest -q; fi'
)
_MAKE_TEST = re.compile(r"^test\s*:", re.MULTILINE)


@dataclass(frozen=True)
class Checks:
    """The commands the gate runs (each a bash command line in the checkout) and where they were declared."""

    commands: tuple[str, ...] = ()
    source: str = ""  # ".tasuki/checks", "agent.checks", "detected (go.mod)"; "" when there are none


def parse_checks(text: str) -> tuple[str, ...]:
    """``.tasuki/checks``: one bash command per line; blank lines and lines starting with ``#`` are skipped."""
    lines = (line.strip() for line in text.splitlines())
    commands = [line for line in lines if line and not line.startswith("#")]
    return tuple(command[:MAX_CHECK_CHARS] for command in commands[:MAX_CHECKS])


def resolve_checks(read: Callable[[str], str | None], names: Collection[str], operator: Sequence[str]) -> Checks:
    """The checks of a repository: its ``.tasuki/checks`` (read at the base), else ``operator``, else detected."""
    declared = read(CHECKS_FILE)
    if declared is not None:
        return Checks(parse_checks(declared), CHECKS_FILE)
    if operator:
        return Checks(tuple(operator), "agent.checks")
    return detected_checks(read, names)


def detected_checks(read: Callable[[str], str | None], names: Collection[str]) -> Checks:
    """The usual test command of what the top of the repository holds: a Makefile's ``test`` target, else one per
    toolchain found (Python, Node with a real ``test`` script, Go, Rust)."""
    makefile = read("Makefile") if "Makefile" in names else None
    if makefile is not None and _MAKE_TEST.search(makefile):
        return Checks(("make test",), "detected (Makefile)")
    found: list[tuple[str, str]] = []
    python = next((name for name in PYTHON_MARKERS if name in names), None)
    python = python or next((n for n in sorted(names) if n.startswith("test") and n.endswith(".py")), None)
    if python is not None:
        found.append((PYTHON_TESTS, python))
    if "package.json" in names and _npm_test(read("package.json")):
        found.append(("npm test", "package.json"))
    if "go.mod" in names:
        found.append(("go test ./...", "go.mod"))
    if "Cargo.toml" in names:
        found.append(("cargo test", "Cargo.toml"))
    if not found:
        return Checks()
    return Checks(tuple(command for command, _ in found), f"detected ({', '.join(name for _, name in found)})")


def _npm_test(text: str | None) -> bool:
    try:
        scripts = json.loads(text or "{}").get("scripts") or {}
    except (ValueError, AttributeError):
        return False
    test = scripts.get("test") if isinstance(scripts, dict) else None
    return isinstance(test, str) and bool(test.strip()) and NPM_DEFAULT_TEST not in test
