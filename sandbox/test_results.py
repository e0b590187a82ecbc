"""What a test run said about each test, and whether an eval task is resolved (issue 39).

Pure text in, data out: the worker runs :func:`test_command` in the sandbox, hands the output to
:func:`parse_results` and the outcome per test to :func:`grade`. A parser maps a test id to one of
``passed``, ``failed``, ``error`` or ``skipped``; a test the output never names is ``missing`` in a :class:`Grade`.
The ids are the ones a task set's ``FAIL_TO_PASS``/``PASS_TO_PASS`` use: pytest's node ids
(``tests/test_x.py::test_y``) and, for the standard library's runner, the dotted name ``python -m unittest`` takes
(``tests.test_x.Case.test_y``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PASSED, FAILED, ERROR, SKIPPED, MISSING = "passed", "failed", "error", "skipped", "missing"
# A test named twice (a pass then an error at teardown, or two runs in one command) keeps its worst outcome.
_SEVERITY = {PASSED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}

# The environment's own interpreter (/workspace/.venv, made by environments.auto) when there is one; a row's own
# template may use "$py" too.
INTERPRETER = 'if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; '
DEFAULT_TEMPLATES = {
    "pytest": '"$py" -m pytest -rA -p no:cacheprovider {files}',
    "unittest": '"$py" -m unittest -v {files}',
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# pytest -rA's summary: "PASSED id", "FAILED id - message", "XFAIL id - reason"; XFAIL and XPASS count as passed, as
# in SWE-bench's harness (an expected failure is the test doing what it says).
# A subtest's line ("SUBFAILED(i=1) id - message", pytest 9) names its test, which then keeps the worst outcome.
_PYTEST_STATUS = {"PASSED": PASSED, "XFAIL": PASSED, "XPASS": PASSED, "FAILED": FAILED, "ERROR": ERROR,
                  "SKIPPED": SKIPPED, "SUBPASSED": PASSED, "SUBFAILED": FAILED, "SUBSKIPPED": SKIPPED}
_PYTEST_LINE = re.compile(r"^(?P<status>[A-Z]+)(?:\(.*?\))? (?P<rest>\S.*)$")
# A parametrized id may itself hold " - " ("test_p[c - d] - AssertionError"): it ends at the "]" before the message.
_PYTEST_PARAMETRIZED = re.compile(r"^(\S*?\[.*?\])(?: - |$)")
_PYTEST_SUMMARY = re.compile(r"^=+ short test summary info =+$")
# python -m unittest -v: "test_y (tests.test_x.Case.test_y) ... ok" (3.11+; older: "(tests.test_x.Case)"), with
# a docstring's first line or the test's own stderr possibly between the name and the verdict.
_UNITTEST_HEADER = re.compile(r"^(?P<name>\w+) \((?P<where>[\w.]+)\)")
_UNITTEST_VERDICT = re.compile(r"(?:^|\.\.\. )(?P<verdict>ok|FAIL|ERROR|skipped\b.*|expected failure|"
                               r"unexpected success)$")
_UNITTEST_STATUS = {"ok": PASSED, "expected failure": PASSED, "unexpected success": FAILED, "FAIL": FAILED,
                    "ERROR": ERROR}
# The closing report names each failing test again ("FAIL: test_y (tests.test_x.Case.test_y)"): it catches a
# verdict the interleaved output hid, and a subtest's failure on a test whose own line said ok.
_UNITTEST_REPORT = re.compile(r"^(?P<verdict>FAIL|ERROR): (?P<name>\w+) \((?P<where>[\w.]+)\)")


def _worse(results: dict[str, str], test: str, status: str) -> None:
    if test not in results or _SEVERITY[status] >= _SEVERITY[results[test]]:
        results[test] = status


def _summary_lines(lines: list[str]) -> Iterable[str]:
    """The lines of every "short test summary info" section (all of them when none is there)."""
    starts = [i for i, line in enumerate(lines) if _PYTEST_SUMMARY.match(line)]
    if not starts:
        yield from lines
        return
    for start in starts:
        for line in lines[start + 1:]:
            if line.startswith("="):
                break
            yield line


def parse_pytest(output: str) -> dict[str, str]:
    """``pytest -rA``'s summary lines; a skip reported by location only ("SKIPPED [1] x.py:3: why") names no
    test and is left out (so such a test is missing, which is not passed)."""
    results: dict[str, str] = {}
    for line in _summary_lines(_ANSI.sub("", output).splitlines()):
        match = _PYTEST_LINE.match(line.rstrip())
        if match is None or match["status"] not in _PYTEST_STATUS or match["rest"].startswith("["):
            continue
        parametrized = _PYTEST_PARAMETRIZED.match(match["rest"])
        test = parametrized[1] if parametrized else match["rest"].split(" - ", 1)[0].strip()
        _worse(results, test, _PYTEST_STATUS[match["status"]])
    return results


def _unittest_id(name: str, where: str) -> str:
    return where if where.endswith("." + name) else f"{where}.{name}"


def parse_unittest(output: str) -> dict[str, str]:
    """``python -m unittest -v``'s verdict lines, then its closing ``FAIL:``/``ERROR:`` report."""
    results: dict[str, str] = {}
    pending: str | None = None
    for raw in _ANSI.sub("", output).splitlines():
        line = raw.rstrip()
        report = _UNITTEST_REPORT.match(line)
        if report is not None:
            _worse(results, _unittest_id(report["name"], report["where"]), _UNITTEST_STATUS[report["verdict"]])
            pending = None
            continue
        header = _UNITTEST_HEADER.match(line)
        if header is not None:
            pending = _unittest_id(header["name"], header["where"])
        verdict = _UNITTEST_VERDICT.search(line)
        if pending is not None and verdict is not None:
            word = verdict["verdict"]
            _worse(results, pending, SKIPPED if word.startswith("skipped") else _UNITTEST_STATUS[word])
            pending = None
    return results


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {"pytest": parse_pytest, "unittest": parse_unittest}


