"""A recorded-style 40-step bug-fix session, generated deterministically: what the model said and asked at each step,
and what each tool answered, at the sizes a real session has (issue 37's caching benchmark).

The task: a date-parsing library loses the sign of a UTC offset written without minutes (``+05``). The agent looks
around, reads the modules and their tests (files of 8-18 kB), runs the tests (failing runs with tracebacks, 2-6
kB), edits, reads diffs (3-6 kB), lints, and finishes: 146 kB of tool output, 40,000-46,000 tokens of history by
the last step (by provider), about 1,000,000 tokens sent over the session without a cache: the scale of the 40-step
session on a real repository that issue 37 measured. Nothing in it is anything masking would rewrite, so the
prompts are exactly what the history holds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

TASK = (
    "parse_datetime('2024-03-01T10:00:00+05') returns a datetime at UTC-5 instead of UTC+5: an offset written "
    "without minutes loses its sign. Fix it, add a regression test, keep the public API unchanged."
)
PACKAGE = "src/dateparse"
_WORDS = (
    "offset",
    "timezone",
    "value",
    "pattern",
    "match",
    "groups",
    "minutes",
    "hours",
    "sign",
    "strict",
    "naive",
    "aware",
    "iso",
    "week",
    "ordinal",
    "fraction",
    "seconds",
    "calendar",
    "leap",
    "boundary",
    "token",
    "format",
    "locale",
    "separator",
    "default",
    "fallback",
    "cache",
    "result",
    "parts",
    "digits",
)
_SENTENCES = (
    "The failure is in how the offset's sign is read when the minutes are missing.",
    "Before changing anything I want to see where the offset groups are built.",
    "The regular expression makes the minutes optional but the sign is taken from the minutes group.",
    "This matches the traceback: the hours are parsed, then negated by the default branch.",
    "The tests for offsets only cover the +HH:MM form, which is why nothing caught it.",
    "Let me run the focused tests again to see whether the change fixed the case without breaking others.",
    "Two tests still fail, both about naive datetimes; they rely on the old fallback.",
    "The fallback should stay as it is for naive values, so the fix belongs in the offset helper only.",
    "Now the whole suite, to be sure nothing else depended on the old behaviour.",
    "The linter complains about the line length in the new test; I will wrap it.",
    "The diff is small and touches only the offset helper, its test and the changelog.",
)


@dataclass(frozen=True)
class Step:
    """One model call: what the model says, the one tool it calls, and what that tool answers."""

    text: str
    tool: str
    arguments: dict[str, Any]
    output: str

    def turn(self) -> dict[str, Any]:
        """The replay model's trajectory entry for this step."""
        return {"content": self.text, "tool_calls": [{"name": self.tool, "arguments": self.arguments}]}


