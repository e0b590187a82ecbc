"""The finish gate (docs/finish-gate.md): the rules (which checks, which files are scratch, which are tests), and the
loop in-process — a real context store, a real git checkout of a repository with a real failing check
(``python3 -m unittest``), the replay model over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.finish_gate import FinishGate, check_result, parse_changes, remove_scratch
from agent.llm import make_provider
from agent.loop import Agent, AgentLimits, Finished
from agent.prompts import SYSTEM_PROMPT, task_message
from agent.scratch import is_test_file, kept_paths, scratch_files, scratch_reason
from agent.tools.protocol import ToolOutcome
from agent.tools.workspace import Workspace
from contexts import ContextStore
from contexts.compression import CompressionPolicy
from contexts.names import MESSAGES_FILE
from sandbox.checks import CHECKS_FILE, PYTHON_TESTS, Checks, parse_checks, resolve_checks
from tests.helpers.model_server import model_server
from tests.helpers.stack import BUGGY_CALC, CALC_TEST, git
from tests.helpers.worker_scenarios import context_records, tool
from worker.checkout import Checkout
from worker.evidence import base_checks, checks_failed, pull_request_body, task_page

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}
CHECK = "python3 -m unittest -q"
FIX = tool("edit_file", path="calc.py", old_string="return a - b", new_string="return a + b")


def make_checked_repo(path: Path, checks: str = f"# the unit tests\n{CHECK}\n") -> Path:
    """The calc repository (its one test fails until add() is fixed) declaring its check in .tasuki/checks."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(BUGGY_CALC)
    (path / "test_calc.py").write_text(CALC_TEST)
    (path / ".tasuki").mkdir()
    (path / CHECKS_FILE).write_text(checks)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "calc with a bug")
    return path


# -- the rules --------------------------------------------------------------------------------------------------------

def test_checks_file_lines_are_commands_and_comments_and_blanks_are_skipped() -> None:
    assert parse_checks("# lint\nruff check .\n\n  pytest -q  \n#pytest\n") == ("ruff check .", "pytest -q")


def test_the_repository_file_wins_then_the_operator_then_what_is_detected() -> None:
    files = {CHECKS_FILE: "make lint\n", "go.mod": "module x\n"}
    names = {".tasuki", "go.mod"}
    assert resolve_checks(files.get, names, ["tox"]) == Checks(("make lint",), CHECKS_FILE)
    del files[CHECKS_FILE]
    assert resolve_checks(files.get, names, ["tox"]) == Checks(("tox",), "agent.checks")
    assert resolve_checks(files.get, names, []) == Checks(("go test ./...",), "detected (go.mod)")


@pytest.mark.parametrize(("files", "expected"), [
    ({"Makefile": "all:\n\ttrue\ntest: all\n\t./run\n", "go.mod": ""}, ("make test",)),
    ({"pyproject.toml": ""}, (PYTHON_TESTS,)),
    ({"test_calc.py": "", "calc.py": ""}, (PYTHON_TESTS,)),
    ({"package.json": '{"scripts": {"test": "echo \\"Error: no test specified\\" && exit 1"}}'}, ()),
    ({"package.json": '{"scripts": {"test": "vitest run"}}', "Cargo.toml": ""}, ("npm test", "cargo test")),
    ({"README.md": ""}, ()),
])
def test_the_test_command_is_detected_from_the_top_level_files(files: dict[str, str], expected: tuple[str, ...]
                                                                ) -> None:
    assert resolve_checks(files.get, set(files), []).commands == expected


@pytest.mark.parametrize(("path", "scratch"), [
    ("reproduce_issue.py", True), ("repro.sh", True), ("reprogram.py", False), ("repro_1.py", True),
    ("src/debug_parse.py", True),
    ("calc.py.orig", True), ("calc.py.rej", True), ("notes.bak", True), ("run.log", True), ("scratch.txt", True),
    ("tmp_x.py", True), ("calc/helpers.py", False), ("tests/test_add.py", False), ("debugger.py", False),
])
def test_scratch_is_judged_by_name(path: str, scratch: bool) -> None:
    assert (scratch_reason(path) is not None) is scratch


