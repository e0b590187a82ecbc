"""One trial of issue 26 §1 with real parts: a worker with a hostname of its own is stopped (SIGSTOP of its whole
process tree) at a point the trial chooses, past the stale time, while a worker on another host takes its task
over and finishes it; then it is continued (SIGCONT). Whatever the stopped worker does after that must reach
nothing: not the task branch or any ref of the remote, not the forge, not the context.

The points are events the trial controls, never a speed: inside a ``bash`` call (the call waits for a file the
trial creates), or at the finish boundary (the final commit's signing program — git's own ``gpg.program``, set in
the worker's global git config — waits for that file), once the checkpoint of the step before is on the remote.

``tests/test_fencing_sigstop.py`` runs a handful; ``python -m bench.fencing_trials`` loops many.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.beat_process import BeatProcess
from tests.helpers.celery_worker import WorkerProcess
from tests.helpers.fake_forge import FakeForge
from tests.helpers.stack import Stack, make_buggy_repo
from tests.helpers.worker_scenarios import running_stack

FORGE_TOKEN = "fencing-forge-token-5c1d"
OWNER, REPO, ISSUE = "team", "calc", 7
LAYOUTS = ("shared", "per-host")  # the compose layout (one workspaces volume), or a workspace per host
# Where the holder is stopped, and when it goes on: inside a bash call, continued once the task is done; inside a
# bash call, continued while the new holder is inside the next step's (the issue's case: its line landed in the
# new holder's tree); at the finish boundary, continued once the task is done.
POINTS = ("bash", "bash-mid", "finish")
MONITOR_ENV = {"TASUKI__MONITOR__INTERVAL_S": "1", "TASUKI__MONITOR__BEAT_LOCK_TTL_S": "2"}  # heartbeat 1 s, stale 3 s
FINISHED = '"event": "task finished"'
TIMEOUT_S = 180.0

SIGNER = """#!/bin/sh
# git's gpg.program for the paused worker: the final commit (not a checkpoint) waits once for the trial's release.
payload=$(cat)
case "$payload" in
  *"tasuki: checkpoint"*) ;;
  *) if [ ! -e "{marks}/reached" ]; then
       touch "{marks}/reached"
       while [ ! -e "{marks}/release" ]; do sleep 0.05; done
     fi;;
