"""A sandboxed call's confinement on the host (issue 36, rows 3 and 12, and the Node/WebAssembly limit): a root
worker's sandbox runs as the dedicated user, each call in a cgroup with pids.max and memory.max, the task's home under
a disk cap; a call that hits one gets a clear line and the worker's tool goes on. Real bubblewrap, real processes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agent.tools import Workspace, run_tool
from agent.tools.dispatch import ToolResult
from sandbox import confine
from sandbox.jail import Bubblewrap
from sandbox.settings import SandboxLimits, SandboxSettings
from tests.helpers.ci import bubblewrap_here, cannot_run
from tests.helpers.sandbox_users import (
    SANDBOX_USER,
    WORKER_USER,
    ensure_user,
    handed_over_task,
    need_root,
    owned_dir,
    python_as,
    run_as,
)


@pytest.fixture
def task(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout and a home, handed over to the sandbox's user as the worker does when a task begins."""
    bubblewrap_here()
    return handed_over_task(tmp_path)


def _root() -> bool:
    return os.geteuid() == 0


def _bash(task: tuple[Path, Path], command: str, settings: SandboxSettings | None = None) -> ToolResult:
    settings = settings or SandboxSettings()
    checkout, home = task
    return run_tool(
        Workspace(checkout), "bash", {"command": command}, bash_timeout_s=60, max_output_chars=20000,
        sandbox=Bubblewrap(settings), limits=settings.limits, home=home,
    )


def _needs_cgroups() -> None:
    if confine.call_cgroups() is None:
        cannot_run("no cgroup (v2 delegated, or v1 memory and pids as root) can be used here")


def test_a_root_workers_sandbox_runs_as_the_sandbox_user_not_host_root(task: tuple[Path, Path]) -> None:
    need_root()
    uid, _gid = ensure_user(SANDBOX_USER)
    secret = task[1] / "root-only"
    secret.write_text("the worker's\n")
    secret.chmod(0o600)  # the worker's (root's) file in the home: host root inside could read it
    result = _bash(task, "grep ^Uid: /proc/self/status; cat ~/root-only; echo tried")
    assert result.status == "success", result.output
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in result.output
    assert "the worker's" not in result.output
    assert "Permission denied" in result.output
    # the work goes on as that user: what it writes in the checkout and home is its own
    again = _bash(task, "echo made > made.txt && echo kept >> ~/notes && stat -c %u made.txt ~/notes")
    assert again.output.splitlines()[:2] == [str(uid), str(uid)], again.output


def test_80_forks_under_pids_max_40_fail_with_a_clear_line_and_the_tool_goes_on(task: tuple[Path, Path]) -> None:
    need_root()
    _needs_cgroups()
    settings = SandboxSettings(limits=SandboxLimits(processes=40))
    result = _bash(task, "for i in $(seq 80); do sleep 2 & done 2>&1 | tail -1; wait; echo done", settings)
    assert "reached the processes a call may have (sandbox.limits.processes: 40)" in result.output, result.output
    assert "fork" in result.output.splitlines()[0]
    assert _bash(task, "echo still here", settings).output.startswith("still here")


def test_a_memory_hog_is_killed_at_memory_max_with_a_clear_line_and_the_tool_goes_on(task: tuple[Path, Path]) -> None:
    _needs_cgroups()
    settings = SandboxSettings(limits=SandboxLimits(memory_bytes=64 << 20))
    hog = "python3 -c 'b = bytearray(512 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(len(b))'"
    result = _bash(task, hog, settings)
    assert "used all the memory a call may (sandbox.limits.memory_bytes: 64 MiB)" in result.output, result.output
    assert "536870912" not in result.output
    assert _bash(task, "echo still here", settings).output.startswith("still here")


