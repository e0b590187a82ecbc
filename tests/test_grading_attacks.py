"""The grading of an eval task (worker/grading.py, issue 39) against an agent that prepared its home and checkout.

The worker's own git writes the commit's tree, the test patch laid in, into a fresh directory of its own on the host
(as root in CI), beside a fresh home holding the environment its setup left (a snapshot's copy) or nothing; the tests
run there in the sandbox, never in the agent's checkout or home. Each test here is an attacker with the real ``bash``
tool in the real sandbox: before it finishes it leaves links, odd files and modes in its home and checkout, commits
links where the test patch's files go, or leaves code, interpreters and settings that would pass the graded tests;
then the worker commits and grades the work through :func:`grade_work`, with real git and real bubblewrap. A canary
directory outside the task's trees, which the attacker names by its host path, must stay as it was (nothing written,
removed or read into the grade), no program of the attacker's may run on the host, and the grade is honest or a clean
error grade. The grading's own directories (in the worker's temporary directory) are gone afterwards.

Before the staging directory moved out of the home, a mode-000 ``~/.tasuki`` made an error grade of honest work, the
worker's git ran a filter driver its user's config defines (git-lfs's) on the attributes the agent committed, and a
test patch naming ``../`` left ``state.json`` saying the tree held the patch (a resume would fail the task). Before the
tests ran in a fresh tree and home, an ignored ``.venv/bin/python``, a ``BASH_ENV`` in the env files and a
``usercustomize.py`` in the home each graded work that fixes nothing as resolved.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import tempfile
import uuid as uuid_module
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contexts import Context, ContextStore
from contexts.names import TOOLS_FILE
from tests.helpers import hostile_agent
from tests.helpers.ci import bubblewrap_here
from tests.helpers.sandbox_users import SANDBOX_USER, ensure_user, need_root
from tests.helpers.stack import FIXED_CALC, git, make_buggy_repo
from worker.checkout import Checkout
from worker.environment import TaskEnvironment
from worker.grading import grade_work, recover
from worker.grading_tree import AREA_PREFIX
from worker.settings_models import Settings
from worker.workcopy import GitCache

TASK_KEY = {"task_source": "local", "owner": "local", "repo": "calc", "task_type": "eval", "task_id": "1"}
BRANCH = "tasuki/1-grading-attacks"
HELD_TEST = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class HeldTest(unittest.TestCase):\n    def test_add_more(self):\n        self.assertEqual(add(4, 5), 9)\n"
)
FAIL_TO_PASS = ["test_held.HeldTest.test_add_more"]
FIX = f"printf %s {shlex.quote(FIXED_CALC)} > calc.py"


@dataclass
class Task:
    """An eval task's checkout and home on a local remote, its held-back test patch, and the host-only canary."""

    base: Path
    checkout: Checkout
    ctx: Context
    remote_base: str
    test_patch: str
    canary: Path
    secret: str
    settings: Settings = field(default_factory=Settings)

    @property
    def home(self) -> Path:
        return self.checkout.home

    def agent(self, *commands: str) -> list[str]:
        """``commands`` through the real bash tool in the task's sandbox (a root worker's: as its sandbox user)."""
        outputs = hostile_agent.run(self.checkout.path, self.checkout.home, commands)
        assert all("exit code: 0" in output for output in outputs), outputs
        return outputs

    def grade(self, test_patch: str | None = None, files: list[str] | None = None, *,
              commit: bool = True) -> dict[str, Any]:
        """The worker's ending of an eval task: commit the work, then grade it."""
        if commit:
            self.checkout.commit("tasuki: the work")
        request = {"test_patch": self.test_patch if test_patch is None else test_patch,
                   "fail_to_pass": FAIL_TO_PASS if files is None else files, "parser": "unittest", "timeout_s": 60}
        return grade_work(self.ctx, self.checkout, request, self.remote_base, self.settings)

    def held(self) -> None:
        """The canary is as it was, and its secret is in no record of the task."""
        assert sorted(p.name for p in self.canary.iterdir()) == ["secret.txt"]
        assert (self.canary / "secret.txt").read_text() == self.secret
        assert stat.S_IMODE(os.lstat(self.canary).st_mode) == 0o700
        assert os.lstat(self.canary).st_uid == os.geteuid()
        for path in self.base.rglob("*"):
            if path.is_file() and not path.is_symlink() and path != self.canary / "secret.txt":
                assert self.secret.encode() not in path.read_bytes(), path
        assert list((self.base / "tmp").iterdir()) == []  # the grading's directories went with it

    def honest(self, graded: dict[str, Any]) -> None:
        """The fixed work was graded as what it is: resolved, and the tree holds the committed files again."""
        assert graded["error"] is None, graded
        assert graded["resolved"] is True, graded
        self.restored()

    def restored(self) -> None:
        assert not os.path.lexists(self.checkout.path / "test_held.py")
        assert self.ctx.read_state()["grading"]["status"] == "done"


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> Iterator[Task]:
    if os.geteuid() == 0:
        need_root()
        ensure_user(SANDBOX_USER)
    base = Path(tempfile.mkdtemp(prefix="tasuki-grading-attacks-", dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103 - the sandbox's user passes through it to the checkout
    remote = make_buggy_repo(base / "remote")
    remote_base = git(remote, "rev-parse", "HEAD").strip()
    canary = base / "canary"
    canary.mkdir(mode=0o700)
    secret = f"CANARY-{uuid_module.uuid4().hex}"
    (canary / "secret.txt").write_text(secret)
    workspaces = base / "workspaces"
    checkout = Checkout(workspaces / "bbbbbbbb-0001", str(remote), BRANCH,
                        cache=GitCache(base / "git-cache", workspaces))
    checkout.prepare(fresh=True)
    if os.geteuid() == 0:
        from sandbox import confine
        from sandbox.settings import SandboxSettings

        checkout.hand_over(confine.sandbox_user(SandboxSettings().user))
    (base / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base / "tmp"))  # the worker's temporary directory, watched
    ctx = ContextStore(base / "contexts", stale_after_s=60).create(TASK_KEY, {"model": "scripted"}, heartbeat=False)
    yield Task(base, checkout, ctx, remote_base, _test_patch(remote, base / "patch"), canary, secret)
    checkout.settle()
    shutil.rmtree(base, ignore_errors=True)


def _test_patch(remote: Path, scratch: Path, held: str = HELD_TEST) -> str:
    """The held-back tests: a new test file, as the eval set ships them."""
    git(scratch.parent, "clone", "-q", str(remote), str(scratch))
    (scratch / "test_held.py").write_text(held)
    git(scratch, "add", "-A")
    return git(scratch, "diff", "--cached", "HEAD")


# The staging directory's place in the home, prepared.


def test_a_tasuki_directory_that_links_to_a_host_directory_is_replaced_not_followed(task: Task) -> None:
    task.agent(FIX, f"rm -rf ~/.tasuki && ln -s {task.canary} ~/.tasuki")

    task.honest(task.grade())
    task.held()


def test_a_staging_directory_that_links_to_a_host_directory_is_replaced_not_followed(task: Task) -> None:
    task.agent(FIX, f"mkdir -p ~/.tasuki && rm -rf ~/.tasuki/grading && ln -s {task.canary} ~/.tasuki/grading")

    task.honest(task.grade())
    task.held()


def test_links_left_inside_the_staging_directory_are_removed_never_followed(task: Task) -> None:
    task.agent(FIX, "mkdir -p ~/.tasuki/grading/deeper",
               f"ln -s {task.canary}/secret.txt ~/.tasuki/grading/test_held.py",
               f"ln -s {task.canary} ~/.tasuki/grading/deeper/canary",
               f"ln -s {task.canary} ~/.tasuki/grading/canary")

    task.honest(task.grade())
    task.held()


@pytest.mark.parametrize("kind", ["a file", "a fifo", "a dangling link"])
def test_a_tasuki_path_of_another_kind_is_replaced(task: Task, kind: str) -> None:
    made = {"a file": "echo x > ~/.tasuki", "a fifo": "mkfifo ~/.tasuki",
            "a dangling link": f"ln -s {task.canary}/nothing-here ~/.tasuki"}[kind]
    task.agent(FIX, f"rm -rf ~/.tasuki && {made}")

    task.honest(task.grade())
    task.held()


def test_a_home_and_tasuki_directory_nobody_may_enter_are_no_obstacle(task: Task) -> None:
    task.agent(FIX, "mkdir -p ~/.tasuki/grading/inner && chmod 000 ~/.tasuki/grading/inner ~/.tasuki/grading "
                    "~/.tasuki/env ~/.tasuki ~")

    task.honest(task.grade())
    task.held()


# What the agent committed where the test patch's files go.


def test_a_committed_link_where_a_test_file_goes_is_laid_as_a_link_and_never_read(task: Task) -> None:
    task.agent(FIX, f"ln -s {task.canary}/secret.txt test_held.py")  # the worker commits it with the work

    graded = task.grade()

    assert graded["error"] is None, graded
    assert graded["resolved"] is True  # the test patch's file, not the link, was graded
    assert os.readlink(task.checkout.path / "test_held.py") == f"{task.canary}/secret.txt"  # the commit's, back
    task.held()


def test_a_committed_link_where_a_test_files_directory_goes_grades_cleanly(task: Task) -> None:
    patch = task.test_patch.replace("test_held.py", "held/test_held.py")
    task.agent(FIX, f"ln -s {task.canary} held")

    graded = task.grade(patch, ["held.test_held.HeldTest.test_add_more"])

    assert graded["resolved"] is False  # the agent's own link keeps the test patch out: a clean error grade
    assert graded["error"] == ("the test patch does not apply: error: affected file 'held/test_held.py' is beyond a "
                               "symbolic link")
    assert os.readlink(task.checkout.path / "held") == str(task.canary)
    task.held()


# Configuration and programs of the agent's that a git on the host might honor.


def test_the_agents_attributes_run_no_filter_a_hosts_git_config_defines(task: Task,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # git-lfs installed on the worker's host (`git lfs install`) defines a filter driver in the global config: the
    # agent's .gitattributes would name it for the files the grading lays out, and its .lfsconfig says from where.
    worker_home = task.base / "worker-home"
    worker_home.mkdir(mode=0o700)
    ran = task.base / "filter-ran"
    (worker_home / ".gitconfig").write_text(
        f"[filter \"lfs\"]\n\tsmudge = \"sh -c 'touch {ran}; cat'\"\n\tclean = \"sh -c 'touch {ran}; cat'\"\n"
        f"\tprocess = \"sh -c 'touch {ran}; exit 1'\"\n")
    task.agent(FIX, "printf '* filter=lfs\\n' > .gitattributes")
    task.checkout.commit("tasuki: the work")  # the worker's commit, before its user's config is git-lfs's
    monkeypatch.setenv("HOME", str(worker_home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)

    graded = task.grade(commit=False)

    assert not ran.exists()
    task.honest(graded)
    task.held()


def test_the_agents_git_directory_hooks_and_fsmonitor_run_nothing_on_the_host(task: Task) -> None:
    ran = task.canary / "ran"
    hook = f"#!/bin/sh\\ntouch {ran}\\n"
    task.agent(FIX, f"printf '[core]\\n\\tfsmonitor = \"touch {ran}\"\\n\\thooksPath = .git/hooks\\n' >> .git/config",
               *(f"mkdir -p .git/hooks && printf '{hook}' > .git/hooks/{name} && chmod 755 .git/hooks/{name}"
                 for name in ("post-checkout", "post-index-change", "pre-commit", "reference-transaction")),
               f"printf 'gitdir: {task.canary}\\n' > held.git")

    task.honest(task.grade())
    task.held()


def test_a_process_the_graded_code_leaves_behind_cannot_race_the_restore(task: Task) -> None:
    # The tests import the agent's calc.py: it starts a daemon that swaps the staging directory for a link to the
    # canary, over and over, for the restore that follows on the host. It dies with the grading's sandbox.
    daemon = (f"import os, subprocess\nsubprocess.Popen(['setsid', 'sh', '-c', 'while :; do rm -rf ~/.tasuki/grading; "
              f"ln -sfn {task.canary} ~/.tasuki/grading; done'], start_new_session=True)\n")
    task.agent(f"printf %s {shlex.quote(daemon + FIXED_CALC)} > calc.py")

    graded = task.grade()

    task.honest(graded)
    task.held()


# The test patch itself (the eval set's) naming paths outside the checkout.


@pytest.mark.parametrize("path", ["../escape.py", "held/../../escape.py", ".git/hooks/post-checkout"])
def test_a_test_patch_naming_a_path_outside_the_tree_is_a_clean_error_grade(task: Task, path: str) -> None:
    patch = task.test_patch.replace("a/test_held.py", f"a/{path}").replace("b/test_held.py", f"b/{path}")
    task.agent(FIX)

    graded = task.grade(patch)

    assert graded["resolved"] is False
    assert graded["error"] == f"the test patch names a path outside the tree: {path!r}"
    assert task.ctx.read_state().get("grading") is None  # nothing was laid: nothing for a resume to lay back
    assert not (task.base / "workspaces" / "escape.py").exists()
    task.held()


def _grade_record(task: Task) -> dict[str, Any]:
    lines = (task.ctx.path / TOOLS_FILE).read_text().splitlines()
    record: dict[str, Any] = json.loads(next(line for line in reversed(lines) if '"grade"' in line))
    return record


def test_grading_output_holds_no_file_a_link_pointed_at(task: Task) -> None:
    task.agent(FIX, f"ln -s {task.canary}/secret.txt leak.txt",
               f"ln -s {task.canary} leakdir")

    graded = task.grade()

    task.honest(graded)
    assert task.secret not in json.dumps(_grade_record(task))
    task.held()


# The grade's honesty: only the committed change counts. What the agent left uncommitted in its checkout or home
# could report a pass for work that fixes nothing when the tests ran there; they run in a fresh tree and home.
PASS_LINE = "test_add_more (test_held.HeldTest.test_add_more) ... ok"


def test_an_ignored_interpreter_in_the_checkout_passes_no_unfixed_work(task: Task) -> None:
    task.agent(f"mkdir -p .venv/bin && printf '#!/bin/sh\\necho \"{PASS_LINE}\"\\n' > .venv/bin/python",
               "chmod +x .venv/bin/python && echo .venv >> .git/info/exclude")

    graded = task.grade()

    assert graded["resolved"] is False
    assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")  # the real tests ran, and failed
    assert os.path.exists(task.checkout.path / ".venv" / "bin" / "python")  # the agent's tree was never touched
    task.held()


def test_a_bash_env_in_the_env_files_passes_no_unfixed_work(task: Task) -> None:
    task.agent(f"printf 'python3() {{ echo \"{PASS_LINE}\"; }}\\n' > ~/fake.sh",
               'echo "BASH_ENV=$HOME/fake.sh" >> $TASUKI_ENV')

    graded = task.grade()

    assert graded["resolved"] is False
    assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")
    task.held()


def test_a_usercustomize_in_the_home_passes_no_unfixed_work(task: Task) -> None:
    patch = ("import unittest.case as c\\nc.TestCase.run = lambda self, result=None: "
             "(result.startTest(self), result.addSuccess(self), result.stopTest(self))\\n")
    task.agent("d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && "
               f"printf '{patch}' > \"$d/usercustomize.py\"")

    graded = task.grade()

    assert graded["resolved"] is False
    assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")
    assert _grade_record(task)["result"]["graded_in"] == "graded in a fresh tree; environment: none"
    task.held()


# The environment the grading runs in: the setup's (its snapshot's copy), never the agent's.
SETUP = ("python3 -m venv --without-pip .venv && .venv/bin/python -c 'import pathlib, sysconfig; "
         "pathlib.Path(sysconfig.get_paths()[\"purelib\"], \"calcextra.py\").write_text(\"OFFSET = 0\\n\")' && "
         'echo CALC_EXTRA=from-the-setup >> "$TASUKI_ENV"\n')
NEEDS_SETUP = (
    "import os\nimport unittest\n\nimport calcextra\nfrom calc import add\n\n\n"
    "class HeldTest(unittest.TestCase):\n    def test_add_more(self):\n"
    "        self.assertEqual(os.environ.get('CALC_EXTRA'), 'from-the-setup')\n"
    "        self.assertEqual(add(4, 5) + calcextra.OFFSET, 9)\n"
)


def _with_setup(task: Task) -> str:
    """The task's environment built by its setup and kept as a snapshot in the task's own store; its key."""
    environments = task.settings.environments.model_copy(update={"snapshots_dir": task.base / "environments"})
    task.settings = task.settings.model_copy(update={"environments": environments})
    report = TaskEnvironment(task.settings, "local/calc", setup=SETUP).prepare(task.ctx, task.checkout)
    assert (report.outcome, report.snapshot) == ("built", ""), report
    assert report.key is not None
    return report.key


def test_an_honest_fix_that_needs_the_setups_environment_is_resolved_whatever_the_agent_did_to_it(
    task: Task,
) -> None:
    key = _with_setup(task)
    patch = _test_patch(task.base / "remote", task.base / "patch-setup", NEEDS_SETUP)
    # The agent's own environment is broken at the end: the grading's is the setup's all the same.
    task.agent(FIX, "rm -rf .venv", 'sed -i /CALC_EXTRA/d "$TASUKI_ENV"')

    graded = task.grade(patch)

    task.honest(graded)
    assert _grade_record(task)["result"]["graded_in"] == f"graded in a fresh tree; environment: snapshot {key}"
    assert not (task.checkout.path / ".venv").exists()  # the agent's tree as it left it
    task.held()


def test_unfixed_work_with_the_setups_environment_is_not_resolved(task: Task) -> None:
    _with_setup(task)
    patch = _test_patch(task.base / "remote", task.base / "patch-setup", NEEDS_SETUP)
    task.agent("echo '# nothing fixed' >> calc.py")

    graded = task.grade(patch)

    assert graded["error"] is None, graded
    assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")  # imported calcextra, then failed
    task.held()


def test_an_environment_path_the_agent_committed_is_the_setups_in_the_grading(task: Task) -> None:
    _with_setup(task)
    patch = _test_patch(task.base / "remote", task.base / "patch-setup", NEEDS_SETUP)
    task.agent("rm -rf .venv && mkdir -p .venv/bin && "
               f"printf '#!/bin/sh\\necho \"{PASS_LINE}\"\\n' > .venv/bin/python && chmod +x .venv/bin/python",
               "git add -f .venv")  # the agent's own index: the worker's commit takes it

    task.checkout.commit("tasuki: the work")
    assert "echo" in task.checkout.git("show", "HEAD:.venv/bin/python")
    graded = task.grade(patch, commit=False)

    assert graded["error"] is None, graded
    assert graded["fail_to_pass"] == dict.fromkeys(FAIL_TO_PASS, "failed")
    task.held()


# A resume after a holder stopped mid-grading.


def test_a_resume_after_a_grading_in_a_fresh_tree_removes_its_directory_and_leaves_the_tree_alone(task: Task) -> None:
    task.agent(FIX)
    task.checkout.commit("tasuki: the work")
    left = Path(tempfile.mkdtemp(prefix=AREA_PREFIX))  # what a killed holder left, a mode-000 directory in it
    (left / "tree" / "deep").mkdir(parents=True)
    (left / "tree" / "deep").chmod(0)
    head = task.checkout.head()
    task.ctx.update_state(grading={"status": "running", "tree": "fresh", "area": str(left), "files": ["test_held.py"],
                                   "head": head})

    recover(task.ctx, task.checkout, task.settings)

    assert not os.path.lexists(left)
    assert task.ctx.read_state()["grading"] == {"status": "done", "tree": "fresh", "files": ["test_held.py"],
                                                "head": head}
    assert task.checkout.git("status", "--porcelain") == ""
    task.held()


def test_a_resume_after_an_older_grading_in_the_checkout_lays_the_committed_files_back(task: Task) -> None:
    task.agent(FIX, f"printf %s {shlex.quote(HELD_TEST)} > test_held.py", "echo 'old = 1' > old_test.py")
    task.checkout.commit("tasuki: the work")
    head = task.checkout.head()
    # An older version laid the test patch into the checkout, then its holder stopped.
    task.agent("echo 'patched = 1' > test_held.py", "echo 'patched = 1' > patch_only.py")
    task.ctx.update_state(grading={"status": "applying", "files": ["test_held.py", "patch_only.py"], "head": head})

    recover(task.ctx, task.checkout, task.settings)

    assert (task.checkout.path / "test_held.py").read_text() == HELD_TEST  # the committed version
    assert not os.path.lexists(task.checkout.path / "patch_only.py")  # the commit has none
    assert task.ctx.read_state()["grading"]["status"] == "done"
    assert task.checkout.git("status", "--porcelain") == ""
    task.held()
