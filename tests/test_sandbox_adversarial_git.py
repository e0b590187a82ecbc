"""The worker's own git never runs what the agent planted in the checkout's ``.git`` (issue 36).

The worker commits, checkpoints and pushes the agent's work with git on the host, as root in CI, with the forge
credential in its environment. Each test here is an attacker with the real ``bash`` tool: it plants something in
``/workspace/.git`` (a config key that runs a program or moves the push elsewhere, a file that points at another
repository), then the worker's real checkpoint, commit and push run through the :class:`Checkout` API against a
local bare remote, with a fake credential in ``git_env``. Nothing may run on the host (a marker in a "canary"
directory outside the sandbox), the credential may be written nowhere, and the push goes to the real remote only.
All failed on 8da9827 but core.pager's, which held there too (the worker's git never has a terminal to page on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import hostile_agent
from tests.helpers.ci import bubblewrap_here
from tests.helpers.sandbox_users import SANDBOX_USER, ensure_user, need_root
from tests.helpers.stack import git, make_buggy_repo
from worker.checkout import Checkout, GitError
from worker.workcopy import GitCache

CREDENTIAL = "forge-credential-adversarial-7c1d0e"
GIT_ENV = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "http.https://forge.invalid/.extraHeader",
    "GIT_CONFIG_VALUE_0": f"Authorization: Basic {CREDENTIAL}",
}
BRANCH = "tasuki/1-aaaaaaaa"


@dataclass
class Task:
    """A task's checkout on a local remote, the attacker's bare remote beside it, and the host-only canary."""

    base: Path
    checkout: Checkout
    remote: Path
    elsewhere: Path
    canary: Path

    def agent(self, *commands: str) -> list[str]:
        """Run ``commands`` through the real bash tool in the task's sandbox (a root worker's: as its sandbox user)."""
        return hostile_agent.run(self.checkout.path, self.checkout.home, commands)

    def worker_finishes(self) -> str | None:
        """A step's checkpoint, then the end of the task: commit and push, as the worker runs them; git's error, if
        one stopped it."""
        try:
            self.checkout.checkpoint(1)
            self.checkout.pushes.wait()
            self.checkout.commit("tasuki: the work")
            self.checkout.push()
        except GitError as exc:
            return str(exc)
        return None

    def held(self, error: str | None) -> None:
        """Nothing ran on the host, the credential is nowhere on disk, the work went to the real remote only."""
        assert sorted(p.name for p in self.canary.iterdir()) == []
        assert not _files_holding(self.base, CREDENTIAL)
        assert git(self.elsewhere, "for-each-ref") == ""
        assert error is None
        assert git(self.remote, "show", f"{BRANCH}:work.txt") == "the agent's work\n"


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def task() -> Iterator[Task]:
    if os.geteuid() == 0:
        need_root()
        ensure_user(SANDBOX_USER)
    base = Path(tempfile.mkdtemp(prefix="tasuki-hostile-git-", dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103 - the sandbox's user passes through it to the checkout
    remote = make_buggy_repo(base / "remote")
    elsewhere = base / "elsewhere.git"
    git(base, "init", "-q", "--bare", str(elsewhere))
    canary = base / "canary"
    canary.mkdir(mode=0o700)
    workspaces = base / "workspaces"
    checkout = Checkout(workspaces / "aaaaaaaa-0001", str(remote), BRANCH, git_env=GIT_ENV,
                        cache=GitCache(base / "git-cache", workspaces))
    checkout.prepare(fresh=True)
    _hand_over(checkout)
    yield Task(base, checkout, remote, elsewhere, canary)
    checkout.settle()
    shutil.rmtree(base, ignore_errors=True)


def _hand_over(checkout: Checkout) -> None:
    """A root worker gives the checkout and the home to its sandbox's user, as the worker does when a task begins
    (before e63275b its sandbox ran as root: nothing to give)."""
    if os.geteuid() != 0 or not hasattr(checkout, "hand_over"):
        return
    from sandbox import confine
    from sandbox.settings import SandboxSettings

    checkout.hand_over(confine.sandbox_user(SandboxSettings().user))


def _files_holding(root: Path, text: str) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and text.encode() in path.read_bytes():
            found.append(path)
    return found


def _work(config: str, *more: str) -> tuple[str, ...]:
    """The agent's commands: ``config`` appended to its ``.git/config``, ``more``, and a file of work."""
    return (f"cat >> .git/config <<'EOF_CONFIG'\n{config}\nEOF_CONFIG", *more,
            "echo \"the agent's work\" > work.txt")


