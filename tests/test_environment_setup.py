"""The setup runner (SPEC §17): a declaration's steps in the real sandbox, one deadline, a masked log tail.

Declarations here are plain dataclasses of the shape ``sandbox.declarations`` gives (the runner takes any).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox.jail import Bubblewrap, NoSandbox, Sandbox, command_env
from sandbox.setup import run_setup, worker_git_dir
from tests.helpers.ci import bubblewrap_here
from tests.helpers.context_support import wait_for
from tests.helpers.stack import git, make_buggy_repo

SECRET = "reg-s3cret-value-0123456789"


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    env: Mapping[str, str] = field(default_factory=dict)
    working_directory: str = "."


@dataclass(frozen=True)
class Declaration:
    steps: tuple[Step, ...]
    source: str = ".tasuki/setup.sh"
    notes: tuple[str, ...] = ()
    github_files: bool = False


@pytest.fixture(scope="module")
def bubblewrap() -> Bubblewrap:
    return bubblewrap_here()


@pytest.fixture
def task(tmp_path: Path) -> tuple[Path, Path]:
    checkout = make_buggy_repo(tmp_path / "task")
    (checkout / "sub").mkdir()
    (checkout / "sub" / "keep.txt").write_text("tracked\n")
    (checkout / ".gitignore").write_text("build/\n")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "layout")
    (checkout / "stray.txt").write_text("there before the setup\n")
    (checkout / ".git").rename(worker_git_dir(checkout))  # the worker's own, beside the checkout, as Checkout makes it
    home = tmp_path / "task.home"
    home.mkdir(mode=0o700)
    return checkout, home


def test_steps_run_in_order_in_their_directories_and_see_what_earlier_steps_declared(
    bubblewrap: Bubblewrap, task: tuple[Path, Path]
) -> None:
    checkout, home = task
    declaration = Declaration(
        (
            Step(
                "declare",
                'echo "FROM_STEP_ONE=one" >> "$GITHUB_ENV"; mkdir -p "$HOME/tools"; '
                'printf "#!/bin/sh\\necho tool\\n" > "$HOME/tools/t"; chmod +x "$HOME/tools/t"; '
                'echo "$HOME/tools" >> "$GITHUB_PATH"',
            ),
            Step(
                "use",
                'pwd; echo "got=$FROM_STEP_ONE own=$OWN"; t; mkdir -p ../build .venv; touch ../build/out .venv/cfg',
                {"OWN": "mine"},
                "sub",
            ),
        ),
        source=".github/workflows/copilot-setup-steps.yml",
        notes=("step 'actions/checkout@v4' (uses:) skipped",),
        github_files=True,
    )
    outcome = run_setup(declaration, checkout, home, bubblewrap, timeout_s=120)
    assert outcome.succeeded, outcome.log_tail
    assert "/workspace/sub" in outcome.log_tail
    assert "got=one own=mine" in outcome.log_tail
    assert "tool" in outcome.log_tail.splitlines()
    assert "note: step 'actions/checkout@v4' (uses:) skipped" in outcome.log_tail
    # What it made, untracked or ignored; not what was there before it ran.
    assert outcome.created == ("build/", "sub/.venv/")
    # The agent's later commands get what the setup declared.
    assert command_env(home, None, bubblewrap).env["FROM_STEP_ONE"] == "one"


def test_a_failing_step_stops_the_setup_with_its_exit_code_and_output(
    bubblewrap: Bubblewrap, task: tuple[Path, Path]
) -> None:
    checkout, home = task
    declaration = Declaration(
        (Step("install", "echo installing; false; echo not reached"), Step("after", "touch after-ran"))
    )
    outcome = run_setup(declaration, checkout, home, bubblewrap, timeout_s=120)
    assert not outcome.succeeded
    assert outcome.exit_code == 1
    assert not outcome.timed_out
    assert "installing" in outcome.log_tail
    assert "not reached" not in outcome.log_tail  # bash -e
    assert "== install: exit code 1" in outcome.log_tail
    assert not (checkout / "after-ran").exists()


@pytest.mark.parametrize("backend", ["bubblewrap", "none"])
def test_the_deadline_kills_the_whole_setup(backend: str, bubblewrap: Bubblewrap, task: tuple[Path, Path]) -> None:
    checkout, home = task
    sandbox: Sandbox = bubblewrap if backend == "bubblewrap" else NoSandbox()
    mark = f"MARK_{os.getpid()}_{backend}={home.name}-{id(task)}"
    name, value = mark.split("=")
    declaration = Declaration((Step("hang", "sleep 600 & sleep 600 & echo started; wait", {name: value}),))
    outcome = run_setup(declaration, checkout, home, sandbox, timeout_s=2)
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert "started" in outcome.log_tail
    assert "killed at the setup's deadline" in outcome.log_tail
    wait_for(lambda: not _sleepers(mark), timeout=10, what="the setup's processes to be gone")


def _sleepers(mark: str) -> list[int]:
    """Processes still running `sleep 600` with ``mark`` in their environment (started by this setup)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if cmdline == b"sleep\x00600\x00" and state != "Z" and mark.encode() in environ:
            found.append(int(pid))
    return found


def test_setup_secrets_reach_the_setup_masked_in_its_log_and_never_the_agents_commands(
    bubblewrap: Bubblewrap, task: tuple[Path, Path]
) -> None:
    checkout, home = task
    declaration = Declaration(
        (
            Step(
                "login",
                'echo "token is $REGISTRY_TOKEN"; echo "ghp_abcdefghijklmnopqrstuvwxyz0123456789"; '
                'echo "REGISTRY_TOKEN=$REGISTRY_TOKEN" >> "$TASUKI_ENV"',
            ),
        )
    )
    outcome = run_setup(declaration, checkout, home, bubblewrap, timeout_s=60, secrets={"REGISTRY_TOKEN": SECRET})
    assert outcome.succeeded
    assert "token is ***" in outcome.log_tail  # it reached the setup, and its log shows it masked
    assert SECRET not in outcome.log_tail
    assert "[GITHUB_TOKEN]" in outcome.log_tail  # the usual masking too
    assert "REGISTRY_TOKEN" not in command_env(home, None, bubblewrap).env  # written to the env file: still dropped


def test_a_working_directory_outside_the_checkout_is_refused(bubblewrap: Bubblewrap, task: tuple[Path, Path]) -> None:
    checkout, home = task
    outcome = run_setup(
        Declaration((Step("escape", "touch x", working_directory="../.."),)), checkout, home, bubblewrap, timeout_s=60
    )
    assert outcome.exit_code == 1
    assert "not a path inside the checkout" in outcome.log_tail