class _Writer:
    """Code-like text of a requested size, from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def word(self) -> str:
        return self.rng.choice(_WORDS)

    def function(self) -> list[str]:
        name = f"{self.word()}_{self.word()}"
        args = ", ".join(f"{self.word()}: str" for _ in range(self.rng.randint(1, 3)))
        lines = [f"def {name}({args}) -> datetime | None:", f'    """Return the {self.word()} of the {self.word()}."""']
        for _ in range(self.rng.randint(4, 12)):
            indent = " " * self.rng.choice((4, 4, 8, 12))
            kind = self.rng.randrange(5)
            if kind == 0:
                lines.append(f"{indent}if not {self.word()}:")
            elif kind == 1:
                lines.append(f"{indent}{self.word()} = _{self.word().upper()}_PATTERN.match({self.word()}.strip())")
            elif kind == 2:
                lines.append(f"{indent}return _{self.word()}({self.word()}, {self.word()}={self.word()})")
            elif kind == 3:
                lines.append(f"{indent}# the {self.word()} comes before the {self.word()} in ISO 8601")
            else:
                lines.append(f'{indent}raise ValueError(f"invalid {self.word()}: {{{self.word()}!r}}")')
        return [*lines, ""]

    def source(self, path: str, size: int) -> str:
        lines = [
            f'"""{path}: parsing of {self.word()} and {self.word()} values."""',
            "",
            "from __future__ import annotations",
            "",
            "import re",
            "from datetime import datetime, timedelta, timezone",
            "",
        ]
        while sum(len(line) + 1 for line in lines) < size:
            lines += self.function()
        return "\n".join(lines)

    def test_run(self, failures: int, size: int) -> str:
        count = self.rng.randint(120, 180)
        dots = "".join(self.rng.choice("....F") if failures else "." for _ in range(60))
        lines = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
            "rootdir: /workspace/dateparse",
            "configfile: pyproject.toml",
            f"collected {count} items",
            "",
            f"tests/test_core.py {dots} [ 40%]",
            f"tests/test_tz.py {dots[:40]} [ 80%]",
        ]
        if failures:
            lines += ["", "=================================== FAILURES ==================================="]
            while sum(len(line) + 1 for line in lines) < size - 300:
                name = f"test_{self.word()}_{self.word()}"
                lines += [
                    f"_______________________________ {name} ________________________________",
                    "",
                    f"    def {name}():",
                    f"        value = parse_datetime('2024-03-01T10:00:00+0{self.rng.randint(1, 9)}')",
                    ">       assert value.utcoffset() == timedelta(hours=5)",
                    "E       AssertionError: assert datetime.timedelta(days=-1, seconds=68400) == "
                    "datetime.timedelta(seconds=18000)",
                    "",
                    f"tests/test_core.py:{self.rng.randint(20, 400)}: AssertionError",
                ]
            lines.append("=========================== short test summary info ============================")
            lines += [
                f"FAILED tests/test_core.py::test_{self.word()}_{self.word()} - AssertionError" for _ in range(failures)
            ]
            lines.append(f"========================= {failures} failed, {count - failures} passed in 1.84s =========")
            return "\n".join(lines) + "\nexit code: 1"
        lines.append(f"============================= {count} passed in 1.61s ==============================")
        return "\n".join(lines) + "\nexit code: 0"

    def diff(self, size: int) -> str:
        lines: list[str] = []
        while sum(len(line) + 1 for line in lines) < size:
            path = f"{PACKAGE}/{self.word()}.py"
            start = self.rng.randint(10, 300)
            lines += [
                f"diff --git a/{path} b/{path}",
                f"index {self.rng.getrandbits(28):07x}..{self.rng.getrandbits(28):07x} 100644",
                f"--- a/{path}",
                f"+++ b/{path}",
                f"@@ -{start},12 +{start},14 @@ def {self.word()}_{self.word()}(",
            ]
            for line in self.function()[:10]:
                lines.append(self.rng.choice(" +-  ") + line)
        return "\n".join(lines) + "\nexit code: 0"

    def grep(self, count: int) -> str:
        lines = [
            f"{PACKAGE}/{self.word()}.py:{self.rng.randint(1, 400)}:    {self.word()} = _{self.word()}({self.word()})"
            for _ in range(count)
        ]
        return "\n".join(lines) + "\nexit code: 0"

    def say(self, step: int) -> str:
        first = _SENTENCES[step % len(_SENTENCES)]
        return f"{first} {self.rng.choice(_SENTENCES)} Step {step}: next I look at the {self.word()} {self.word()}."


def session(seed: int = 37, steps: int = 40) -> list[Step]:
    """The session's ``steps`` model calls (the last calls ``finish``), the same for the same seed."""
    w = _Writer(seed)
    core, tests = f"{PACKAGE}/core.py", "tests/test_core.py"
    plan: list[tuple[str, dict[str, Any], str]] = [
        ("bash", {"command": "git status && ls -R src tests | head -50"}, w.grep(12)),
        ("bash", {"command": "grep -rn 'offset' src/ tests/ | head -40"}, w.grep(40)),
        ("read_file", {"path": core}, w.source(core, 18_000)),
        ("read_file", {"path": tests}, w.source(tests, 12_000)),
        ("bash", {"command": "python -m pytest tests/test_core.py -x -q"}, w.test_run(3, 4_500)),
        ("read_file", {"path": f"{PACKAGE}/tz.py"}, w.source("tz.py", 10_000)),
        ("bash", {"command": "grep -rn '_OFFSET_PATTERN' src/"}, w.grep(18)),
        ("read_file", {"path": f"{PACKAGE}/formats.py"}, w.source("formats.py", 14_000)),
        ("bash", {"command": "git log -5 --stat"}, w.grep(25)),
        (
            "edit_file",
            {"path": core, "old": "sign = -1 if m else 1", "new": "sign = -1 if sign_text == '-' else 1"},
            f"replaced 1 occurrence in {core}",
        ),
        ("bash", {"command": "python -m pytest tests/test_core.py -x -q"}, w.test_run(2, 5_000)),
        ("read_file", {"path": core, "start": 120, "end": 200}, w.source(core, 3_000)),
        (
            "edit_file",
            {"path": core, "old": "minutes = int(m)", "new": "minutes = int(m or 0)"},
            f"replaced 1 occurrence in {core}",
        ),
        ("bash", {"command": "python -m pytest tests/test_core.py -q"}, w.test_run(2, 3_000)),
        (
            "bash",
            {"command": "python -c \"from dateparse import parse_datetime as p; print(p('2024-03-01T10:00+05'))\""},
            "2024-03-01 10:00:00+05:00\nexit code: 0",
        ),
        ("read_file", {"path": f"{PACKAGE}/utils.py"}, w.source("utils.py", 8_000)),
        (
            "edit_file",
            {"path": f"{PACKAGE}/utils.py", "old": "return naive", "new": "return naive.replace(tzinfo=None)"},
            f"replaced 1 occurrence in {PACKAGE}/utils.py",
        ),
        ("bash", {"command": "python -m pytest -q"}, w.test_run(2, 6_000)),
        ("read_file", {"path": "tests/test_tz.py"}, w.source("test_tz.py", 9_000)),
        ("bash", {"command": "python -m pytest tests/test_tz.py -q"}, w.test_run(1, 2_500)),
        (
            "edit_file",
            {"path": f"{PACKAGE}/tz.py", "old": "if offset:", "new": "if offset is not None:"},
            f"replaced 1 occurrence in {PACKAGE}/tz.py",
        ),
        ("bash", {"command": "python -m pytest tests/test_tz.py -q"}, w.test_run(0, 2_000)),
        ("bash", {"command": "git diff"}, w.diff(3_500)),
        (
            "write_file",
            {"path": "tests/test_regression.py", "content": w.source("test_regression.py", 1_200)},
            "wrote 1204 bytes to tests/test_regression.py",
        ),
        ("bash", {"command": "python -m pytest tests/test_regression.py -q"}, w.test_run(0, 1_500)),
        ("read_file", {"path": "CHANGELOG.md"}, w.grep(90)),
        (
            "edit_file",
            {"path": "CHANGELOG.md", "old": "## Unreleased", "new": "## Unreleased\n\n- Fix the sign of +HH offsets."},
            "replaced 1 occurrence in CHANGELOG.md",
        ),
        ("bash", {"command": "ruff check src tests"}, w.grep(14)),
        (
            "edit_file",
            {"path": "tests/test_regression.py", "old": "assert parse", "new": "assert (\n        parse"},
            "replaced 1 occurrence in tests/test_regression.py",
        ),
        (
            "bash",
            {"command": "ruff check src tests && mypy src"},
            "All checks passed!\nSuccess: no issues found in 9 source files\nexit code: 0",
        ),
        ("bash", {"command": "python -m pytest -q"}, w.test_run(0, 3_000)),
        ("bash", {"command": "git diff"}, w.diff(5_000)),
        ("read_file", {"path": core}, w.source(core, 18_500)),
        (
            "edit_file",
            {"path": core, "old": '"""Parse the offset."""', "new": '"""Parse the offset, +HH included."""'},
            f"replaced 1 occurrence in {core}",
        ),
        ("bash", {"command": "python -m pytest tests/test_core.py -q"}, w.test_run(0, 1_500)),
        ("bash", {"command": "git diff --stat"}, w.grep(6)),
        ("bash", {"command": "python -m doctest -v src/dateparse/core.py | tail -5"}, w.grep(5)),
        ("bash", {"command": "python -m pytest -q"}, w.test_run(0, 3_000)),
        ("bash", {"command": "git diff"}, w.diff(6_000)),
    ]
    chosen = plan[: max(steps - 1, 0)]
    out = [Step(w.say(n), tool, arguments, output) for n, (tool, arguments, output) in enumerate(chosen)]
    summary = "Offsets written as +HH keep their sign; regression test and changelog entry added."
    out.append(Step("The fix is complete and every check passes.", "finish", {"summary": summary}, ""))
    return out
