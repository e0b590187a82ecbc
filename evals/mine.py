"""``tasuki eval mine``: a task set from a repository's own history (issue 39).

Each merged change of the default branch (its first-parent history, newest first) that touches tests and code
becomes a row: ``base_commit`` its first parent, ``patch`` its code part, ``test_patch`` its test part, the problem
statement from the issue it resolves (:mod:`evals.statements`). ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` come from
running the test patch's files in the sandbox (:mod:`evals.testbed`), twice before the code patch and twice after: a
test whose two runs disagree is left out; a row whose tests fail before and pass after (stably) is kept, any other
is dropped with its reason. The pure part — what the four runs make of a row — is :func:`classify`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from evals.history import Change, MineError, SourceUnreachable, default_head, diff, first_parent_changes, git, resolve
from evals.statements import Statements
from evals.tasksets import Row
from evals.testbed import Testbed, TestRun
from sandbox.test_results import PASSED, parse_results, test_command, test_files
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

RUNS = 2  # of each side, before and after: a test is kept only when its runs agree
NOT_RUN = "missing"  # a test one run names and another does not (a collection error before the fix)
_OWNER_REPO = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9_.][A-Za-z0-9_.-]*)$")
_REMOTE = re.compile(r"[/:]([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9_.][A-Za-z0-9_.-]*?)(?:\.git)?/?$")


class SetupFailed(MineError):
    """The environment could not be built: nothing can be mined (the setup's last line says why)."""


@dataclass(frozen=True)
class Verdict:
    """What the four runs of a change's tests make of it: its test lists, or why it is dropped."""

    fail_to_pass: list[str]
    pass_to_pass: list[str]
    unstable: list[str]
    reason: str | None = None


def _status(results: Mapping[str, str], test: str) -> str:
    return results.get(test, NOT_RUN)


def classify(before: Sequence[Mapping[str, str]], after: Sequence[Mapping[str, str]]) -> Verdict:
    """FAIL_TO_PASS: not passing in every run before and passing in every run after; PASS_TO_PASS: passing in every
    run; a test whose runs on one side disagree is unstable and in neither. Dropped (``reason``) when the runs after
    name no test, or no test fails before and passes after."""
    if not any(after):
        return Verdict([], [], [], "the tests reported no result after the change")
    tests = sorted({test for results in (*before, *after) for test in results})
    f2p, p2p, unstable = [], [], []
    for test in tests:
        was = {_status(results, test) for results in before}
        now = {_status(results, test) for results in after}
        if len(was) > 1 or len(now) > 1:
            unstable.append(test)
        elif now == {PASSED} and was == {PASSED}:
            p2p.append(test)
        elif now == {PASSED}:
            f2p.append(test)
    if not f2p:
        why = "no test fails before the change and passes after it"
        return Verdict([], p2p, unstable, f"{why} ({len(unstable)} unstable)" if unstable else why)
    return Verdict(f2p, p2p, unstable)


@dataclass(frozen=True)
class MineOptions:
    """What ``tasuki eval mine`` was asked for."""

    source: str
    repo: str | None = None  # the rows' owner/name (default: the source's OWNER/REPO, or its origin remote)
    limit: int | None = None  # rows kept at most
    since: str | None = None  # only the changes after this revision
    setup: str | None = None
    test_command: str | None = None
    parser: str = "pytest"
    forge: bool = True
    timeout_s: int = 600  # of one test run


@dataclass
class MineReport:
    """What a mining run did: rows kept, changes dropped and why, the time each took."""

    source: str
    repo: str
    head: str = ""
    changes: int = 0  # of the first-parent history walked
    candidates: int = 0  # changes touching tests and code
    kept: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    setup: dict[str, Any] | None = None
    statements_from_forge: int = 0
    forge_error: str | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The ``--report`` file."""
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


def repository_name(source: str, repo_dir: Path | None, given: str | None) -> str:
    """The rows' ``owner/name``: given, the source's own ``OWNER/REPO``, the clone's origin remote, else
    ``local/<directory>``."""
    if given is not None:
        if not _OWNER_REPO.match(given):
            raise MineError(f"--repo {given!r} is not owner/name")
        return given
    if repo_dir is None:
        return source
    origin = git(repo_dir, "config", "--get", "remote.origin.url", check=False).strip()
    match = _REMOTE.search(origin) if ("://" in origin and not origin.startswith("file:")) or "@" in origin else None
    if match:
        return f"{match[1]}/{match[2]}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", repo_dir.resolve().name.removesuffix(".git")).strip("-.") or "repo"
    return f"local/{name}"


def is_forge_name(source: str) -> bool:
    """``OWNER/REPO`` that is no existing path."""
    return bool(_OWNER_REPO.match(source)) and not Path(source).exists()


def clone_source(options: MineOptions, settings: Settings, into: Path) -> Path:
    """A bare clone of the source at ``into``: a local repository's, or ``OWNER/REPO``'s from GitHub (through the
    API's clone URL, with the configured credentials)."""
    if not is_forge_name(options.source):
        path = Path(options.source)
        default_head(path)  # MineError: not a git repository
        git(into.parent, "clone", "-q", "--bare", str(path.resolve()), str(into))
        return into
    from worker.forges import ForgeError, GitHubForge

    owner, name = options.source.split("/", 1)
    token = settings.secrets.github_token.get_secret_value() if settings.secrets.github_token else None
    forge = GitHubForge(str(settings.github.api_url), token, timeout_s=30, backoff_s=0.2)
    try:
        clone_url = forge.repository(owner, name).clone_url
        env = dict(forge.git_env(clone_url))
    except ForgeError as exc:
        raise SourceUnreachable(f"{options.source}: not reachable on {settings.github.api_url} "
                                f"({str(exc).splitlines()[0][:200]})") from None
    finally:
        forge.close()
    _clone_with(clone_url, into, env, options.source)
    return into


def _clone_with(url: str, into: Path, env: Mapping[str, str], name: str) -> None:
    done = subprocess.run(["git", "clone", "-q", "--bare", url, str(into)], capture_output=True, text=True,
                          timeout=1800, check=False, env={**os.environ, **env, "GIT_TERMINAL_PROMPT": "0"})
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise SourceUnreachable(f"{name}: the clone failed: {why[:300]}")


def statements_for(repo: str, settings: Settings, enabled: bool) -> Statements:
    """Problem statements through the GitHub API when asked for and the repository has a real owner/name."""
    owner, name = repo.split("/", 1)
    if not enabled or owner == "local":
        return Statements(owner, name)
    from worker.forges import GitHubForge

    token = settings.secrets.github_token.get_secret_value() if settings.secrets.github_token else None
    forge = GitHubForge(str(settings.github.api_url), token, timeout_s=10, backoff_s=0.2)
    return Statements(owner, name, forge.read_item)


@dataclass
class Miner:
    """One mining run over a cloned repository, in its testbed."""

    options: MineOptions
    settings: Settings
    testbed: Testbed
    statements: Statements
    report: MineReport
    on_row: Callable[[Row | None, Change, str | None], None] = field(default=lambda row, change, why: None)
    _ids: set[str] = field(default_factory=set)
    _setup_s: float = 0.0
    _unstable: list[str] = field(default_factory=list)  # of the change being mined: its tests whose runs disagreed

    def run(self) -> list[Row]:
        """Walk the history, newest first, until ``limit`` rows are kept."""
        started = time.monotonic()
        rows: list[Row] = []
        head = default_head(self.testbed.git_dir)
        since = resolve(self.testbed.git_dir, self.options.since) if self.options.since else None
        self.report.head = head
        for change in first_parent_changes(self.testbed.git_dir, head, since):
            if self.options.limit is not None and len(rows) >= self.options.limit:
                break
            self.report.changes += 1
            if not change.candidate:
                continue
            self.report.candidates += 1
            row, why, seconds = self.mine_change(change)
            entry = {"commit": change.commit, "seconds": round(seconds, 2), "unstable": self._unstable}
            if row is None:
                self.report.dropped.append({**entry, "reason": why})
            else:
                rows.append(row)
                self.report.kept.append({**entry, "instance_id": row.instance_id,
                                         "fail_to_pass": len(row.FAIL_TO_PASS), "pass_to_pass": len(row.PASS_TO_PASS)})
            self.on_row(row, change, why)
        self.report.statements_from_forge = self.statements.from_forge
        self.report.forge_error = self.statements.forge_error
        self.report.duration_s = round(time.monotonic() - started, 2)
        return rows

    def mine_change(self, change: Change) -> tuple[Row | None, str | None, float]:
        """The change's row, or None and why it is dropped; and the seconds it took."""
        started, setup_before = time.monotonic(), self._setup_s
        self._unstable = []
        try:
            row, why = self._mine(change)
        except SetupFailed:
            raise  # no change can be mined without its environment
        except MineError as exc:
            row, why = None, str(exc)
        return row, why, time.monotonic() - started - (self._setup_s - setup_before)  # the setup is reported apart

    def _mine(self, change: Change) -> tuple[Row | None, str | None]:
        repo = self.testbed.git_dir
        test_patch = diff(repo, change.base, change.commit, change.test_files)
        patch = diff(repo, change.base, change.commit, [*change.code_files, *change.other_files])
        files = test_files(test_patch)
        if not files:
            return None, "the change deletes its test files only"
        self.testbed.reset(change.base)
        self._ensure_environment()
        self.testbed.apply(test_patch, "test patch")
        command = test_command(self.options.test_command, self.options.parser, files)
        before = [self._results(command) for _ in range(RUNS)]
        self.testbed.apply(patch, "code patch")
        after = [self._results(command) for _ in range(RUNS)]
        verdict = classify(before, after)
        self._unstable = verdict.unstable
        if verdict.reason is not None:
            return None, verdict.reason
        statement, number = self.statements.for_change(change.message)
        return Row(
            instance_id=self._instance_id(number, change.commit), repo=self.report.repo,
            base_commit=change.base, problem_statement=statement, test_patch=test_patch, patch=patch,
            FAIL_TO_PASS=verdict.fail_to_pass, PASS_TO_PASS=verdict.pass_to_pass, setup=self.options.setup,
            test_command=self.options.test_command, test_parser=self.options.parser,
        ), None

    def _ensure_environment(self) -> None:
        if self.report.setup is not None:
            return
        started = time.monotonic()
        outcome = self.testbed.build_environment(self.options.setup)
        self._setup_s += time.monotonic() - started
        self.report.setup = {"built": False, "reason": "nothing declared"} if outcome is None else {
            "built": outcome.succeeded, "duration_s": round(outcome.duration_s, 2), "exit_code": outcome.exit_code,
            "created": list(outcome.created), "log_tail": outcome.log_tail if not outcome.succeeded else ""}
        if outcome is not None and not outcome.succeeded:
            said = [line for line in outcome.log_tail.splitlines() if line.strip() and not line.startswith("== ")]
            how = "timed out" if outcome.timed_out else f"exit code {outcome.exit_code}"
            raise SetupFailed(f"the environment's setup failed ({how}): "
                              f"{(said or ['no output'])[-1][:200]}")

    def _results(self, command: str) -> dict[str, str]:
        run: TestRun = self.testbed.run_tests(command, self.options.timeout_s)
        if run.timed_out:
            raise MineError(f"the tests timed out after {self.options.timeout_s} s")
        return parse_results(self.options.parser, run.output)

    def _instance_id(self, number: int | None, commit: str) -> str:
        owner, name = self.report.repo.split("/", 1)
        wanted = f"{owner}__{name}-{number}" if number is not None else f"{owner}__{name}-{commit[:12]}"
        if wanted in self._ids:
            wanted = f"{owner}__{name}-{commit[:12]}"
        self._ids.add(wanted)
        return wanted


def mine(options: MineOptions, settings: Settings,
         on_row: Callable[[Row | None, Change, str | None], None] | None = None) -> tuple[list[Row], MineReport]:
    """Clone the source, walk its history and make the rows; the temporary clone is removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="tasuki-mine-"))
    try:
        if options.repo is not None:
            repository_name(options.source, None, options.repo)  # a bad --repo before any clone
        testbed = Testbed(root, settings, "")
        clone_source(options, settings, testbed.git_dir)
        repo = repository_name(options.source, None if is_forge_name(options.source) else Path(options.source),
                               options.repo)
        testbed.repository = repo
        report = MineReport(options.source, repo)
        miner = Miner(options, settings, testbed, statements_for(repo, settings, options.forge), report,
                      on_row or (lambda row, change, why: None))
        rows = miner.run()
        if miner.report.setup is not None and miner.report.setup.get("built") is False and not rows:
            log.warning("no row kept; the environment's setup failed", setup=miner.report.setup)
        return rows, report
    finally:
        shutil.rmtree(root, ignore_errors=True)