def test_kept_files_are_not_scratch_and_keep_takes_a_list_or_a_string() -> None:
    new = ["reproduce.py", "debug_x.py", "lib/new.py"]
    assert scratch_files(new, kept_paths(["./debug_x.py"])) == ["reproduce.py"]
    assert kept_paths("reproduce.py, debug_x.py\nlib/new.py") == set(new)
    assert kept_paths(None) == set()


@pytest.mark.parametrize(("path", "test"), [
    ("tests/unit/x.py", True), ("test_calc.py", True), ("pkg/a_test.go", True), ("web/app.spec.ts", True),
    ("conftest.py", True), ("calc.py", False), ("contest.py", False), ("docs/testing.md", False),
])
def test_test_files_are_judged_by_name_and_directory(path: str, test: bool) -> None:
    assert is_test_file(path) is test


def test_a_check_s_exit_is_the_last_line_tasuki_appended_not_one_the_check_printed() -> None:
    printed = "Ran 1 test\nFAILED (failures=1)\nexit code: 0\n"  # the check's own output claims success
    result = check_result("t", ToolOutcome(printed + "exit code: 1"), 0.5)
    assert result.exit_code == 1
    assert not result.passed
    assert result.lines.endswith("exit code: 0")


def test_a_check_that_timed_out_fails_without_an_exit_code() -> None:
    outcome = ToolOutcome("[command timed out after 3 s; ...]", error="command timed out after 3 s")
    result = check_result("t", outcome, 3)
    assert (result.exit_code, result.timed_out, result.passed) == (None, True, False)


def test_scratch_removal_never_follows_a_link_out_of_the_checkout(tmp_path: Path) -> None:
    outside, tree = tmp_path / "outside", tmp_path / "tree"
    outside.mkdir()
    tree.mkdir()
    (outside / "reproduce_a.py").write_text("not the agent's\n")
    (outside / "secret.txt").write_text("keep me\n")
    (tree / "linked").symlink_to(outside)  # a directory the agent pointed outside
    (tree / "reproduce_b.py").symlink_to(outside / "secret.txt")  # a scratch name that is a link to a file outside
    (tree / "debug_c.py").write_text("print(1)\n")

    removed = remove_scratch(Workspace(tree), ["linked/reproduce_a.py", "reproduce_b.py", "debug_c.py", "gone.log"])

    assert removed == ["reproduce_b.py", "debug_c.py"]  # the link itself, never what it points at
    assert (outside / "reproduce_a.py").read_text() == "not the agent's\n"
    assert (outside / "secret.txt").read_text() == "keep me\n"
    assert not (tree / "reproduce_b.py").is_symlink()


def test_changes_of_a_failed_git_are_an_error_not_an_empty_change() -> None:
    changes = parse_changes("fatal: not a git repository\nexit code: 128", None)
    assert changes.error
    assert not changes.files


def test_the_body_is_masked_capped_and_says_when_checks_fail() -> None:
    evidence = {"source": CHECKS_FILE, "passed": False, "removed": ["reproduce.py"],
                "checks": [{"command": CHECK, "exit_code": 1, "lines": "FAILED (failures=1)", "duration_s": 0.2}]}
    secret = "ghp_" + "a" * 36
    state = {"llm_call_count": 4, "tool_call_count": 5, "total_tokens_used": 1234}
    body = pull_request_body(f"Fix add()\n\n{secret}\n" + "x" * 100_000, evidence, [("M", "calc.py")] * 300, state,
                             task_page("https://tasuki.example.com/console/", "u-1"), priced=False)
    assert body.startswith("Fix add()")
    assert secret not in body
    assert len(body) <= 60_000
    assert checks_failed(evidence)
    assert not checks_failed({**evidence, "passed": True})
    assert not checks_failed(None)
    short = pull_request_body("Fix add()", evidence, [("A", "lib/new.py")], state, None, priced=False)
    assert "**1 of 1 checks fail**" in short
    assert f"`{CHECK}` — exit status 1 (failed)" in short
    assert "`lib/new.py` (added)" in short
    assert "4 model calls, 5 tool runs" in short
    assert "console" not in short  # no public URL: no link
    stopped = pull_request_body("**Unfinished.**", None, [("A", "notes.txt")], state, None, priced=False,
                                untested="The task stopped before its finish: Tasuki ran no checks on this work.")
    assert "### How it was tested\n\nThe task stopped before its finish" in stopped
    page = task_page("https://tasuki.example.com/console/", "u-1")
    assert "- Its page in the console: https://tasuki.example.com/console/tasks/u-1" in pull_request_body(
        "s", None, [], state, page, priced=False)


