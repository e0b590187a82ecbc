"""A new user's clock (issue 41, "Measured"): from a fresh clone to the first task's pull request, following
docs/tutorial.md with ``tasuki init``, against the fake GitHub (``tests/helpers/fake_forge.py``, real HTTP and git)
and the replay model, every command a real process.

The commands are the tutorial's, typed in order and counted as the user types them (a shell line is one command):
``git clone``, ``cd``, ``./tasuki init --yes …`` (flags, non-interactive), ``./tasuki doctor`` (the CLI itself loads
the ``tasuki.env`` init wrote beside ``config.yaml``), ``./tasuki up`` (timed until it prints ``running (``),
``./tasuki submit --repo you/calc --issue 1 --wait`` (until it exits, with a pull request on the fake forge). A
command the tutorial's text does not make work as written and has to be retyped (``init`` refusing the checkout's
own ``config.yaml``) counts twice.

What is not on the clock: the fake forge and the replay model (they stand for the user's GitHub and model), and
installing ``.venv`` from PyPI: the clone's ``.venv`` links to this checkout's (the README's Quick start time
covers the install), and ``PYTHONPATH`` points at the clone so that its code, not this checkout's editable install,
runs. The intake's port is a free one (``TASUKI__WEBHOOK__PORT``) since 8080 may be taken on a shared machine.

Baseline, same run: the bare ``./tasuki submit --wait`` of the same task (issue 2, same text) on the host now
configured and running (1 in --quick, 3 in full, median). The ratio says how much of a newcomer's first run is
setting up rather than the task itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Result, standalone
from cli.demo_data import DEMO_FILES, DEMO_TRAJECTORY
from tests.helpers.fake_forge import FakeForge
from tests.helpers.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ghp_bench_first_task"  # noqa: S105 - the fake forge's token
STEP_TIMEOUT_S = 300.0
UP_READY = "running ("
ISSUE = ("add() subtracts", "The test suite fails: test_add. Fix the bug.")


@dataclass
class Step:
    """One command the user typed: the line, its seconds, whether it did what the tutorial says."""

    line: str
    seconds: float
    ok: bool
    note: str = ""


class Session:
    """The user's shell: a working directory, an environment, and the commands typed so far."""

    def __init__(self, cwd: Path, env: dict[str, str], logs: Path) -> None:
        self.cwd, self.env, self.logs = cwd, env, logs
        self.steps: list[Step] = []
        self.up: subprocess.Popen[bytes] | None = None  # `tasuki up`, once typed

    def run(
        self, line: str, argv: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Type one command and wait for it, as a shell would."""
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=self.cwd, env={**self.env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=STEP_TIMEOUT_S, check=False)  # fmt: skip
        self.steps.append(Step(line, time.perf_counter() - start, done.returncode == 0))
        (self.logs / f"{len(self.steps):02d}.log").write_text(f"$ {line}\n{done.stdout}{done.stderr}")
        return done

    def typed(self, line: str, note: str = "") -> None:
        """A shell built-in (cd, sourcing a file): typed, no process worth timing."""
        self.steps.append(Step(line, 0.0, True, note))


def _calc_repository(path: Path) -> Path:
    """The demo's calc project as the user's repository on the fake GitHub."""
    path.mkdir(parents=True)
    for name, text in DEMO_FILES.items():
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=you", "-c", "user.email=you@example.org"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-qm", "calc"], cwd=path, check=True)
    return path


def _fresh_clone(scratch: Path) -> tuple[list[str], Path]:
    """The `git clone` command of this checkout's HEAD, and where the clone goes."""
    return ["git", "clone", "-q", str(ROOT), str(scratch / "tasuki")], scratch / "tasuki"


def _share_venv(clone: Path) -> None:
    """Give the clone a .venv made of this checkout's (bin, lib and pyvenv.cfg shared), stamped with the clone's
    pyproject.toml so that the launcher uses it as installed: nothing is installed, and nothing is written into
    this checkout's .venv (whose own stamp may be older than its pyproject.toml)."""
    venv, mine = ROOT / ".venv", clone / ".venv"
    mine.mkdir()
    for name in ("bin", "lib", "include"):
        if (venv / name).exists():
            (mine / name).symlink_to(venv / name)
    (mine / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (mine / ".tasuki-installed").write_text(hashlib.sha256((clone / "pyproject.toml").read_bytes()).hexdigest() + "\n")


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], deadline_s: float) -> bool:
    """Poll `path` until it holds `text` (True) or the process exits or the deadline passes (False)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `tasuki up` (it stops its worker, beat, intake and Redis), then SIGKILL to its group if need be."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of its session is left (it was started in its own)
    process.wait(10)


def _submit(session: Session, issue: int) -> tuple[float, bool]:
    line = f"./tasuki submit --repo you/calc --issue {issue} --wait"
    done = session.run(line, ["./tasuki", "submit", "--repo", "you/calc", "--issue", str(issue), "--wait"])
    return session.steps[-1].seconds, done.returncode == 0 and "pull request:" in done.stdout + done.stderr


def run(scratch: Path, quick: bool = False) -> list[Result]:
    """Clone, init, doctor, up, submit: the tutorial end to end; then the bare submit on the configured host."""
    scratch.mkdir(parents=True, exist_ok=True)
    logs = scratch / "logs"
    logs.mkdir()
    home = scratch / "home"
    home.mkdir()
    trajectory = scratch / "calc-fix.jsonl"
    trajectory.write_text("".join(json.dumps(turn) + "\n" for turn in DEMO_TRAJECTORY))
    clone_argv, clone = _fresh_clone(scratch)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(clone),
        "TASUKI__WEBHOOK__PORT": str(free_port()),
    }
    baselines = 1 if quick else 3
    with FakeForge(scratch / "forge", token=TOKEN).serve() as forge:
        forge.add_repo("you", "calc", _calc_repository(scratch / "calc"))
        for number in range(1, 2 + baselines):
            forge.add_item("you", "calc", number, *ISSUE, labels=[])
        session = Session(scratch, env, logs)
        session.run(f"git clone {ROOT} tasuki", clone_argv)
        _share_venv(clone)
        session.cwd = clone
        session.typed("cd tasuki")
        port = free_port()
        model = subprocess.Popen(["./tasuki", "replay-model", "--trajectory", str(trajectory), "--port", str(port)],
                                 cwd=clone, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            _wait_model(port, model)
            _configure_and_start(session, clone, forge, port, logs, env)
            first_s, first_ok = _submit(session, 1)
            prs = [c for c in forge.changes if c.owner == "you" and c.repo == "calc"]
            if not first_ok or not prs:
                last_log = logs / f"{len(session.steps):02d}.log"
                raise RuntimeError(f"the first task opened no pull request: {last_log.read_text()[-2000:]}")
            user_steps = list(session.steps)
            bare = [_submit(session, number) for number in range(2, 2 + baselines)]
            if not all(ok for _, ok in bare) or len(forge.changes) != 1 + baselines:
                raise RuntimeError("a baseline submit opened no pull request")
        finally:
            if session.up is not None:
                _stop(session.up)
            _stop_model(model)
    return _report(user_steps, first_s, [seconds for seconds, _ in bare], quick)


def _configure_and_start(
    session: Session, clone: Path, forge: FakeForge, port: int, logs: Path, env: dict[str, str]
) -> None:
    """The tutorial's steps 2 and 4: init (retyped with --force if it refuses), doctor, up (each reads the env file
    init wrote: nothing is sourced)."""
    flags = ["--yes", "--forge", "github", "--api-url", forge.github_api_url, "--model-provider", "openai",
             "--model", "replay", "--base-url", f"http://127.0.0.1:{port}/v1", "--api-key-env", "REPLAY_KEY",
             "--network", "none", "--broker", "embedded", "--store", "none",
             "--webhook-url", "https://tasuki.example.org"]  # fmt: skip
    secrets = {"GITHUB_TOKEN": TOKEN, "REPLAY_KEY": "unused"}
    init = session.run("GITHUB_TOKEN=… REPLAY_KEY=unused ./tasuki init --yes …", ["./tasuki", "init", *flags], secrets)
    if init.returncode != 0 and "--force" in init.stdout + init.stderr:
        session.steps[-1].note = "refused: the checkout's config.yaml exists"
        session.run(
            "GITHUB_TOKEN=… REPLAY_KEY=unused ./tasuki init --yes … --force",
            ["./tasuki", "init", *flags, "--force"],
            secrets,
        )
    session.run("./tasuki doctor", ["./tasuki", "doctor"])
    up_log = logs / "up.log"
    start = time.perf_counter()
    with up_log.open("wb") as sink:
        up = subprocess.Popen(["./tasuki", "up"], cwd=clone, env=session.env, stdout=sink,
                              stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    session.up = up
    ready = _wait_for(up_log, UP_READY, up, STEP_TIMEOUT_S)
    session.steps.append(Step("./tasuki up", time.perf_counter() - start, ready, "until `running (`"))
    if not ready:
        raise RuntimeError(f"tasuki up did not start: {up_log.read_text()[-2000:]}")


def _wait_model(port: int, model: subprocess.Popen[bytes]) -> None:
    """Poll the replay model's port until it answers (it stands for a model already running)."""
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if model.poll() is not None:
            raise RuntimeError("the replay model exited")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the replay model did not listen within 60 s")


