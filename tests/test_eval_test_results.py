"""sandbox/test_results.py: the outcome per test read from real pytest and unittest output, the grade, the command
that runs a set's tests, and the files a test patch touches (issue 39)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.test_results import (
    PARSERS,
    Grade,
    failed_grade,
    grade,
    parse_results,
    test_command,
    test_files,
)

# Every kind of outcome both runners report, and the traps: a parametrized id holding " - ", a test whose captured
# stdout looks like a summary line, a pass followed by an error at teardown, a failing subtest in a passing test.
PROJECT_TESTS = textwrap.dedent('''
    import sys
    import unittest

    import pytest

    def test_ok(): pass
    def test_bad(): assert 1 == 2

    @pytest.mark.skip(reason="why")
    def test_skip(): pass

    @pytest.mark.xfail
    def test_xf(): assert 0

    @pytest.mark.parametrize("v", ["a b", "c - d"])
    def test_p(v): assert v != "c - d"

    @pytest.fixture
    def broken(): raise RuntimeError("x")
    def test_err(broken): pass

    @pytest.fixture
    def teardown_fails():
        yield
        raise RuntimeError("teardown")
    def test_td(teardown_fails): print("PASSED tests/test_a.py::test_bad")

    class TestC:
        def test_m(self): pass

    class U(unittest.TestCase):
        def test_u(self): pass
        def test_sub(self):
            for i in range(2):
                with self.subTest(i=i):
                    self.assertEqual(i, 0)
        @unittest.skip("r")
        def test_us(self): pass
        def test_doc(self):
            """Doc line."""
            sys.stderr.write("noise\\n")
        @unittest.expectedFailure
        def test_ef(self): self.assertTrue(False)
        def test_e(self): raise KeyError(1)
        def test_f(self): self.fail("no")
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_a.py").write_text(PROJECT_TESTS)
    return root


def run(project: Path, *argv: str) -> str:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(argv, cwd=project, capture_output=True, text=True, env=env, timeout=120, check=False)
    return done.stdout + done.stderr


def test_pytest_summary_lines_of_a_real_run_give_every_outcome(project: Path) -> None:
    output = run(project, sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_a.py")
    assert "short test summary info" in output
    assert parse_results("pytest", output) == {
        "tests/test_a.py::test_ok": "passed",
        "tests/test_a.py::test_bad": "failed",
        "tests/test_a.py::test_xf": "passed",
        "tests/test_a.py::test_p[a b]": "passed",
        "tests/test_a.py::test_p[c - d]": "failed",
        "tests/test_a.py::test_err": "error",
        "tests/test_a.py::test_td": "error",
        "tests/test_a.py::TestC::test_m": "passed",
        "tests/test_a.py::U::test_u": "passed",
        "tests/test_a.py::U::test_sub": "failed",
        "tests/test_a.py::U::test_doc": "passed",
        "tests/test_a.py::U::test_ef": "passed",
        "tests/test_a.py::U::test_e": "failed",
        "tests/test_a.py::U::test_f": "failed",
    }


def test_unittest_verbose_lines_of_a_real_run_give_every_outcome(project: Path) -> None:
    output = run(project, sys.executable, "-m", "unittest", "-v", "tests/test_a.py")
    assert parse_results("unittest", output) == {
        "tests.test_a.U.test_u": "passed",
        "tests.test_a.U.test_sub": "failed",
        "tests.test_a.U.test_us": "skipped",
        "tests.test_a.U.test_doc": "passed",
        "tests.test_a.U.test_ef": "passed",
        "tests.test_a.U.test_e": "error",
        "tests.test_a.U.test_f": "failed",
    }


def test_unittest_ids_before_python_3_11_name_the_class_only() -> None:
    output = "test_a (pkg.tests.Case) ... ok\ntest_b (pkg.tests.Case) ... FAIL\n"
    assert parse_results("unittest", output) == {"pkg.tests.Case.test_a": "passed", "pkg.tests.Case.test_b": "failed"}


def test_lines_outside_the_summary_are_not_read_when_there_is_one() -> None:
    output = "PASSED a.py::captured\n==== short test summary info ====\nFAILED a.py::t - boom\n==== 1 failed ====\n"
    assert parse_results("pytest", output) == {"a.py::t": "failed"}


def test_colored_output_and_location_only_skips() -> None:
    output = "\x1b[32mPASSED\x1b[0m a.py::t\nSKIPPED [1] a.py:3: why\n"
    assert parse_results("pytest", output) == {"a.py::t": "passed"}


def test_an_unknown_parser_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="pytest, unittest"):
        parse_results("jest", "")
    assert set(PARSERS) == {"pytest", "unittest"}


@pytest.mark.parametrize("parser", ["pytest", "unittest"])
def test_the_default_command_runs_the_files_with_the_environments_interpreter(project: Path, parser: str) -> None:
    (project / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    venv_python = project / ".venv" / "bin" / "python"
    if not venv_python.exists():
        venv_python.symlink_to(sys.executable)
    command = test_command(None, parser, ["tests/test_a.py"])
    output = run(project, "bash", "-c", command + '; echo "interpreter=$py"')
    assert "interpreter=.venv/bin/python" in output
    results = parse_results(parser, output)
    assert results[{"pytest": "tests/test_a.py::U::test_f", "unittest": "tests.test_a.U.test_f"}[parser]] == "failed"


def test_a_rows_template_gets_its_files_quoted_and_keeps_bashs_braces() -> None:
    command = test_command('X=${HOME} "$py" -m pytest {files}', "pytest", ["tests/a b.py", "t;rm -rf x.py"])
    assert command.endswith("""X=${HOME} "$py" -m pytest 'tests/a b.py' 't;rm -rf x.py'""")
    with pytest.raises(ValueError, match="test_command"):
        test_command(None, "tap", ["x"])


def test_resolved_only_when_every_listed_test_passed() -> None:
    results = {"t::a": "passed", "t::b": "passed", "t::c": "failed"}
    assert grade(results, ["t::a"], ["t::b"]).resolved
    failing = grade(results, ["t::a", "t::c"], ["t::b", "t::gone"])
    assert not failing.resolved
    assert failing.fail_to_pass == {"t::a": "passed", "t::c": "failed"}
    assert failing.pass_to_pass == {"t::b": "passed", "t::gone": "missing"}
    assert failing.failed == ["t::c", "t::gone"]


def test_a_grade_survives_json_and_a_failed_grading_is_unresolved() -> None:
    graded = grade({"t::a": "failed"}, ["t::a"], [])
    data = {**graded.to_json(), "duration_s": 1.5}
    assert data["failed"] == ["t::a"]
    assert Grade.from_json(data) == graded
    broken = failed_grade("the test patch does not apply", ["t::a"], ["t::b"])
    assert not broken.resolved
    assert broken.error == "the test patch does not apply"
    assert broken.failed == ["t::a", "t::b"]


def test_test_files_of_a_real_git_diff(tmp_path: Path) -> None:
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for name in ("tests/test_old.py", "tests/test_gone.py", "tests/moved.py", "src/mode.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n" * 5)
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (tmp_path / "tests/test_old.py").write_text("# changed\n")
    (tmp_path / "tests/test_new file.py").write_text("# new\n")
    (tmp_path / "tests/test_gone.py").unlink()
    git("mv", "tests/moved.py", "tests/renamed.py")
    (tmp_path / "src/mode.sh").chmod(0o755)
    git("add", "-A")
    patch = git("diff", "--cached", "-M")
    assert sorted(test_files(patch)) == ["src/mode.sh", "tests/renamed.py", "tests/test_new file.py",
                                         "tests/test_old.py"]


def test_test_files_of_a_plain_unified_diff() -> None:
    patch = "--- a/x.py\t2020-01-01\n+++ b/x.py\t2020-01-02\n@@ -1 +1 @@\n-a\n+b\n--- y.py\n+++ /dev/null\n"
    assert test_files(patch) == ["x.py"]