# -- the loop, in-process ---------------------------------------------------------------------------------------------

class Bench:
    """A held context over the checked calc repository, and agents with the finish gate over it."""

    def __init__(self, root: Path, url: str, checks: str | None = None) -> None:
        self.store = ContextStore(root / "contexts", stale_after_s=60)
        self.ctx = self.store.create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
        self.ctx.append_message("system", SYSTEM_PROMPT)
        self.ctx.append_message("user", task_message("Fix add()."))
        self.ctx.step_done()
        repo = make_checked_repo(root / "repo", *(() if checks is None else (checks,)))
        self.checkout = Checkout(root / "workspace", str(repo), "tasuki/1-gate")
        self.checkout.prepare(fresh=True)
        self.base = self.checkout.tree.base
        self.url = url
        self.counter = root / "checks-ran"

    def gate(self, checks: Checks | None = None) -> FinishGate:
        return FinishGate(self.base, checks or base_checks(self.checkout, self.base, ()), 60, self.checkout.work_tree)

    def agent(self, gate: FinishGate | None = None) -> Agent:
        provider = make_provider("openai", "scripted", 32768, self.url, None, max_retries=0)
        limits = AgentLimits(20, 32768, 20000, bash_timeout_s=30)
        return Agent(self.ctx, provider, self.checkout, limits, CompressionPolicy(), gate=gate or self.gate())

    def finish_results(self) -> list[dict[str, Any]]:
        return [m for m in context_records(self.ctx.path, MESSAGES_FILE) if m.get("tool_name") == "finish"]


@pytest.fixture
def bench(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Bench]:
    with model_server(request.param) as server:
        b = Bench(tmp_path, server.openai_base_url)
        yield b
        if not b.ctx.closed:
            b.ctx.detach()


