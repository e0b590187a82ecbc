"""Hostile input cannot leave the task: an agent that tries on purpose, through the real bash tool in the
bubblewrap sandbox, and the file tools under a directory-swapping race.

These run for real wherever bubblewrap can create its namespaces (CI installs it); elsewhere they skip,
and in CI they fail instead.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.tools import Workspace, run_tool
from sandbox.jail import Bubblewrap, NoSandbox, SandboxUnavailable, make_sandbox, probe, tool_dirs
from sandbox.settings import SandboxSettings
from tests.helpers.ci import bubblewrap_here, cannot_run
from tests.helpers.context_support import wait_for
from tests.helpers.stack import make_buggy_repo
from worker.checkout import Checkout
from worker.workcopy import GitCache

SECRET_VALUE = "sk-the-worker-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def sandbox() -> Bubblewrap:
    return bubblewrap_here()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "tasks" / "mine"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("hello\n")
    return repo


def bash(sandbox: Bubblewrap | NoSandbox, checkout: Path, command: str, timeout_s: int = 30) -> str:
    result = run_tool(
        Workspace(checkout),
        "bash",
        {"command": command},
        bash_timeout_s=timeout_s,
        max_output_chars=20000,
        sandbox=sandbox,
        limits=SandboxSettings().limits,
    )
    return result.output


PROBE_ENVIRONMENTS = (
    "env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; tr '\\0' '\\n' < /proc/$PPID/environ"
)
WORKER = """
import sys
from pathlib import Path
from sandbox.jail import make_sandbox
from sandbox.settings import SandboxSettings
from agent.tools import Workspace, run_tool
from worker.workcopy import GitCache
settings = SandboxSettings(backend=sys.argv[2])
result = run_tool(Workspace(Path(sys.argv[1])), "bash", {"command": sys.argv[3]}, bash_timeout_s=30,
                  max_output_chars=100000, sandbox=make_sandbox(settings), limits=settings.limits)
