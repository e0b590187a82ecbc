"""The ``bash`` tool: one command in the checkout, in its own process group, with a scrubbed environment."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from agent.tools.output import OutputCapture
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.workspace import ToolError, Workspace
from contexts.lock import process_started
from sandbox import confine, envfiles, layers
from sandbox.jail import command_env

log = structlog.get_logger(__name__)

# After the command exits, output still buffered in the pipe is read for at most this long.
_DRAIN_S = 5.0
# Without pidfd (not Linux) the exit of the command is noticed by polling this often.
_POLL_S = 0.05
_READ_SIZE = 65536

_EXIT_LINE = re.compile(r"^exit code: (-?\d+)")  # the last line of every finished call


class BashTool:
    """``bash(command, timeout_s?)``: run a shell command in the checkout."""

    name = "bash"
    changes_checkout = True
    description = (
        "Run a bash command in the repository root and return its combined stdout and stderr and exit code. "
        "Each call is a fresh shell: no state (cd, variables, background processes) survives between calls, "
        "but $HOME does (for the whole task), and lines added to $TASUKI_ENV (KEY=VALUE) and $TASUKI_PATH "
        "(a directory) apply to every later call. "
        "stdin is empty; long output is cut in the middle."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command line to run."},
            "timeout_s": {
                "type": "integer",
                "description": "Seconds before the command is killed (capped by the operator's limit).",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        """Run the command; a timeout kills its whole process group and is reported as an error."""
        command: str = arguments["command"]
        requested: int | None = arguments.get("timeout_s")
        if requested is not None and requested <= 0:
            raise ToolError(f"timeout_s must be a positive integer, got {requested}")
        if "\x00" in command:
            raise ToolError("command contains a NUL byte")
        timeout_s = min(requested or options.bash_timeout_s, options.bash_timeout_s)
        # The task's home lasts for the task; a caller without one (a test, a tool run alone) gets one per call.
        home = options.home or Path(tempfile.mkdtemp(prefix="tasuki-bash-"))
        try:
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            envfiles.prepare(home)
            applied = command_env(home, options.env, options.sandbox, workspace.root)
            argv, cwd = options.sandbox.command(["bash", "-c", command], workspace.root, home, applied.env)
            user = options.sandbox.user
            if options.home is None:  # a tool run alone: its checkout was never handed over to the sandbox's user
                confine.hand_over(workspace.root, user)
            confine.hand_over_call(workspace.root, home, user)
            launch_env = options.sandbox.launch_env(applied.env)
            disk = confine.task_disk(options.sandbox, home)
            with confine.confined(argv, options.limits, timeout_s + 1, user=user, disk=disk) as call:

                def started(pid: int) -> None:
                    call.started(pid)
                    if options.on_start is not None:
                        options.on_start(pid)

                code, text, timed_out = run_command(
                    call.argv, cwd, launch_env, timeout_s, options.max_output_chars, on_start=started
                )
        finally:
            if options.home is None:
                layers.remove_home(home)
        body = "".join(f"[tasuki: env files: {reason}]\n" for reason in applied.refused)
        body += text if not text or text.endswith("\n") else text + "\n"
        body += "".join(f"[tasuki: {note}]\n" for note in call.notes)
        if call.disk_error is not None:
            return ToolOutcome(f"{body}[tasuki: {call.disk_error}]\n{_describe_exit(code)}", error=call.disk_error)
        if timed_out:
            message = f"command timed out after {timeout_s} s"
            return ToolOutcome(f"{body}[{message}; it and every process it started were killed]", error=message)
        return ToolOutcome(body + _describe_exit(code))


def exit_code_of(line: str) -> int | None:
    """The exit status a bash call's last line reports (``_describe_exit``'s line), None when it reports none:
    the finish gate's checks, an eval's grading and the miner's test runs read it back."""
    match = _EXIT_LINE.match(line)
    return int(match.group(1)) if match else None


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"exit code: {code} (killed by {signal.Signals(-code).name})"
    return f"exit code: {code}"


def run_command(
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_chars: int,
    *,
    on_start: Callable[[int], None] | None = None,
) -> tuple[int, str, bool]:
    """Run ``argv`` (``bash -c command``, maybe inside a sandbox); return (exit code, capped output, timed out).

    Every process the command started is killed when it returns, so nothing outlives the tool call.
    """
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None  # noqa: S101 - stdout=PIPE guarantees it
    out_fd = proc.stdout.fileno()
    capture = OutputCapture(max_chars)
    pidfd = _open_pidfd(proc.pid)
    try:
        if on_start is not None:
            on_start(proc.pid)  # its own session: the pid is the process group of everything it starts
        with selectors.DefaultSelector() as selector:
            selector.register(out_fd, selectors.EVENT_READ)
            exited = _read_until_exit(selector, out_fd, proc.pid, pidfd, capture, deadline=time.monotonic() + timeout_s)
            # The leader is not reaped yet, so its process group id cannot have been reused meanwhile.
            _kill_group(proc.pid)
            _drain(selector, out_fd, capture, time.monotonic() + _DRAIN_S)
    finally:
        if pidfd is not None:
            os.close(pidfd)
        proc.stdout.close()
        _kill_group(proc.pid)  # again, in case something above raised before the first kill
        code = proc.wait()
    text, _ = capture.result()
    return code, text, not exited


def _open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux 5.3+), without reaping it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, keeping the process group id ours until the group is killed.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read_until_exit(
    selector: selectors.BaseSelector,
    out_fd: int,
    pid: int,
    pidfd: int | None,
    capture: OutputCapture,
    *,
    deadline: float,
) -> bool:
    """Collect output until the command exits (True) or the deadline passes (False)."""
    if pidfd is not None:
        selector.register(pidfd, selectors.EVENT_READ)
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(remaining if pidfd is not None else min(remaining, _POLL_S)):
                if key.fd == pidfd:
                    return True
                _read_into(selector, out_fd, capture)
            if pidfd is None and _has_exited(pid):
                return True
        return False
    finally:
        if pidfd is not None:
            selector.unregister(pidfd)


def _drain(selector: selectors.BaseSelector, out_fd: int, capture: OutputCapture, deadline: float) -> None:
    """Read what is left in the pipe; a process that left the group may hold it open, hence the deadline."""
    while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
        for _ in selector.select(remaining):
            _read_into(selector, out_fd, capture)


def _read_into(selector: selectors.BaseSelector, out_fd: int, capture: OutputCapture) -> None:
    chunk = os.read(out_fd, _READ_SIZE)
    if chunk:
        capture.feed(chunk)
    else:
        selector.unregister(out_fd)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop_leftover(pgid: int, started: int | None, timeout_s: float = 10.0) -> bool:
    """Kill the process group of a command a dead worker left running, when its leader is provably that
    command (same start time: a reused pid is left alone); True when something was killed."""
    if started is None or process_started(pgid) != started:
        return False
    _kill_group(pgid)
    deadline = time.monotonic() + timeout_s
    while process_started(pgid) == started and time.monotonic() < deadline:
        time.sleep(_POLL_S)  # the leader is not our child: nothing to wait on but /proc
    return True