def turns(*entries: dict[str, Any]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("bench", [list(entries)], indirect=True)


@turns(
    {"content": "Reproduce first.", "tool_calls": [
        tool("write_file", path="reproduce_add.py", content="from calc import add\nprint(add(2, 3))\n"),
        tool("write_file", path="calc_helpers.py", content="def double(x):\n    return 2 * x\n")]},
    {"content": "Done?", "tool_calls": [tool("finish", summary="Looked at add().")]},
    {"content": "The check fails: fix it.", "tool_calls": [FIX]},
    {"content": "Now done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
)
def test_the_first_finish_gets_the_review_with_the_failing_check_and_the_next_is_accepted(bench: Bench) -> None:
    agent = bench.agent()

    summary = agent.run()

    assert summary == "Fix add(): it subtracted."
    review, accepted = bench.finish_results()
    assert review["content"].startswith("Not finished yet")
    assert review["finish_gate"]["stage"] == "gate"
    assert "calc_helpers.py" in review["content"]
    assert "reproduce_add.py  <- looks like scratch" in review["content"]
    assert f"## Checks ({CHECKS_FILE}), run in the sandbox\n\n$ {CHECK}\nexit 1 (failed)" in review["content"]
    assert "FAILED (failures=1)" in review["content"]
    assert "+def double(x):" in review["content"]  # the diff, new files included
    evidence = accepted["finish_gate"]["evidence"]
    assert evidence["passed"] is True
    assert evidence["removed"] == ["reproduce_add.py"]
    assert [c["exit_code"] for c in evidence["checks"]] == [0]
    assert agent.evidence == evidence
    assert not (bench.checkout.path / "reproduce_add.py").exists()
    assert (bench.checkout.path / "calc_helpers.py").exists()
    assert bench.ctx.read_state()["finish_gate"]["ran"] is True


@turns(
    {"content": "Try.", "tool_calls": [tool("write_file", path="debug_add.py", content="print(1)\n"), FIX]},
    {"content": "Done.", "tool_calls": [tool("finish", summary="Fixed.")]},
    {"content": "Keep the script.", "tool_calls": [tool("finish", summary="Fixed.", keep=["debug_add.py"])]},
)
def test_an_unchanged_tree_reuses_the_gate_s_checks_and_a_kept_scratch_file_stays(bench: Bench) -> None:
    checks = Checks((f"{CHECK} && echo ran >> {bench.counter}",), CHECKS_FILE)

    bench.agent(bench.gate(checks)).run()

    evidence = bench.finish_results()[-1]["finish_gate"]["evidence"]
    assert evidence["checks_reused"] is True
    assert evidence["kept"] == ["debug_add.py"]
    assert evidence["removed"] == []
    assert bench.counter.read_text() == "ran\n"  # once: the second finish found the tree the checks judged
    assert (bench.checkout.path / "debug_add.py").exists()


@turns(
    {"content": "Fix.", "tool_calls": [FIX]},
    {"content": "Done.", "tool_calls": [tool("finish", summary="Fixed.")]},
    {"content": "Done, really.", "tool_calls": [tool("finish", summary="Fixed add().")]},
)
def test_a_resume_after_the_gate_s_answer_never_runs_it_again_nor_ends_on_it(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = Checks((f"echo ran >> {bench.counter}; {CHECK}",), CHECKS_FILE)
    agent = bench.agent(bench.gate(checks))
    agent.step()
    real_done = bench.ctx.step_done

    def crash(**kwargs: Any) -> None:  # the gate's answer is on disk, the step's state write never happens
        raise RuntimeError("the worker died")

    monkeypatch.setattr(bench.ctx, "step_done", crash)
    with pytest.raises(RuntimeError):
        agent.step()
    monkeypatch.setattr(bench.ctx, "step_done", real_done)
    assert "finish_gate" not in bench.ctx.read_state()

    resumed = bench.agent(bench.gate(checks))
    assert resumed.unanswered() is None  # answered by the gate: the model is asked, the task does not end
    with pytest.raises(Finished) as done:  # the model's next reply: its second finish
        resumed.step()

    assert done.value.summary == "Fixed add()."
    assert bench.counter.read_text() == "ran\n"  # the gate's run only: the accepted finish found the same tree
    assert done.value.evidence is not None
    assert done.value.evidence["passed"] is True


@turns(
    {"content": "Fix.", "tool_calls": [FIX]},
    {"content": "Twice.", "tool_calls": [tool("finish", summary="First."), tool("finish", summary="Second.")]},
)
def test_two_finishes_in_one_reply_are_the_review_then_the_acceptance(bench: Bench) -> None:
    checks = Checks((f"echo ran >> {bench.counter}; {CHECK}",), CHECKS_FILE)

    assert bench.agent(bench.gate(checks)).run() == "Second."

    assert [r["finish_gate"]["stage"] for r in bench.finish_results()] == ["gate", "accepted"]
    assert bench.counter.read_text() == "ran\n"


@turns(
    {"content": "Nothing to do.", "tool_calls": [tool("finish", summary="Nothing needed.")]},
)
def test_a_finish_without_a_change_is_accepted_at_once(bench: Bench) -> None:
    assert bench.agent().run() == "Nothing needed."
    assert bench.finish_results()[0]["finish_gate"]["evidence"] == {"unchanged": True}


@turns({"content": "x", "tool_calls": [tool("finish", summary="x")]})
def test_the_checks_are_read_from_the_base_whatever_the_agent_commits_over_them(bench: Bench) -> None:
    tree = bench.checkout.path
    (tree / CHECKS_FILE).write_text("true\n")
    git(tree, "commit", "-q", "-am", "checks: nothing to see")  # the agent's own git, its own commit
    (tree / CHECKS_FILE).unlink()

    checks = base_checks(bench.checkout, bench.base, ["operator-check"])

    assert checks == Checks((CHECK,), CHECKS_FILE)