print(result.output)
"""


def _as_a_worker(checkout: Path, backend: str) -> str:
    """The bash tool run by a process that, like a worker, got its secret in its environment at start."""
    env = {**os.environ, "OPENAI_API_KEY": SECRET_VALUE, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", WORKER, str(checkout), backend, PROBE_ENVIRONMENTS], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_workers_secrets_are_not_in_any_environment_the_sandbox_can_read(
    sandbox: Bubblewrap, checkout: Path
) -> None:
    assert SECRET_VALUE not in _as_a_worker(checkout, "bubblewrap")


def test_unsandboxed_the_hole_is_real_which_is_why_none_is_only_for_trusted_models(checkout: Path) -> None:
    assert SECRET_VALUE in _as_a_worker(checkout, "none")  # what the sandbox closes: /proc/$PPID/environ


def test_the_sandbox_sees_only_its_own_processes_and_cannot_signal_the_worker(
    sandbox: Bubblewrap, checkout: Path
) -> None:
    output = bash(sandbox, checkout, f"ls /proc | grep -c '^[0-9]'; kill -0 {os.getpid()} && echo REACHED")
    processes = int(output.splitlines()[0])
    assert processes < 10  # bwrap's init, bash, ls, grep: not the host's hundreds
    assert "REACHED" not in output


def test_files_beside_the_checkout_and_the_hosts_secrets_are_out_of_sight(sandbox: Bubblewrap, checkout: Path) -> None:
    other_task = checkout.parent / "other"
    other_task.mkdir()
    (other_task / "secret.txt").write_text("another task's work")
    output = bash(sandbox, checkout, f"cat {other_task / 'secret.txt'}; cat /etc/shadow; ls {checkout.parent}; pwd")
    assert "another task's work" not in output
    assert "root:" not in output
    assert "/workspace" in output


def test_the_system_is_read_only_and_the_checkout_writable(sandbox: Bubblewrap, checkout: Path) -> None:
    output = bash(sandbox, checkout, "touch /usr/planted; echo made > made.txt; cat made.txt")
    assert "Read-only file system" in output
    assert (checkout / "made.txt").read_text() == "made\n"
    assert not Path("/usr/planted").exists()


def test_the_command_holds_no_capability_and_cannot_make_a_read_only_bind_writable(
    sandbox: Bubblewrap, checkout: Path, tmp_path: Path
) -> None:
    """A worker run as root (CI, a host's systemd unit) starts bwrap as root, which keeps every capability for the
    command unless told otherwise; with them it could remount a read-only bind writable and write the host's
    files through it (it did, before ``--cap-drop ALL``)."""
    shielded = tmp_path / "shielded"
    shielded.mkdir()
    (shielded / "file").write_text("host\n")
    boxed = Bubblewrap(SandboxSettings(read_only_paths=(shielded,)))
    output = bash(boxed, checkout, f"grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; mount -o remount,bind,rw "
                                   f"{shielded} 2>&1; echo planted > {shielded}/file 2>&1; cat {shielded}/file")
    assert [line.split()[1] for line in output.splitlines()[:4]] == ["0000000000000000"] * 4, output
    assert (shielded / "file").read_text() == "host\n"
    assert "planted" not in output


def test_nothing_a_call_started_outlives_it(sandbox: Bubblewrap, checkout: Path) -> None:
    marker = f"tasuki-sandbox-orphan-{os.getpid()}"
    bash(sandbox, checkout, f"setsid sh -c 'exec -a {marker} sleep 600' & nohup sleep 600 & echo started")

    def orphans() -> list[str]:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
        return found.split()

    assert wait_for(lambda: orphans() == [] or None, timeout=10, what="the sandbox's processes to be gone")


def test_with_network_none_the_sandbox_has_only_loopback(checkout: Path) -> None:
    isolated = Bubblewrap(SandboxSettings(network="none"))
    if probe(isolated) is not None:
        cannot_run("bubblewrap cannot create a network namespace here")
    output = bash(isolated, checkout, "cat /proc/net/dev")
    rows = [line for line in output.splitlines()[2:] if ":" in line and not line.startswith("exit code")]
    assert [row.split(":")[0].strip() for row in rows] == ["lo"]


def test_tools_on_the_workers_path_work_inside(sandbox: Bubblewrap, checkout: Path) -> None:
    output = bash(sandbox, checkout, "python3 -c 'print(6 * 7)'; git --version")
    assert "42" in output
    assert "git version" in output


def test_tool_dirs_binds_the_installation_a_path_entry_belongs_to(tmp_path: Path) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    assert str(tmp_path / "venv") in tool_dirs([str(venv_bin), "/usr/bin", ""])
    assert all(not d.startswith("/usr") for d in tool_dirs(["/usr/local/bin", "/usr/bin"]))


def test_a_sandbox_that_cannot_run_refuses_instead_of_running_bare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to be found
    make_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match=r"bubblewrap is not installed.*sandbox.backend: none"):
            make_sandbox(SandboxSettings())
        assert make_sandbox(SandboxSettings(backend="none")).name == "none"  # only when asked for explicitly
    finally:
        make_sandbox.cache_clear()


# -- the worker's own git never runs what the checkout planted ----------------------------------------


def test_hooks_written_into_the_checkout_never_run_in_the_workers_git(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    seed = tmp_path / "seed"
    subprocess.run(["git", "clone", "-q", str(remote), str(seed)], check=True, capture_output=True)
    (seed / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(seed), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"], check=True
    )
    subprocess.run(["git", "-C", str(seed), "push", "-q", "origin", "HEAD"], check=True, capture_output=True)
    checkout = Checkout(tmp_path / "work", str(remote), "tasuki/1-hooks")
    checkout.prepare(fresh=True)
    ran = tmp_path / "hook-ran"
    for hook in ("pre-commit", "pre-push", "post-checkout", "commit-msg", "post-commit", "reference-transaction"):
        script = checkout.path / ".git" / "hooks" / hook
        script.parent.mkdir(exist_ok=True)  # the agent's .git, as the worker writes it, has no hooks directory
        script.write_text(f"#!/bin/sh\necho {hook} >> {ran}\n")
        script.chmod(0o755)

    (checkout.path / "b.txt").write_text("b\n")
    checkout.checkpoint(1)
    checkout.commit("tasuki: b")
    checkout.push()

    assert not ran.exists()


def test_the_file_tools_refuse_paths_under_dot_git(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    workspace = Workspace(repo)
    for name, arguments in (
        ("write_file", {"path": ".git/hooks/pre-push", "content": "#!/bin/sh\ncurl evil\n"}),
        ("read_file", {"path": ".git/config"}),
        ("edit_file", {"path": "sub/.git/config", "old_string": "a", "new_string": "b"}),
    ):
        result = run_tool(workspace, name, arguments, bash_timeout_s=5, max_output_chars=1000)
        assert result.status == "error"
        assert "under .git" in (result.error or "")
    assert not (repo / ".git" / "hooks" / "pre-push").exists()


# -- the file tools under a race ------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)


@pytest.fixture
def swapping(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A checkout whose ``docs`` directory is swapped with a symlink to outside, as fast as possible."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "page.txt").write_text("inside\n")
    outside.mkdir()
    (outside / "page.txt").write_text("THE OUTSIDE SECRET\n")
    (repo / "link").symlink_to(outside)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            _exchange(repo / "docs", repo / "link")

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        yield repo, outside
    finally:
        stop.set()
        swapper.join(timeout=10)
        shutil.rmtree(outside, ignore_errors=True)


def test_read_and_write_never_escape_through_a_directory_swapped_for_a_symlink(swapping: tuple[Path, Path]) -> None:
    repo, outside = swapping
    workspace = Workspace(repo)
    for attempt in range(300):
        read = run_tool(workspace, "read_file", {"path": "docs/page.txt"}, bash_timeout_s=5, max_output_chars=1000)
        assert "THE OUTSIDE SECRET" not in read.output, attempt
        run_tool(
            workspace,
            "write_file",
            {"path": "docs/page.txt", "content": f"write {attempt}\n"},
            bash_timeout_s=5,
            max_output_chars=1000,
        )
        assert (outside / "page.txt").read_text() == "THE OUTSIDE SECRET\n", attempt


def test_the_agents_git_works_in_a_warm_copy_and_sees_only_its_own_mirror_read_only(
    sandbox: Bubblewrap, tmp_path: Path
) -> None:
    cache = GitCache(tmp_path / "git-cache", tmp_path / "workspaces")
    other = Checkout(cache.workspaces / "bbbbbbbb-2", str(make_buggy_repo(tmp_path / "other")), "tasuki/2-b",
                     cache=cache)
    other.prepare(fresh=True)
    mine = Checkout(cache.workspaces / "aaaaaaaa-1", str(make_buggy_repo(tmp_path / "repo")), "tasuki/1-a",
                    cache=cache)
    mine.prepare(fresh=True)
    boxed = make_sandbox(SandboxSettings(), read_only=mine.shared_paths)
    (mirror,) = mine.shared_paths

    output = bash(boxed, mine.path, f"git log --format=%s -1; touch {mirror}/planted; ls {other.shared_paths[0]}")

    assert "calc with a bug" in output
    assert "Read-only file system" in output
    assert "No such file or directory" in output  # another repository's mirror is not there at all
    assert not (mirror / "planted").exists()