esac
echo "[GNUPG:] BEGIN_SIGNING" >&2
echo "[GNUPG:] SIG_CREATED D 1 8 00 1700000000 FAKE" >&2
printf -- '-----BEGIN PGP SIGNATURE-----\\n\\nZmFrZQ==\\n-----END PGP SIGNATURE-----\\n'
"""


def can_set_hostnames() -> bool:
    """Whether this machine lets the tests give a worker a hostname of its own (root, or a user namespace)."""
    probe = subprocess.run(["unshare", "--uts", "--", "hostname", "trial-probe"], capture_output=True, check=False)
    return probe.returncode == 0


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (parents before children), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue += parents.get(current, [])
    return found


def stop_tree(pid: int) -> set[int]:
    """SIGSTOP a process and everything below it (a command in its own process group too); until nothing new
    shows up, so a child spawned meanwhile is stopped as well. Returns the stopped processes."""
    stopped: set[int] = set()
    while True:
        fresh = [p for p in descendants(pid) if p not in stopped]
        if not fresh:
            return stopped
        for process in fresh:
            try:
                os.kill(process, signal.SIGSTOP)
                stopped.add(process)
            except ProcessLookupError:
                pass


def continue_tree(stopped: set[int]) -> None:
    """SIGCONT every process :func:`stop_tree` stopped."""
    for process in stopped:
        with suppress(ProcessLookupError):
            os.kill(process, signal.SIGCONT)


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


def trial_turns(point: str, step: int, steps: int, marks: Path) -> list[dict[str, Any]]:
    """``steps`` bash steps, each adding a line naming its step and host to ``log.txt``, then ``finish``; with
    ``point == "bash"`` step ``step`` waits inside its command for the trial's release before it writes."""
    turns = []
    for n in range(steps):
        line = f'echo "step {n} end host=$(hostname)" >> log.txt'
        if point.startswith("bash") and n == step:
            line = f'touch {marks}/reached; while [ ! -e {marks}/release ]; do sleep 0.05; done; {line}'
        if point == "bash-mid" and n == step + 1:  # the new holder's first step waits while the old one goes on
            line = f'touch {marks}/reached-b; while [ ! -e {marks}/release-b ]; do sleep 0.05; done; {line}'
        turns.append({"content": f"Step {n}.", "tool_calls": [bash(line)]})
    turns.append({"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "Logged."}}]})
    return turns


@dataclass
class Trial:
    """One trial's parts and what it saw."""

    root: Path
    stack: Stack
    forge: FakeForge
    layout: str
    point: str
    step: int  # the bash point: the step stopped inside its command
    steps: int  # bash steps before the finish

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    @property
    def bare(self) -> Path:
        return self.forge.git_root / OWNER / f"{REPO}.git"

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.bare, capture_output=True, text=True, check=True).stdout

    def refs(self) -> dict[str, str]:
        """Every ref of the remote (name -> commit)."""
        listed = self.git("for-each-ref", "--format=%(refname) %(objectname)")
        return dict(line.split(" ", 1) for line in listed.splitlines())

    def checkpoint_subject(self, uuid: str) -> str:
        ref = f"refs/heads/tasuki-checkpoints/{ISSUE}-{uuid[:8]}"
        if ref not in self.refs():
            return ""
        return self.git("log", "-1", "--format=%s", ref).strip()

    def forge_state(self) -> str:
        """The forge as the stopped worker could change it: items (labels, comments and their edits), requests."""
        items = [(i.number, sorted(i.labels), [(c.id, c.body, list(c.history)) for c in i.comments])
                 for i in self.forge.items.values()]
        changes = [(c.number, c.head, c.base, c.title, c.body) for c in self.forge.changes]
        return json.dumps([items, changes], sort_keys=True, default=str)

    def context_digest(self, uuid: str) -> str:
        """Every byte of the context, wherever it is."""
        digest = hashlib.sha256()
        for where in ("running", "completed"):
            directory = self.stack.contexts_dir / where / uuid
            for path in sorted(directory.rglob("*")) if directory.is_dir() else []:
                digest.update(str(path.relative_to(self.stack.contexts_dir)).encode())
                if path.is_file():
                    digest.update(path.read_bytes())
        return digest.hexdigest()

    def worker(self, name: str, hostname: str, **env: str) -> WorkerProcess:
        """A task worker on a host of its own (its own workspaces in the per-host layout)."""
        extra = dict(env)
        if self.layout == "per-host":
            extra["TASUKI__CONTEXTS__WORKSPACES_DIR"] = str(self.root / hostname / "workspaces")
            extra["TASUKI__CONTEXTS__GIT_CACHE_DIR"] = str(self.root / hostname / "git-cache")
        worker = WorkerProcess(name, {**self.stack.env(), **extra}, self.root / f"{name}.log", queues="tasks",
                               hostname=hostname)
        self.stack.workers.append(worker)
        return worker.start()


def signer_home(root: Path, marks: Path) -> Path:
    """A HOME whose git config signs commits with :data:`SIGNER` (the paused worker's, at the finish boundary)."""
    home = root / "home-a"
    home.mkdir(mode=0o700)
    signer = home / "sign"
    signer.write_text(SIGNER.format(marks=marks))
    signer.chmod(0o700)
    (home / ".gitconfig").write_text(f"[commit]\n\tgpgsign = true\n[gpg]\n\tprogram = {signer}\n")
    return home


@contextmanager
def forge_with_issue(root: Path) -> Iterator[FakeForge]:
    with FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        forge.add_item(OWNER, REPO, ISSUE, "Log every step")
        yield forge


def forge_env(forge: FakeForge) -> dict[str, str]:
    return {"TASUKI__GITHUB__API_URL": forge.github_api_url, "GITHUB_TOKEN": FORGE_TOKEN,
            "TASUKI__SANDBOX__BACKEND": "none"}  # $(hostname) of the tool is its worker's


def issue_request() -> dict[str, Any]:
    return {"task_key": {"task_source": "github", "owner": OWNER, "repo": REPO, "task_type": "issue",
                         "task_id": str(ISSUE)}, "user": "octocat"}


def run_trial(trial: Trial) -> dict[str, Any]:
    """Stop the holder at the trial's point, let the other host take the task over, continue the holder; assert
    that nothing the holder did after its takeover reached the remote, the forge or the context. Returns the
    task's final state."""
    trial.marks.mkdir(exist_ok=True)
    env = {"HOME": str(signer_home(trial.root, trial.marks))} if trial.point == "finish" else {}
    first = trial.worker("wA", "host-a", **env)
    uuid = trial.stack.send(issue_request())
    before = trial.steps if trial.point == "finish" else trial.step  # the last checkpoint before the point
    trial.stack.wait_until(lambda: (trial.marks / "reached").exists()
                           and trial.checkpoint_subject(uuid) == f"tasuki: checkpoint after step {before}",
                           TIMEOUT_S, f"the holder at its {trial.point} point")
    # The other host is up before the holder stops: the monitor gives up on re-sent deliveries nobody takes, and a
    # worker slow to start on a busy machine once looked like that (the task ended before wB took it).
    second = trial.worker("wB", "host-b")
    stopped = stop_tree(first.pid)
    try:
        if trial.point == "bash-mid":
            trial.stack.wait_until((trial.marks / "reached-b").exists, TIMEOUT_S, "the new holder mid-step")
        else:
            trial.stack.wait_until(lambda: finished(trial, uuid, second), TIMEOUT_S, "the new holder's end")
            seen = trial.refs(), trial.forge_state(), trial.context_digest(uuid)
        (trial.marks / "release").touch()
    finally:
        continue_tree(stopped)
    ended = [f"tasuki.run_task[{uuid}] {how}" for how in ("succeeded", "raised", "ignored")]  # its delivery is over
    trial.stack.wait_until(lambda: any(end in first.log_text() for end in ended), TIMEOUT_S,
                           "the stopped holder's delivery to end")
    if trial.point == "bash-mid":
        (trial.marks / "release-b").touch()
        trial.stack.wait_until(lambda: finished(trial, uuid, second), TIMEOUT_S, "the new holder's end")
    else:  # everything as the new holder left it
        assert trial.refs() == seen[0], "the stopped holder changed the remote after its takeover"
        assert trial.forge_state() == seen[1], "the stopped holder changed the forge after its takeover"
        assert trial.context_digest(uuid) == seen[2], "the stopped holder wrote to the context after its takeover"
    state = trial.stack.completed_state(uuid) or {}
    assert (state.get("status"), state.get("attempt")) == ("completed", 2), state
    assert_one_outcome(trial, uuid, state)
    return state


def finished(trial: Trial, uuid: str, worker: WorkerProcess) -> bool:
    """The task is complete and its worker has reported it (the forge is told after the context, then it logs)."""
    return trial.stack.completed_state(uuid) is not None and FINISHED in worker.log_text()


def assert_one_outcome(trial: Trial, uuid: str, state: dict[str, Any]) -> None:
    """One pull request, whose head is the commit the state records; the branch without the stopped call's line;
    the context with each step's call answered once (the stopped one "not run", by the new holder)."""
    branch = state["result"]["branch"]
    assert [c.head for c in trial.forge.changes] == [branch]  # exactly one pull request
    assert trial.refs()[f"refs/heads/{branch}"] == state["result"]["commit"]
    log = trial.git("show", f"{branch}:log.txt")
    late = f"step {trial.step} end host=host-a"
    if trial.point.startswith("bash"):
        assert f"step {trial.step} end" not in log, log  # the stopped call's line never reached the branch
        assert f"step {trial.steps - 1} end host=host-b" in log, log  # the steps after it are the new holder's
    else:
        assert f"step {trial.steps - 1} end host=host-a" in log, log  # the work, done before the stop, is there
    tools = [json.loads(line) for line in (trial.stack.contexts_dir / "completed" / uuid / "tools.jsonl").open()]
    assert [t["seq"] for t in tools] == list(range(1, trial.steps + 2))  # each call once, then the finish
    assert not any(late in json.dumps(t) for t in tools)
    if trial.layout == "shared" and trial.point.startswith("bash"):  # its checkout was set aside and deleted
        assert not any(late in p.read_text(errors="replace") for p in (trial.root / "workspaces").rglob("log.txt"))


@contextmanager
def trial_stack(root: Path, redis_url: str, layout: str, point: str, step: int = 1, steps: int = 4,
                env: dict[str, str] | None = None) -> Iterator[Trial]:
    """The forge with the issue, the replay model with the trial's turns, the monitor (beat and a maintenance
    worker on this machine's hostname) at test timings; the task workers are the trial's to start. ``env``: more
    settings for every process (fleet mode's store and lease)."""
    marks = root / "marks"
    with forge_with_issue(root) as forge:
        entries = trial_turns(point, step, steps, marks)
        settings = {**MONITOR_ENV, **forge_env(forge), **(env or {})}
        with running_stack(root, redis_url, entries, env=settings) as (stack, _server):
            stack.start_worker("maint", queues="maintenance", pool="solo")
            beat = BeatProcess("beat", stack.env(), root).start()
            try:
                yield Trial(root, stack, forge, layout, point, step, steps)
            finally:
                beat.stop()
