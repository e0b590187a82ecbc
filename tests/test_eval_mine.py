"""`tasuki eval mine` (issue 39): a task set from a repository's own history — the changes touching tests and code,
FAIL_TO_PASS and PASS_TO_PASS from running the tests twice before and twice after in the sandbox, the problem statement
from the forge's issue when it answers; its one-line errors."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from evals.history import change_of, first_parent_changes, is_code_path, is_test_path
from evals.mine import classify
from evals.statements import Statements, references, resolved_issues
from evals.tasksets import load_set
from tests.helpers.ci import bubblewrap_here
from tests.helpers.cli_process import one_line_error
from tests.helpers.fake_forge import FakeForge
from tests.helpers.mined_fixture import (
    SET,
    clone_bundle,
    mine_command,
    mining_environment,
    run_tasuki,
    tasuki_env,
)
from tests.helpers.stack import git
from worker.forges import GitHubForge

TOKEN = "t0ken-mine"


def test_test_and_code_paths() -> None:
    for path in ("tests/test_x.py", "src/pkg/test/helpers.py", "pkg/x_test.go", "web/a.test.ts", "spec/a_spec.rb",
                 "test_top.py", "lib/conftest.py"):
        assert is_test_path(path), path
    for path in ("src/pkg/x.py", "cmd/main.go", "web/a.ts", "testing_utils.md", "src/contest.py"):
        assert not is_test_path(path), path
    assert is_code_path("src/pkg/x.py")
    assert not is_code_path("CHANGES.rst")
    assert not is_code_path("tests/test_x.py")


def test_classify_keeps_stable_tests_only() -> None:
    before = [{"t::fix": "failed", "t::ok": "passed", "t::flaky": "passed", "t::skip": "skipped"},
              {"t::fix": "failed", "t::ok": "passed", "t::flaky": "failed", "t::skip": "skipped"}]
    after = [{"t::fix": "passed", "t::ok": "passed", "t::flaky": "passed", "t::new": "passed", "t::skip": "skipped"},
             {"t::fix": "passed", "t::ok": "passed", "t::flaky": "passed", "t::new": "passed", "t::skip": "skipped"}]
    verdict = classify(before, after)
    assert (verdict.fail_to_pass, verdict.pass_to_pass, verdict.unstable, verdict.reason) == (
        ["t::fix", "t::new"], ["t::ok"], ["t::flaky"], None)  # t::new: not collected before (an import error)
    flip = classify(before, [{**after[0], "t::fix": "failed"}, after[1]])
    assert flip.fail_to_pass == ["t::new"]
    assert "t::fix" in flip.unstable
    only_flaky = classify([{"t::a": "failed"}, {"t::a": "passed"}], [{"t::a": "passed"}, {"t::a": "passed"}])
    assert only_flaky.reason == "no test fails before the change and passes after it (1 unstable)"
    assert classify([{}, {}], [{}, {}]).reason == "the tests reported no result after the change"


def test_references_and_the_issues_a_pull_request_resolves() -> None:
    assert references("Fix the thing (#12)\n\nsee #3 and #12, not a#4") == [12, 3]
    assert references("Merge pull request #141 from lepture/key-rotate") == [141]
    assert resolved_issues("This fixes #7.\nCloses: #9, resolves #7; mentions #8") == [7, 9]


def _repo(path: Path) -> Path:
    """A repository whose second change fixes f() and adds its test, a third touches docs and tests only, then a merge
    of a branch whose commit fixes g()."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "mod.py").write_text("def f(x):\n    return x - 1\n\n\ndef g(x):\n    return 0\n")
    (path / "test_base.py").write_text("import unittest\n\n\nclass BaseTest(unittest.TestCase):\n"
                                       "    def test_ok(self):\n        self.assertTrue(True)\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    (path / "mod.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return 0\n")
    (path / "test_mod.py").write_text("import unittest\n\nfrom mod import f\n\n\nclass ModTest(unittest.TestCase):\n"
                                      "    def test_fix(self):\n        self.assertEqual(f(1), 2)\n\n"
                                      "    def test_callable(self):\n        self.assertTrue(callable(f))\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Fix f off by two (#5)\n\nf subtracted.")
    (path / "README.md").write_text("docs\n")
    (path / "test_base.py").write_text((path / "test_base.py").read_text() + "\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "docs and a test only")
    git(path, "checkout", "-q", "-b", "topic", "HEAD~1")
    (path / "mod.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_g.py").write_text("def test_g():\n    pass\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "g returns its argument")
    git(path, "checkout", "-q", "main")
    git(path, "merge", "-q", "--no-ff", "-m", "Merge branch 'topic'", "topic")
    return path


def test_first_parent_changes_split_tests_from_code(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "calc")
    changes = list(first_parent_changes(repo))
    assert [c.candidate for c in changes] == [True, False, True]
    merge, docs, fix = changes
    assert (fix.test_files, fix.code_files, fix.other_files) == (("test_mod.py",), ("mod.py",), ())
    assert docs.other_files == ("README.md",)
    assert merge.test_files == ("tests/test_g.py",)
    assert merge.base == docs.commit
    assert merge.message.startswith("Merge branch 'topic'\n\ng returns its argument")
    assert change_of(repo, fix.commit, fix.base).message == "Fix f off by two (#5)\n\nf subtracted."


def test_statement_from_the_issue_the_pull_request_fixes_else_the_message(tmp_path: Path) -> None:
    with FakeForge(tmp_path / "forge", token=TOKEN).serve() as forge:
        forge.add_item("acme", "calc", 5, "Fix f", "This fixes #4.", kind="pull_request")
        forge.add_item("acme", "calc", 4, "f(1) returns 0", "It should return 2.")
        forge.add_item("acme", "calc", 6, "Speed up g", "No issue.", kind="pull_request")
        client = GitHubForge(forge.github_api_url, TOKEN, backoff_s=0.01)
        statements = Statements("acme", "calc", client.read_item)
        assert statements.for_change("Fix f off by two (#5)\n\nbody") == ("f(1) returns 0\n\nIt should return 2.", 5)
        assert statements.for_change("Speed up g (#6)") == ("Speed up g\n\nNo issue.", 6)
        assert statements.for_change("Nothing there (#99)") == ("Nothing there (#99)", 99)  # 404: the message
        assert statements.read is not None
        assert statements.from_forge == 2
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gone = Statements("acme", "calc", GitHubForge(f"http://127.0.0.1:{port}/api/v3", TOKEN, backoff_s=0.01).read_item)
    assert gone.for_change("Fix f (#5)") == ("Fix f (#5)", 5)
    assert gone.read is None  # the forge does not answer: never asked again in this run
    assert gone.forge_error is not None


@pytest.mark.integration
def test_mining_through_the_forge_makes_a_row_with_the_issue_as_its_statement(tmp_path: Path) -> None:
    bubblewrap_here()
    source = _repo(tmp_path / "calc")
    with FakeForge(tmp_path / "forge", token=TOKEN).serve() as forge:
        forge.add_repo("acme", "calc", source)
        forge.add_item("acme", "calc", 5, "Fix f", "Fixes #4", kind="pull_request")
        forge.add_item("acme", "calc", 4, "f(1) returns 0", "It should return 2.")
        env = tasuki_env(tmp_path / "home", {"TASUKI__GITHUB__API_URL": forge.github_api_url, "GITHUB_TOKEN": TOKEN})
        done = run_tasuki(["eval", "mine", "acme/calc", "--parser", "unittest", "--out", str(tmp_path / "set.jsonl"),
                           "--report", str(tmp_path / "report.json")], env)
    assert done.returncode == 0, done.stderr
    loaded = load_set(tmp_path / "set.jsonl")
    assert loaded.errors == []
    (row,) = loaded.rows  # the merge's test names no failing test: dropped
    fix = git(source, "rev-parse", "main~2").strip()
    assert (row.instance_id, row.repo, row.base_commit) == ("acme__calc-5", "acme/calc",
                                                            git(source, "rev-parse", f"{fix}~1").strip())
    assert row.problem_statement == "f(1) returns 0\n\nIt should return 2."
    assert (row.FAIL_TO_PASS, row.PASS_TO_PASS) == (["test_mod.ModTest.test_fix"], ["test_mod.ModTest.test_callable"])
    assert "test_mod.py" in row.test_patch
    assert "mod.py" in row.patch
    assert "test_mod.py" not in row.patch
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["candidates"], len(report["kept"]), report["statements_from_forge"]) == (2, 1, 1)
    # the merge's test is a bare function, which unittest does not run: its runs name no test at all
    assert report["dropped"][0]["reason"] == "the tests reported no result after the change"


@pytest.mark.integration
def test_mining_the_itsdangerous_bundle_reproduces_the_fixture_rows(tmp_path: Path) -> None:
    bubblewrap_here()
    expected = load_set(SET)
    assert expected.errors == []
    assert 3 <= len(expected.rows) <= 6
    source = clone_bundle(tmp_path / "itsdangerous")
    with mining_environment(tmp_path / "wheels") as served:
        done = run_tasuki(mine_command(source, "--out", str(tmp_path / "set.jsonl")),
                          tasuki_env(tmp_path / "home", served))
    assert done.returncode == 0, done.stderr
    mined = load_set(tmp_path / "set.jsonl")
    assert mined.errors == []
    assert [row.instance_id for row in mined.rows] == [row.instance_id for row in expected.rows]
    for got, want in zip(mined.rows, expected.rows, strict=True):
        assert got.FAIL_TO_PASS, got.instance_id
        assert (got.base_commit, got.FAIL_TO_PASS, got.PASS_TO_PASS) == (
            want.base_commit, want.FAIL_TO_PASS, want.PASS_TO_PASS), got.instance_id
        assert (got.patch, got.test_patch) == (want.patch, want.test_patch)


def test_a_bad_row_in_a_set_file_is_named_with_its_line(tmp_path: Path) -> None:
    lines = SET.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["base_commit"]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    loaded = load_set(path)
    assert len(loaded.rows) == len(lines) - 1
    (error,) = loaded.errors
    assert (error.line, error.instance_id, error.reason) == (2, broken["instance_id"], "base_commit: Field required")


def test_a_path_that_is_no_repository_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    env = tasuki_env(tmp_path / "home", {})
    assert "plain: not a git repository" in one_line_error(run_tasuki(["eval", "mine", str(tmp_path / "plain")], env),
                                                           2)
    assert "no such directory" in one_line_error(run_tasuki(["eval", "mine", str(tmp_path / "none")], env), 2)


def test_an_unreachable_forge_repository_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = tasuki_env(tmp_path / "home", {"TASUKI__GITHUB__API_URL": f"http://127.0.0.1:{port}/api/v3"})
    line = one_line_error(run_tasuki(["eval", "mine", "nobody/nothing"], env), 1)
    assert "nobody/nothing: not reachable on" in line
    with FakeForge(tmp_path / "forge", token=TOKEN).serve() as forge:
        env = tasuki_env(tmp_path / "home", {"TASUKI__GITHUB__API_URL": forge.github_api_url, "GITHUB_TOKEN": TOKEN})
        missing = one_line_error(run_tasuki(["eval", "mine", "nobody/nothing"], env), 1)
    assert "HTTP 404" in missing


def test_since_walks_only_the_changes_after_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "calc")
    since = git(repo, "rev-parse", "main~1").strip()
    assert [c.commit for c in first_parent_changes(repo, since=since)] == [git(repo, "rev-parse", "main").strip()]


FLAKY_TEST = """import os
import unittest
from pathlib import Path

from mod import f


class ModTest(unittest.TestCase):
    def test_fix(self):
        self.assertEqual(f(1), 2)

    def test_env(self):
        self.assertTrue(Path("made-by-setup.txt").exists())

    def test_flaky(self):
        counter = Path(os.environ["HOME"]) / "runs"
        runs = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(runs + 1))
        self.assertEqual(runs % 2, 0)
"""


@pytest.mark.integration
def test_the_declared_environment_is_built_once_and_an_unstable_test_is_left_out(tmp_path: Path) -> None:
    bubblewrap_here()
    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".tasuki").mkdir()
    (repo / ".tasuki" / "setup.sh").write_text('echo made > made-by-setup.txt\necho x >> "$HOME/setups"\n')
    (repo / "mod.py").write_text("def f(x):\n    return x - 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    for n in (1, 2):  # two changes: the second's tests still see what the setup made for the first
        (repo / "mod.py").write_text(f"def f(x):\n    return x + {n}\n")
        (repo / f"test_mod{n}.py").write_text(FLAKY_TEST.replace("f(1), 2", f"f(1), {1 + n}"))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"f adds {n}")
    env = tasuki_env(tmp_path / "home", {})
    done = run_tasuki(["eval", "mine", str(repo), "--parser", "unittest", "--out", str(tmp_path / "set.jsonl"),
                       "--report", str(tmp_path / "report.json")], env)
    assert done.returncode == 0, done.stderr
    rows = load_set(tmp_path / "set.jsonl").rows
    assert [(r.repo, r.FAIL_TO_PASS, r.PASS_TO_PASS) for r in rows] == [
        ("local/calc", [f"test_mod{n}.ModTest.test_fix"], [f"test_mod{n}.ModTest.test_env"]) for n in (2, 1)]
    assert rows[0].setup is None  # the repository's own declaration: not the row's to carry
    report = json.loads((tmp_path / "report.json").read_text())
    assert [entry["unstable"] for entry in report["kept"]] == [[f"test_mod{n}.ModTest.test_flaky"] for n in (2, 1)]
    assert report["setup"]["built"] is True
    assert report["setup"]["created"] == ["made-by-setup.txt"]


@pytest.mark.integration
def test_a_setup_that_fails_stops_the_mining_with_one_line(tmp_path: Path) -> None:
    bubblewrap_here()
    repo = _repo(tmp_path / "calc")
    env = tasuki_env(tmp_path / "home", {})
    line = one_line_error(run_tasuki(["eval", "mine", str(repo), "--setup", "echo no compiler here >&2; exit 3"], env),
                          2)
    assert "the environment's setup failed (exit code 3): no compiler here" in line