def parse_results(parser: str, output: str) -> dict[str, str]:
    """Test id -> "passed"|"failed"|"error"|"skipped" from a run's output, read by the named parser."""
    try:
        return PARSERS[parser](output)
    except KeyError:
        raise ValueError(f"unknown test parser {parser!r} (known: {', '.join(sorted(PARSERS))})") from None


def test_command(template: str | None, parser: str, files: Sequence[str]) -> str:
    """The bash command that runs ``files`` (shell-quoted) with the environment's interpreter: a row's own template
    with ``{files}`` substituted (its other braces are left alone: ``${VAR}`` is bash's), else the parser's."""
    if template is None:
        if parser not in DEFAULT_TEMPLATES:
            raise ValueError(f"no default test command for parser {parser!r}; the row must give test_command")
        template = DEFAULT_TEMPLATES[parser]
    return INTERPRETER + template.replace("{files}", shlex.join(files))


test_command.__test__ = False  # type: ignore[attr-defined]  # pytest: a function named test_* that is no test


@dataclass(frozen=True)
class Grade:
    """The verdict on one eval task: every FAIL_TO_PASS and PASS_TO_PASS test passed, or why not."""

    resolved: bool
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # grading itself failed (the test patch did not apply, the run timed out)

    @property
    def failed(self) -> list[str]:
        """The tests that did not pass, FAIL_TO_PASS first."""
        tests = {**self.fail_to_pass, **self.pass_to_pass}
        return [test for test, status in tests.items() if status != PASSED]

    def to_json(self) -> dict[str, Any]:
        """The grade as the task's result holds it (``failed`` is derived, for readers)."""
        return {"resolved": self.resolved, "fail_to_pass": dict(self.fail_to_pass),
                "pass_to_pass": dict(self.pass_to_pass), "error": self.error, "failed": self.failed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Grade:
        """Read back :meth:`to_json` (extra keys such as ``duration_s`` are ignored)."""
        return cls(resolved=bool(data.get("resolved")), fail_to_pass=dict(data.get("fail_to_pass") or {}),
                   pass_to_pass=dict(data.get("pass_to_pass") or {}), error=data.get("error"))


def grade(results: Mapping[str, str], fail_to_pass: Iterable[str], pass_to_pass: Iterable[str]) -> Grade:
    """Resolved iff every FAIL_TO_PASS and every PASS_TO_PASS test passed; a test the run never named is missing."""
    f2p = {test: results.get(test, MISSING) for test in fail_to_pass}
    p2p = {test: results.get(test, MISSING) for test in pass_to_pass}
    resolved = all(status == PASSED for status in [*f2p.values(), *p2p.values()])
    return Grade(resolved=resolved, fail_to_pass=f2p, pass_to_pass=p2p)


def failed_grade(error: str, fail_to_pass: Iterable[str] = (), pass_to_pass: Iterable[str] = ()) -> Grade:
    """The grade of a task that could not be graded: not resolved, every test missing, and why."""
    return Grade(resolved=False, fail_to_pass=dict.fromkeys(fail_to_pass, MISSING),
                 pass_to_pass=dict.fromkeys(pass_to_pass, MISSING), error=error)


_GIT_HEADER = re.compile(r'^diff --git (?:"?a/)(?P<a>.+?)"? (?:"?b/)(?P<b>.+?)"?$')


def _unquote(path: str) -> str:
    """git's C-style quoting of a path with unusual characters ("b/sp\\303\\251cial")."""
    if not (path.startswith('"') and path.endswith('"')):
        return path
    raw = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "replace")


def _new_path(line: str) -> str | None:
    """The path of a "+++ b/x" line; None for "+++ /dev/null" (a deleted file)."""
    path = _unquote(line[4:].split("\t", 1)[0].rstrip())
    if path == "/dev/null":
        return None
    return path[2:] if path.startswith("b/") else path


def test_files(patch: str) -> list[str]:
    """The paths a unified diff touches, as they are after it (its b/ side), in order; deleted files excluded."""
    files: list[str] = []
    block: str | None = None  # the current "diff --git" block's path, until its +++ line (if any) says better
    deleted = False

    def close() -> None:
        if block is not None and not deleted and block not in files:
            files.append(block)

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            close()
            header = _GIT_HEADER.match(line)
            block, deleted = (header["b"] if header else None), False
        elif line.startswith("deleted file mode"):
            deleted = True
        elif line.startswith("rename to "):
            block = _unquote(line[len("rename to "):])
        elif line.startswith("+++ "):
            path = _new_path(line)
            if path is None:
                deleted = True
            elif block is not None:
                block = path
            elif path not in files:
                files.append(path)  # a plain `diff -u` without git's headers
    close()
    return files


test_files.__test__ = False  # type: ignore[attr-defined]
