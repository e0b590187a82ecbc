"""The agent's toolchains inside the real bubblewrap sandbox (SPEC §17 "Toolchains", issue 25): Tasuki's own
virtualenv is never the agent's Python, the toolchains on this machine compile and test a tiny project each
through the bash tool, and one that cannot run inside is named at worker start with its error and its fix.

A toolchain this machine lacks is skipped with the reason; the compose tests run all of them in the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.tools import Workspace, run_tool
from sandbox.jail import Bubblewrap, probe
from sandbox.settings import SandboxSettings
from sandbox.toolchains import (
    TOOLCHAINS,
    Toolchain,
    agent_path,
    found_toolchains,
    own_prefixes,
    probe_toolchains,
    worker_path,
)
from tests.helpers.ci import bubblewrap_here, cannot_run
from worker.lifecycle import warn_toolchains

ROOT = Path(__file__).resolve().parents[1]
# The bash tool, run by a process that, like a worker started from Tasuki's virtualenv, has its bin on PATH.
AS_A_WORKER = """
import sys
from pathlib import Path
from sandbox.jail import make_sandbox
from sandbox.settings import SandboxSettings
from agent.tools import Workspace, run_tool
settings = SandboxSettings()
result = run_tool(Workspace(Path(sys.argv[1])), "bash", {"command": sys.argv[2]}, bash_timeout_s=120,
                  max_output_chars=100000, sandbox=make_sandbox(settings), limits=settings.limits)