def test_a_clean_filter_in_the_agents_config_runs_nothing_on_the_host(task: Task) -> None:
    marker = task.canary / "clean-filter-ran"
    task.agent(*_work(f"[filter \"x\"]\n\tclean = \"sh -c 'touch {marker}; cat'\"",
                      "echo '* filter=x' > .gitattributes"))

    task.held(task.worker_finishes())
    assert git(task.remote, "show", f"{BRANCH}:.gitattributes") == "* filter=x\n"  # content: it stays


def test_a_filter_the_workers_own_git_config_defines_never_runs_for_the_agents_attributes(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    # git-lfs installed on the worker's host (`git lfs install`) defines its filter driver in the user's (or the
    # system's) config, which the worker's git reads: the agent's .gitattributes names it for any file.
    marker = task.canary / "lfs-filter-ran"
    worker_home = task.base / "worker-home"
    worker_home.mkdir(mode=0o700)
    run = f"\"sh -c 'touch {marker}; cat'\""
    (worker_home / ".gitconfig").write_text(f"[filter \"lfs\"]\n\tclean = {run}\n\tsmudge = {run}\n"
                                            f"\tprocess = \"sh -c 'touch {marker}; exit 1'\"\n")
    monkeypatch.setenv("HOME", str(worker_home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    task.agent("echo '* filter=lfs' > .gitattributes", "echo \"the agent's work\" > work.txt")

    task.held(task.worker_finishes())
    assert git(task.remote, "show", f"{BRANCH}:.gitattributes") == "* filter=lfs\n"  # content: it stays


def test_a_credential_helper_never_sees_the_forge_credential(task: Task) -> None:
    with _refusing_server() as url:  # asks for credentials: git calls the helpers
        stolen = task.canary / "helper-env"
        task.agent(*_work(f'[remote "origin"]\n\tpushurl = {url}/stolen.git\n'
                          f'[credential]\n\thelper = "!f() {{ env > {stolen}; }}; f"'))

        task.held(task.worker_finishes())


def test_a_push_url_or_url_rewrite_never_moves_the_push_elsewhere(task: Task) -> None:
    task.agent(*_work(f'[remote "origin"]\n\tpushurl = {task.elsewhere}\n'
                      f'[url "{task.elsewhere}"]\n\tinsteadOf = {task.remote}'))

    task.held(task.worker_finishes())


def test_a_gpg_program_with_commit_signing_runs_nothing_on_the_host(task: Task) -> None:
    marker = task.canary / "gpg-ran"
    script = task.checkout.path / "sign.sh"  # the agent's file, by its host path (mountinfo tells it)
    task.agent(f"printf '#!/bin/sh\\ntouch {marker}\\nexit 1\\n' > sign.sh && chmod 755 sign.sh",
               *_work(f"[commit]\n\tgpgsign = true\n[gpg]\n\tprogram = {script}"))

    task.held(task.worker_finishes())


def test_an_include_of_a_file_the_agent_wrote_is_never_read(task: Task) -> None:
    marker = task.canary / "included-filter-ran"
    task.agent(f"cat > more.cfg <<'EOF_MORE'\n[filter \"y\"]\n\tclean = \"sh -c 'touch {marker}; cat'\"\nEOF_MORE",
               "echo '* filter=y' > .gitattributes",
               *_work("[include]\n\tpath = ../more.cfg"))

    task.held(task.worker_finishes())


def test_a_pager_runs_nothing_on_the_host(task: Task) -> None:
    marker = task.canary / "pager-ran"
    task.agent(*_work(f"[core]\n\tpager = \"sh -c 'touch {marker}; cat'\"\n[pager]\n\tlog = true\n\tpush = true"))

    task.held(task.worker_finishes())


def test_alternates_to_another_repository_on_the_host_push_none_of_its_objects(task: Task) -> None:
    # Another repository on the host the agent cannot see: its alternates and HEAD name it, and the worker's git
    # (not the agent's: it cannot read those objects) would find them and push them.
    private = make_buggy_repo(task.base / "other-task")
    (private / "secret.txt").write_text("another task's secret\n")
    git(private, "add", "-A")
    git(private, "commit", "-q", "-m", "private")
    secret_commit = git(private, "rev-parse", "HEAD").strip()
    task.agent(f"echo {private}/.git/objects >> .git/objects/info/alternates",
               f"mkdir -p .git/refs/heads/tasuki && echo {secret_commit} > .git/refs/heads/{BRANCH}",
               "echo \"the agent's work\" > work.txt")

    error = task.worker_finishes()

    assert subprocess.run(["git", "cat-file", "-e", secret_commit], cwd=task.remote, check=False).returncode != 0
    task.held(error)


class _Refuse(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        return


class _refusing_server:
    def __enter__(self) -> str:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
