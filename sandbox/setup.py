"""The setup runner (SPEC §17): a declaration's steps, run in the task's sandbox before the agent's first step.

Each step is ``bash -e`` in its working directory (relative to the checkout), with the setup's network, the env
files applied (what one step adds, the next one has) and, for the setup only, the worker's variables named in
``environments.setup_secrets``. One deadline covers every step; past it the running step's whole process group is
killed. The output goes to a private file and only its masked tail is kept: the secret values themselves, then
:func:`contexts.masking.mask`. What the setup created in the checkout is what ``git status`` lists as untracked
or ignored afterwards and did not list before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import structlog

from contexts.masking import mask
from sandbox import confine, envfiles
from sandbox.jail import Sandbox, command_env
from sandbox.settings import SandboxLimits

log = structlog.get_logger(__name__)

TAIL_LINES = 40
_TAIL_BYTES = 64 * 1024  # read from the end of the log: enough for TAIL_LINES of long lines
_LINE_CHARS = 400  # a progress bar redrawn in one line is cut
SECRET_SHOWN = "***"  # noqa: S105 - what a secret value is replaced with in the log
# The checkout's .git is the agent's (a setup's steps, too, write it): the worker's git reads its own git directory
# beside the checkout instead, with the checkout as the work tree (worker/gitdirs.py), and runs nothing a config could
# name; nor does it look into nested repositories (`status` runs git in each submodule, whose config is the agent's).
_SAFE_GIT = ("git", "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-c", "safe.directory=*",
             "-c", "submodule.recurse=false")
WORKER_GIT_SUFFIX = ".git"  # {workspaces_dir}/{uuid}.git: the worker's git directory of the checkout {uuid}


def worker_git_dir(checkout: Path) -> Path:
    """The worker's own git directory of ``checkout``, beside it and bound into no sandbox (worker/gitdirs.py)."""
    return checkout.with_name(f"{checkout.name}{WORKER_GIT_SUFFIX}")