print(result.output)
"""


@pytest.fixture(scope="module")
def sandbox() -> Bubblewrap:
    return bubblewrap_here()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    repo.mkdir()
    return repo


def bash(sandbox: Bubblewrap, checkout: Path, command: str) -> str:
    result = run_tool(
        Workspace(checkout),
        "bash",
        {"command": command},
        bash_timeout_s=300,
        max_output_chars=20000,
        sandbox=sandbox,
        limits=SandboxSettings().limits,
    )
    return result.output


def needs(program: str) -> None:
    if shutil.which(program, path=os.pathsep.join(worker_path())) is None:
        pytest.skip(f"{program} is not installed on this machine (the compose tests run it in the image)")


def test_the_agent_path_leaves_out_tasukis_own_virtualenv_and_keeps_the_rest(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    other = tmp_path / "other" / "bin"
    other.mkdir(parents=True)
    entries = [str(venv / "bin"), str(other), "/usr/local/bin", "/usr/bin", "", "/usr/bin"]

    assert agent_path(entries, own=frozenset({venv.resolve()})) == [str(other), "/usr/local/bin", "/usr/bin"]


def test_tasukis_virtualenv_is_known_when_the_tests_run_from_one() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("these tests are not running from a virtualenv")
    assert Path(sys.prefix).resolve() in own_prefixes()
    assert not any(Path(entry).resolve() == Path(sys.prefix).resolve() / "bin" for entry in worker_path())


def test_inside_the_agents_python_is_never_tasukis_and_makes_a_virtualenv(sandbox: Bubblewrap, checkout: Path) -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("these tests are not running from a virtualenv")
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]), "PYTHONPATH": str(ROOT)}
    command = (
        "python3 -c 'import sys; print(\"prefix\", sys.prefix)'; "
        "python3 -c 'import celery' 2>&1 | tail -1; "
        "python3 -m venv .venv && .venv/bin/python -c 'print(\"venv made\")'"
    )

    done = subprocess.run(
        [sys.executable, "-c", AS_A_WORKER, str(checkout), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )

    prefix = next(line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("prefix "))
    assert Path(prefix).resolve() != Path(sys.prefix).resolve(), done.stdout
    assert "No module named 'celery'" in done.stdout
    assert "venv made" in done.stdout
    assert (checkout / ".venv" / "pyvenv.cfg").is_file()


def test_a_java_class_compiles_and_its_asserts_run(sandbox: Bubblewrap, checkout: Path) -> None:
    needs("javac")
    (checkout / "Main.java").write_text(
        "public class Main {\n"
        "  static int add(int a, int b) { return a + b; }\n"
        "  public static void main(String[] args) {\n"
        '    if (add(2, 3) != 5) throw new AssertionError("add");\n'
        '    System.out.println("java ok");\n'
        "  }\n"
        "}\n"
    )

    output = bash(sandbox, checkout, "javac -d out Main.java && java -cp out Main")

    assert "java ok" in output, output
    assert output.endswith("exit code: 0"), output


def test_maven_starts(sandbox: Bubblewrap, checkout: Path) -> None:
    needs("mvn")  # a build would fetch plugins from the network; starting shows its configuration is seen

    output = bash(sandbox, checkout, "mvn --version")

    assert "Apache Maven" in output, output
    assert output.endswith("exit code: 0"), output


def test_a_rust_crate_builds_and_its_tests_pass_offline(sandbox: Bubblewrap, checkout: Path) -> None:
    needs("cargo")
    (checkout / "Cargo.toml").write_text('[package]\nname = "tiny"\nversion = "0.1.0"\nedition = "2021"\n')
    (checkout / "src").mkdir()
    (checkout / "src" / "lib.rs").write_text(
        "pub fn add(a: i32, b: i32) -> i32 { a + b }\n\n"
        "#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() { assert_eq!(super::add(2, 3), 5); }\n}\n"
    )

    output = bash(sandbox, checkout, "cargo test --offline 2>&1")

    assert "test tests::adds ... ok" in output, output
    assert output.endswith("exit code: 0"), output


def test_every_toolchain_on_this_machine_passes_its_probe(sandbox: Bubblewrap) -> None:
    assert probe_toolchains(sandbox, worker_path(), SandboxSettings().limits) == [], found_toolchains(worker_path())


def test_a_toolchain_that_cannot_run_inside_is_named_at_start_with_its_error_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tool that works on the host but reads a file outside anything the sandbox shows.
    config = tmp_path / "elsewhere" / "tool.conf"
    config.parent.mkdir()
    config.write_text("setting = 1\n")
    tools = tmp_path / "tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "sometool").write_text(f"#!/bin/sh\nexec cat {config}\n")
    (tools / "sometool").chmod(0o755)
    assert subprocess.run([tools / "sometool"], capture_output=True, check=False).returncode == 0
    monkeypatch.setenv("PATH", os.pathsep.join([str(tools), os.environ.get("PATH", "")]))
    sometool = Toolchain("sometool", ("sometool", "--version"), "add its configuration to sandbox.read_only_paths")
    absent = Toolchain("absent", ("no-such-toolchain", "--version"), "never said")
    boxed = Bubblewrap(SandboxSettings())
    if probe(boxed) is not None:
        cannot_run(str(probe(boxed)))

    with capture_logs() as logs:
        warn_toolchains(boxed, SandboxSettings().limits, (sometool, absent))

    assert [entry["log_level"] for entry in logs] == ["warning", "info"]
    assert logs[1] == {
        "event": "toolchains probed in the sandbox",
        "log_level": "info",
        "usable": [],
        "failing": ["sometool"],
    }
    line = logs[0]["event"]
    assert line.startswith("sometool cannot run in the sandbox (exit 1: cat: "), line
    assert str(config) in line
    assert line.endswith("fix: add its configuration to sandbox.read_only_paths")

    fixed = Bubblewrap(SandboxSettings(read_only_paths=(config.parent,)))
    assert probe_toolchains(fixed, worker_path(), toolchains=(sometool,)) == []


def test_a_jvm_runs_under_a_small_memory_limit_it_sizes_itself_to(sandbox: Bubblewrap) -> None:
    # memory.max of the call's cgroup, not an address-space limit a JVM reserves past (issue 36): it fits its heap
    needs("javac")
    small = SandboxSettings(limits={"memory_bytes": 256 * 1024 * 1024}).limits
    java = next(t for t in TOOLCHAINS if t.name == "java")

    assert probe_toolchains(sandbox, worker_path(), small, (java,)) == []