def test_a_node_webassembly_program_runs_under_the_default_limits(task: tuple[Path, Path]) -> None:
    if shutil.which("node") is None:
        cannot_run("node is not installed")
    program = (
        "new WebAssembly.Memory({initial: 1, maximum: 65536});"
        "const bytes = new Uint8Array([0,97,115,109,1,0,0,0]);"
        "WebAssembly.instantiate(bytes).then(() => console.log('wasm ok'))"
    )
    result = _bash(task, f"node -e {json.dumps(program)}")
    assert "wasm ok" in result.output, result.output


def test_a_writer_past_the_disk_cap_is_stopped_with_a_clear_error_and_the_tool_goes_on(
    task: tuple[Path, Path],
) -> None:
    settings = SandboxSettings(disk_bytes=20 << 20)
    writer = "for i in $(seq 200); do head -c 1048576 /dev/zero >> ~/big; sleep 0.05; done; echo wrote all"
    result = _bash(task, writer, settings)
    assert result.status == "error"
    assert "over sandbox.disk_bytes (20 MiB): the command was killed" in result.output, result.output
    assert "wrote all" not in result.output
    assert (task[1] / "big").stat().st_size < 200 << 20
    cleaned = _bash(task, "rm ~/big && echo cleaned", settings)
    assert cleaned.status == "success"
    assert cleaned.output.startswith("cleaned"), cleaned.output


_UNPRIVILEGED = """
import json, os, sys
from pathlib import Path
from sandbox.jail import Bubblewrap
from sandbox.settings import SandboxSettings
from agent.tools import Workspace, run_tool
root = Path(sys.argv[1])
(root / "checkout").mkdir(); (root / "home").mkdir()
settings = SandboxSettings()
result = run_tool(Workspace(root / "checkout"), "bash", {"command": "id -u; echo x > f && cat f"}, bash_timeout_s=60,
                  max_output_chars=4000, sandbox=Bubblewrap(settings), limits=settings.limits, home=root / "home")
print(json.dumps({"status": result.status, "output": result.output, "worker": os.getuid()}))
"""


def test_an_unprivileged_worker_runs_its_sandbox_as_itself() -> None:
    need_root()
    bubblewrap_here()
    uid, _gid = ensure_user(WORKER_USER)
    python, env = python_as(WORKER_USER)
    directory = owned_dir(WORKER_USER)
    try:
        done = run_as(WORKER_USER, [*python, "-c", _UNPRIVILEGED, str(directory)], env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        told = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert told["worker"] == uid
    assert told["status"] == "success", told["output"]
    assert told["output"].splitlines()[:2] == [str(uid), "x"]


def test_what_the_file_tools_make_the_agents_commands_can_change(task: tuple[Path, Path]) -> None:
    """A root worker's write_file makes the file and its new directories the sandbox user's, so the agent's next
    command can append to it and add files beside it (root's 0755 directory and 0644 file would refuse both)."""
    checkout, home = task
    settings = SandboxSettings()
    written = run_tool(
        Workspace(checkout), "write_file", {"path": "src/new/module.py", "content": "A = 1\n"}, bash_timeout_s=60,
        max_output_chars=20000, sandbox=Bubblewrap(settings), limits=settings.limits, home=home,
    )
    assert written.error is None, written.output
    done = _bash(task, "echo 'B = 2' >> src/new/module.py && touch src/new/__init__.py && cat src/new/module.py")
    assert done.error is None, done.output
    assert done.output.startswith("A = 1\nB = 2\n"), done.output


def test_a_directory_chmodded_after_the_first_call_is_passed_again(tmp_path: Path) -> None:
    # pytest chmods its temporary root to 0700 at every start, which narrows the ACL's mask that let the sandbox's
    # user through: a worker that remembered the directory as passable bound paths its user could no longer reach.
    bubblewrap_here()
    need_root()
    outer = tmp_path / "outer"
    outer.mkdir(mode=0o700)
    checkout, home = handed_over_task(outer)
    assert _bash((checkout, home), "echo first").output.startswith("first")
    outer.chmod(0o700)  # the mask of its ACL is 0 now: the entry for the sandbox's user lets nothing through
    again = _bash((checkout, home), "echo second")
    assert again.status == "success", again.output
    assert again.output.startswith("second")
