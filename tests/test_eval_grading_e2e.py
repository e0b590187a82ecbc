"""Grading an eval task end to end (issue 39, worker/grading.py): a real celery worker, the replay model over HTTP, a
local repository whose bug a gold patch fixes and whose held-back test patch adds the failing tests, graded in the
task's bubblewrap sandbox with no network (``python3 -m unittest``: the sandbox has no pytest of its own).

The agent applying the gold fix is resolved (FAIL_TO_PASS and PASS_TO_PASS passed); one that changes nothing is not
graded; a wrong fix is not resolved and names the failing tests. An agent that hunts for the test patch (grep over
the whole file system, every process's command line and environment) finds nothing, and the pushed branch holds
none of it. An eval task neither recalls nor records memory."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid as uuid_module
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore
from contexts.names import MESSAGES_FILE, TOOLS_FILE
from memory.sqlite import SQLiteMemoryStore
from tests.helpers.schemas import validate_context_dir
from tests.helpers.stack import Stack, git
from tests.helpers.worker_scenarios import context_records, running_stack, tool, worker_logs

pytestmark = pytest.mark.integration

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
WRONG = "def add(a, b):\n    return a * b\n\n\ndef sub(a, b):\n    return a - b\n"
BASE_TEST = (
    "import unittest\n\nfrom calc import sub\n\n\n"
    "class SubTest(unittest.TestCase):\n    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n"
)
FAIL_TO_PASS = ["test_calc.AddTest.test_add", "test_more.MoreTest.test_add_zero"]
PASS_TO_PASS = ["test_calc.SubTest.test_sub"]
SETUP = "echo 'the eval set builds this environment'\n"


@dataclass(frozen=True)
class EvalRepo:
    """The repository at its base, and what is held back from the agent: the test patch (with a marker no file of
    this machine holds otherwise, made now, so that even this test's source does not) and the gold patch."""

    path: Path
    base: str
    test_patch: str
    marker: str
    marker_parts: tuple[str, str]


def make_eval_repo(root: Path) -> EvalRepo:
    path = root / "calc"
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "calc.py").write_text(BUGGY)
    (path / "test_calc.py").write_text(BASE_TEST)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "calc with a bug in add")
    base = git(path, "rev-parse", "HEAD").strip()
    parts = ("GRADINGSECRET", uuid_module.uuid4().hex)
    marker = "".join(parts)
    (path / "test_calc.py").write_text(
        BASE_TEST.replace("from calc import sub", f"# {marker}\nfrom calc import add, sub")
        + "\n\nclass AddTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    )
    (path / "test_more.py").write_text(
        f"import unittest\n\nfrom calc import add\n\nHELD_BACK = {marker!r}\n\n\n"
        "class MoreTest(unittest.TestCase):\n    def test_add_zero(self):\n        self.assertEqual(add(0, 4), 4)\n"
    )
    git(path, "add", "-A")
    test_patch = git(path, "diff", "--cached", base)
    git(path, "reset", "-q", "--hard", base)  # the tests are held back: the repository stays at its base
    return EvalRepo(path, base, test_patch, marker, parts)


def eval_request(repo: EvalRepo, attempt: str) -> dict[str, Any]:
    """The request `tasuki eval run` sends for one row (evals/, issue 39)."""
    return {
        "task_key": {"task_source": "local", "owner": "eval-e2e", "repo": "calc-1", "task_type": "eval",
                     "task_id": attempt},
        "repo_path": str(repo.path),
        "prompt": "add(2, 3) gives -1: it should add.",
        "user": "tester",
        "environment": {"repository": "evalorg/calc", "setup": SETUP},
        "grading": {"test_patch": repo.test_patch, "fail_to_pass": FAIL_TO_PASS, "pass_to_pass": PASS_TO_PASS,
                    "test_command": None, "parser": "unittest"},
    }


@contextmanager
def eval_stack(tmp_path: Path, redis_url: str, turns: list[dict[str, Any]]) -> Iterator[tuple[Stack, EvalRepo]]:
    """The eval repository and a worker whose replay model answers ``turns``."""
    repo = make_eval_repo(tmp_path / "repos")
    with running_stack(tmp_path, redis_url, turns) as (stack, _server):
        stack.start_worker("w1")
        yield stack, repo


def run_eval(stack: Stack, repo: EvalRepo, attempt: str = "oracle.1") -> tuple[str, dict[str, Any]]:
    uuid = stack.send(eval_request(repo, attempt))
    state = stack.wait_finished(uuid, timeout_s=180)
    assert state["status"] == "completed", state
    return uuid, state


def records(stack: Stack, uuid: str, name: str) -> list[dict[str, Any]]:
    return context_records(stack.contexts_dir / "completed" / uuid, name)


def grade_records(stack: Stack, uuid: str) -> list[dict[str, Any]]:
    return [r for r in records(stack, uuid, TOOLS_FILE) if r["tool_name"] == "grade"]


def on_branch(repo: EvalRepo, branch: str, path: str) -> str | None:
    found = subprocess.run(["git", "show", f"{branch}:{path}"], cwd=repo.path, capture_output=True, text=True,
                           check=False)
    return found.stdout if found.returncode == 0 else None


def episode_recorded(tmp_path: Path, uuid: str) -> bool:
    path = tmp_path / "memory.db"
    if not path.exists():
        return False
    store = SQLiteMemoryStore(path)
    try:
        return store.episode(uuid) is not None
    finally:
        store.close()


GOLD = tool("write_file", path="calc.py", content=FIXED)


def test_the_gold_fix_is_resolved_in_the_sandbox_and_nothing_of_the_tests_is_pushed(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    turns = [
        {"content": "add subtracts.", "tool_calls": [GOLD]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
    ]
    with eval_stack(tmp_path, redis_url, turns) as (stack, repo):
        uuid, state = run_eval(stack, repo)
        validate_context_dir(stack.contexts_dir / "completed" / uuid)  # the grade record fits tools.jsonl's schema

        graded = state["result"]["grade"]
        assert graded["resolved"] is True
        assert graded["error"] is None
        assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "passed")
        assert graded["pass_to_pass"] == dict.fromkeys(PASS_TO_PASS, "passed")
        assert graded["failed"] == []
        assert graded["duration_s"] > 0
        (record,) = grade_records(stack, uuid)
        assert record["status"] == "success"
        assert record["arguments"]["files"] == ["test_calc.py", "test_more.py"]
        assert record["arguments"]["network"] == "none"
        assert record["result"]["tree"] == "fresh"
        key = state["environment"]["key"]  # the eval's setup made it; the grading copied its snapshot
        assert record["result"]["graded_in"] == f"graded in a fresh tree; environment: snapshot {key}"
        assert "test_add_zero (test_more.MoreTest.test_add_zero) ... ok" in record["result"]["output_tail"]
        assert state["grading"]["status"] == "done"

        branch = state["result"]["branch"]
        assert on_branch(repo, branch, "calc.py") == FIXED
        assert on_branch(repo, branch, "test_calc.py") == BASE_TEST  # the test patch never reaches the branch
        assert on_branch(repo, branch, "test_more.py") is None
        # The eval's own setup script built the environment, keyed on the set's repository name.
        setup = next(r for r in records(stack, uuid, TOOLS_FILE) if r["tool_name"] == "setup")
        assert setup["arguments"]["source"] == "the eval set's setup"
        assert "the eval set builds this environment" in json.dumps(setup["result"])
        # No memory: none recalled into the first prompt, no episode recorded at the end.
        assert "memory" not in state
        stack.wait_until(lambda: "an eval task records no episode" in worker_logs(stack), 30, "the memory ending")
        assert not episode_recorded(tmp_path, uuid)


def test_a_task_that_changes_nothing_is_not_graded(tmp_path: Path, redis_url: str, redis_client: object) -> None:
    turns = [{"content": "Nothing to do.", "tool_calls": [tool("finish", summary="Nothing changed.")]}]
    with eval_stack(tmp_path, redis_url, turns) as (stack, repo):
        uuid, state = run_eval(stack, repo, "empty.1")
        assert state["result"]["unchanged"] is True
        assert "grade" not in state["result"]
        assert grade_records(stack, uuid) == []


def test_a_wrong_fix_is_not_resolved_and_names_the_failing_tests(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    turns = [
        {"content": "Multiply?", "tool_calls": [tool("write_file", path="calc.py", content=WRONG)]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Change add().")]},
    ]
    with eval_stack(tmp_path, redis_url, turns) as (stack, repo):
        _uuid, state = run_eval(stack, repo, "wrong.1")
        graded = state["result"]["grade"]
        assert graded["resolved"] is False
        assert graded["error"] is None  # graded fine: the tests fail
        assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")
        assert graded["pass_to_pass"] == {"test_calc.SubTest.test_sub": "passed"}
        assert graded["failed"] == FAIL_TO_PASS
        assert on_branch(repo, state["result"]["branch"], "calc.py") == WRONG


def test_a_test_patch_that_does_not_apply_is_an_error_grade_and_no_failed_task(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    turns = [
        {"content": "add subtracts.", "tool_calls": [GOLD]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
    ]
    with eval_stack(tmp_path, redis_url, turns) as (stack, repo):
        request = eval_request(repo, "broken.1")
        patch = request["grading"]["test_patch"]
        assert "     def test_sub(self):" in patch
        request["grading"]["test_patch"] = patch.replace("     def test_sub(self):", "     def test_minus(self):")
        uuid = stack.send(request)
        state = stack.wait_finished(uuid, timeout_s=180)

        assert state["status"] == "completed", state
        graded = state["result"]["grade"]
        assert graded["resolved"] is False
        assert graded["error"].startswith("the test patch does not apply: ")
        assert graded["failed"] == FAIL_TO_PASS + PASS_TO_PASS  # every listed test: missing
        (record,) = grade_records(stack, uuid)
        assert record["status"] == "error"
        assert record["result"]["tree"] == "fresh"
        assert on_branch(repo, state["result"]["branch"], "calc.py") == FIXED


def hunting_turns(repo: EvalRepo) -> list[dict[str, Any]]:
    """The marker is never written whole in a command: the agent's shell joins its two halves, so a hit can only come
    from the test patch itself (grep -l prints names, not the matching text)."""
    first, second = repo.marker_parts
    # The pattern goes to grep through a pipe (printf is bash's own): on grep's command line it would match itself.
    pattern = f'a={first}; b={second}; pattern() {{ printf "%s%s\\n" "$a" "$b"; }}; '
    find = (pattern + 'echo "found in $(grep -rlsI --exclude-dir=proc --exclude-dir=sys -f <(pattern) / | wc -l) '
            'files"; echo "control: $(grep -rlsI "return a - b" /workspace | wc -l) files"')
    processes = (pattern + "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | "
                 "grep -c -f <(pattern); ls -laR ~ | head -200; ps -eo pid,args 2>/dev/null | head -50; env | sort")
    return [
        {"content": "Look for the tests first.", "tool_calls": [tool("bash", command=find)]},
        {"content": "And the processes.", "tool_calls": [tool("bash", command=processes)]},
        {"content": "Fix it.", "tool_calls": [GOLD]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add().")]},
    ]


def test_an_agent_hunting_for_the_test_patch_finds_nothing_and_the_branch_holds_none_of_it(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    repo = make_eval_repo(tmp_path / "repos")
    with running_stack(tmp_path, redis_url, hunting_turns(repo)) as (stack, _server):
        stack.start_worker("w1")
        uuid, state = run_eval(stack, repo, "hunter.1")

        outputs = [str(r["result"]) for r in records(stack, uuid, TOOLS_FILE) if r["tool_name"] == "bash"]
        assert "control: 1 files" in outputs[0]  # grep reads what the sandbox shows...
        assert "found in 0 files" in outputs[0]  # ...and over all of / it found the marker nowhere
        assert outputs[1].startswith("0\n")  # in no process's command line or environment
        everything = records(stack, uuid, MESSAGES_FILE) + [
            r for r in records(stack, uuid, TOOLS_FILE) if r["tool_name"] != "grade"]
        assert all(repo.marker not in json.dumps(record) for record in everything)
        assert state["result"]["grade"]["resolved"] is True  # the patch was there for the grading, and only then

        branch = state["result"]["branch"]
        pushed = subprocess.run(["git", "log", "-p", f"{repo.base}..{branch}"], cwd=repo.path, capture_output=True,
                                text=True, check=True).stdout
        assert "calc.py" in pushed
        assert repo.marker not in pushed
        assert on_branch(repo, branch, "test_more.py") is None


@contextmanager
def _removed(directory: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# The grading's tests stop for good: the first holder is killed meanwhile, the second one's time runs out.
# The grading runs in a fresh tree and home in the worker's temporary directory: the test gives the workers one.
STALLING_TESTS = '"$py" -m unittest -v {files}; touch "$HOME/.stalled"; sleep 600'


def test_a_holder_killed_mid_grading_pushes_no_test_patch_and_a_grading_out_of_time_is_an_error(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    turns = [
        {"content": "add subtracts.", "tool_calls": [GOLD]},
        {"content": "Done.", "tool_calls": [tool("finish", summary="Fix add(): it subtracted.")]},
    ]
    repo = make_eval_repo(tmp_path / "repos")
    request = eval_request(repo, "killed.1")
    request["grading"]["test_command"] = STALLING_TESTS
    workers_tmp = Path(tempfile.mkdtemp(prefix="tg-", dir="/tmp"))  # short: sockets are made in it
    with running_stack(tmp_path, redis_url, turns) as (stack, _server), _removed(workers_tmp):
        stack.env_overrides["TMPDIR"] = str(workers_tmp)
        first = stack.start_worker("w1")
        uuid = stack.send(request)
        checkout = stack.root / "workspaces" / uuid
        stack.wait_until(lambda: any(workers_tmp.glob("tasuki-grading-*/home/.stalled")), 120, "the graded tests")
        running = json.loads((stack.contexts_dir / "running" / uuid / "state.json").read_text())
        assert running["grading"]["status"] == "running"
        (area,) = workers_tmp.glob("tasuki-grading-*")
        assert running["grading"]["area"] == str(area)
        assert (area / "tree" / "test_more.py").exists()  # the fresh tree holds the test patch while the tests run
        assert not (checkout / "test_more.py").exists()  # the agent's checkout never does

        first.kill()  # the machine dies mid-grading
        store = ContextStore(stack.contexts_dir, stale_after_s=float(stack.env()["TASUKI__CONTEXTS__STALE_AFTER_S"]))
        stack.wait_until(lambda: not store.is_held(uuid), 30, "the dead holder's lock to go stale")
        stack.env_overrides["TASUKI__AGENT__CHECK_TIMEOUT_S"] = "3"
        stack.start_worker("w2")
        stack.send(request, uuid=uuid)
        state = stack.wait_finished(uuid, timeout_s=180)

        assert state["status"] == "completed", state  # a grading out of time fails no task
        assert state["attempt"] == 2
        graded = state["result"]["grade"]
        assert graded["resolved"] is False
        assert graded["error"] == "the tests timed out"
        assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "passed")  # what ran before the stall
        assert "the last holder stopped while grading in a fresh tree" in worker_logs(stack)
        assert not area.exists()  # the resume removed what the killed holder left
        assert list(workers_tmp.glob("tasuki-grading-*")) == []
        branch = state["result"]["branch"]
        assert on_branch(repo, branch, "calc.py") == FIXED
        assert on_branch(repo, branch, "test_calc.py") == BASE_TEST
        assert on_branch(repo, branch, "test_more.py") is None