class Step(Protocol):
    """One step of a declaration (``sandbox.declarations.SetupStep``)."""

    @property
    def name(self) -> str: ...
    @property
    def script(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def working_directory(self) -> str: ...


class Steps(Protocol):
    """What the runner needs of a ``sandbox.declarations.Declaration``."""

    @property
    def source(self) -> str: ...
    @property
    def steps(self) -> Sequence[Step]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def github_files(self) -> bool: ...


@dataclass(frozen=True)
class SetupOutcome:
    """How a setup went; ``log_tail`` is masked."""

    exit_code: int | None  # None: it was killed at its deadline
    duration_s: float
    timed_out: bool
    log_tail: str
    created: tuple[str, ...]  # paths the setup left in the checkout (as git lists them: a directory ends in /)

    @property
    def succeeded(self) -> bool:
        """Every step exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out


def run_setup(
    declaration: Steps,
    checkout: Path,
    home: Path,
    sandbox: Sandbox,
    *,
    timeout_s: float,
    secrets: Mapping[str, str] | None = None,
    limits: SandboxLimits | None = None,
) -> SetupOutcome:
    """Run ``declaration``'s steps in ``sandbox`` on ``checkout`` with the task's ``home``; never raises for what
    the steps do (a failing step, a timeout): the outcome says it."""
    secrets = dict(secrets or {})
    started = time.monotonic()
    deadline = started + timeout_s
    before = untracked(checkout)
    envfiles.prepare(home)
    for tree in (checkout, home):  # the steps run as the sandbox's user when the worker is root (sandbox.confine)
        confine.hand_over(tree, sandbox.user)
    scratch = Path(tempfile.mkdtemp(prefix="tasuki-setup-"))  # 0700: the raw log holds the secrets' values
    code: int | None = 0
    try:
        # Appending, unbuffered: the steps write to the same file, each write lands at its end.
        with (scratch / "log").open("a+b", buffering=0) as output:
            output.write("".join(f"note: {note}\n" for note in declaration.notes).encode())
            for step in declaration.steps:
                output.write(f"== {step.name} ({step.working_directory})\n".encode())
                output.flush()
                code = _run_step(
                    step, declaration.github_files, checkout, home, sandbox, secrets, limits, deadline, output
                )
                if code != 0:
                    output.write(f"== {step.name}: {_ending(code)}\n".encode())
                    break
            tail = _tail(output, secrets)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    created = tuple(sorted(untracked(checkout) - before))
    duration = time.monotonic() - started
    log.info("environment setup ran", source=declaration.source, exit_code=code, duration_s=round(duration, 1))
    return SetupOutcome(code, duration, code is None, tail, created)


def _ending(code: int | None) -> str:
    if code is None:
        return "killed at the setup's deadline (environments.setup_timeout_s)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def step_env(
    step: Step, github_files: bool, home: Path, sandbox: Sandbox, secrets: Mapping[str, str]
) -> dict[str, str]:
    """A step's environment: the agent's (scrubbed, env files applied) and the step's own variables; the secrets
    reach the step by another way (:meth:`Sandbox.launch_env`: never on a command line)."""
    env = command_env(home, step.env, sandbox).env
    if github_files:
        env["GITHUB_ENV"], env["GITHUB_PATH"] = env["TASUKI_ENV"], env["TASUKI_PATH"]
    return {name: value for name, value in env.items() if name not in secrets}


def _run_step(
    step: Step,
    github_files: bool,
    checkout: Path,
    home: Path,
    sandbox: Sandbox,
    secrets: Mapping[str, str],
    limits: SandboxLimits | None,
    deadline: float,
    output: IO[bytes],
) -> int | None:
    """Run one step to its end (its exit code) or to the deadline (None); nothing it started outlives it."""
    directory = step.working_directory or "."
    if directory.startswith("/") or ".." in directory.split("/"):
        output.write(f"working-directory {directory!r} is not a path inside the checkout\n".encode())
        return 1
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    # cd first, then the step's script as bash -e runs it (its own $0 names the step in bash's messages).
    inner = [
        "bash",
        "-c",
        'cd -- "$1" || exit 1; exec bash -e -c "$2" "$3"',
        "setup",
        directory,
        step.script,
        step.name,
    ]
    env = step_env(step, github_files, home, sandbox, secrets)
    argv, cwd = sandbox.command(inner, checkout, home, env, inherit=tuple(secrets))
    user = sandbox.user
    confine.hand_over_call(checkout, home, user)
    with confine.confined(argv, limits, int(remaining) + 1, user=user, disk=confine.task_disk(sandbox, home)) as call:
        proc = subprocess.Popen(
            call.argv,
            cwd=cwd,
            env=sandbox.launch_env(env, secrets),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        call.started(proc.pid)
        try:
            code: int | None = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the step's session: whatever it left running goes too
            proc.wait()
    for line in [*call.notes, *filter(None, [call.disk_error])]:
        output.write(f"tasuki: {line}\n".encode())
    if call.disk_error is not None and code == 0:
        code = 1  # the step was cut short: it did not succeed
    return code



def _tail(output: IO[bytes], secrets: Mapping[str, str]) -> str:
    """The log's last lines, the secrets' values replaced, then masked (as a whole: a PEM block spans lines)."""
    size = output.seek(0, os.SEEK_END)
    output.seek(max(size - _TAIL_BYTES, 0))
    text = output.read().decode("utf-8", errors="replace")
    if size > _TAIL_BYTES:
        text = text.split("\n", 1)[-1]  # the first line is cut
    # Longest first: a secret that contains another is replaced whole.
    for value in sorted((v for v in secrets.values() if v), key=len, reverse=True):
        text = text.replace(value, SECRET_SHOWN)
    return "\n".join(line[:_LINE_CHARS] for line in mask(text).splitlines()[-TAIL_LINES:])


def untracked(checkout: Path) -> set[str]:
    """The untracked and ignored paths git lists in ``checkout`` (a directory once, ending in /), by the worker's git
    directory of it; empty when git cannot tell (no such directory)."""
    git_dir = worker_git_dir(checkout)
    if not git_dir.is_dir():
        log.warning("what the setup created is not known: the checkout has no worker's git directory")
        return set()
    env = {"PATH": os.environ.get("PATH", os.defpath), "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
    env.update(GIT_DIR=str(git_dir), GIT_WORK_TREE=str(checkout))
    try:
        done = subprocess.run(
            [*_SAFE_GIT, "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=normal",
             "--ignore-submodules=all"],
            cwd=checkout,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("what the setup created is not known: git status failed", error=str(exc)[:200])
        return set()
    if done.returncode != 0:
        log.warning(
            "what the setup created is not known: git status failed",
            error=done.stderr.decode(errors="replace").strip()[-200:],
        )
        return set()
    entries = done.stdout.decode("utf-8", errors="surrogateescape").split("\0")
    return {entry[3:] for entry in entries if entry[:3] in ("?? ", "!! ")}