def _stop_model(model: subprocess.Popen[bytes]) -> None:
    model.terminate()
    try:
        model.wait(10)
    except subprocess.TimeoutExpired:
        model.kill()
        model.wait(10)


def _report(steps: list[Step], first_s: float, bare: list[float], quick: bool) -> list[Result]:
    """Each command with its seconds, the total, and the total against the bare submit."""
    total = sum(step.seconds for step in steps)
    processes = sum(1 for step in steps if step.seconds > 0)
    print("a new user's clock, docs/tutorial.md on the fake GitHub and the replay model (.venv shared, not timed):")
    for number, step in enumerate(steps, 1):
        note = f"  ({step.note})" if step.note else ""
        print(f"  {number}. {step.line:<58} {step.seconds:6.1f} s  {'ok' if step.ok else 'FAILED'}{note}")
    bare_s = statistics.median(bare)
    ratio = total / bare_s
    print(
        f"first task: {len(steps)} commands typed ({processes} programs run), {total:.1f} s from clone to pull "
        f"request; the first submit --wait {first_s:.1f} s; bare submit --wait on the configured host {bare_s:.1f} s "
        f"(median of {len(bare)}): {ratio:.2f}x"
    )
    return [
        Result("first task: commands typed", str(len(steps)), "—", None),
        Result("first task: seconds / bare submit", f"{ratio:.2f}", "—", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
