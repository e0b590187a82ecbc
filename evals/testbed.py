"""Where ``tasuki eval mine`` runs a change's tests (issue 39): one work tree per mined repository, its environment
built once, and the tests run in the sandbox with no network.

The work tree's git directory is a bare clone beside it, bound into no sandbox: the repository's tests (which the
miner does not trust more than an agent's commands) see the files and nothing of git. The environment is built by
the setup script given to ``eval mine --setup`` (it becomes each row's ``setup``), else the repository's own
declaration (:func:`sandbox.declarations.find_declaration`), with the setup's network through an egress proxy, the
way a task's is (``environments.setup_network``, ``sandbox.allowed_internal``, ``environments.setup_secrets``). What
the setup created in the work tree (``.venv/``) is kept when the tree moves to the next change's base.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from agent.tools.protocol import ToolOptions
from agent.tools.shell import BashTool, exit_code_of
from agent.tools.workspace import Workspace
from evals.history import MineError, git
from sandbox import confine
from sandbox.declarations import find_declaration
from sandbox.egress import Refusal, egress_policy, egress_proxy
from sandbox.jail import Sandbox, backend, make_sandbox
from sandbox.setup import SetupOutcome, run_setup, worker_git_dir
from worker.settings_models import Settings

log = structlog.get_logger(__name__)

OUTPUT_MAX_CHARS = 1_000_000  # of a test run's output (the runners' summaries are at its end)


@dataclass(frozen=True)
class TestRun:
    """What one run of a change's test files said: its output, exit code, and whether it timed out."""

    __test__ = False  # pytest: a class named Test* that is no test
    output: str
    exit_code: int | None
    timed_out: bool


@dataclass
class Testbed:
    """A bare clone of the mined repository, a work tree of it and a home, and the sandbox its tests run in."""

    root: Path
    settings: Settings
    repository: str
    created: tuple[str, ...] = ()
    setup_outcome: SetupOutcome | None = None
    _sandbox: Sandbox | None = field(default=None, init=False)

    @property
    def git_dir(self) -> Path:
        return worker_git_dir(self.checkout)  # where sandbox.setup's untracked() looks: what the setup created

    @property
    def checkout(self) -> Path:
        return self.root / "work"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def tree_git(self, *args: str, stdin: str | None = None) -> str:
        """git on the work tree, with the git directory beside it."""
        return git(self.checkout, f"--git-dir={self.git_dir}", f"--work-tree={self.checkout}", *args, stdin=stdin)

    def sandbox(self) -> Sandbox:
        """The tests' sandbox: the configured one, network none."""
        if self._sandbox is None:
            self._sandbox = make_sandbox(self.settings.sandbox.model_copy(update={"network": "none"}))
        return self._sandbox

    def reset(self, commit: str) -> None:
        """The work tree at ``commit``, exactly, but for what the setup created."""
        self.checkout.mkdir(exist_ok=True)
        self.home.mkdir(mode=0o700, exist_ok=True)
        self.tree_git("checkout", "-q", "-f", "--detach", commit)
        kept = [arg for path in self.created for arg in ("-e", "/" + path.rstrip("/"))]
        self.tree_git("clean", "-q", "-ffdx", *kept)
        confine.hand_over(self.checkout, self.sandbox().user)
        confine.hand_over(self.home, self.sandbox().user)

    def apply(self, patch: str, what: str) -> None:
        """Apply a patch to the work tree; MineError saying ``what`` did not apply."""
        try:
            self.tree_git("apply", "--whitespace=nowarn", "-", stdin=patch)
        except MineError as exc:
            raise MineError(f"the {what} does not apply: {str(exc).removeprefix('git apply failed: ')}") from None
        confine.hand_over(self.checkout, self.sandbox().user)

    def build_environment(self, setup: str | None) -> SetupOutcome | None:
        """Run the setup (``setup``, else the repository's declaration) once, on the current tree; None when nothing
        is declared. A setup that fails is the caller's to report (the tests will say what is missing)."""
        environments = self.settings.environments
        declaration = find_declaration(self.checkout, self.repository, environments, setup)
        if declaration is None:
            return None
        sandbox_settings = self.settings.sandbox
        policy = egress_policy(environments.setup_network, sandbox_settings.allowed_hosts,
                               sandbox_settings.allowed_internal)
        confines = backend(sandbox_settings.backend).confines  # "none" runs on the host: no proxy to go through
        network = make_sandbox(sandbox_settings.model_copy(update={"network": environments.setup_network}))
        with egress_proxy(policy if confines else None, _refused) as egress:
            outcome = run_setup(declaration, self.checkout, self.home, network.with_egress(egress),
                                timeout_s=environments.setup_timeout_s, secrets=_secrets(environments.setup_secrets),
                                limits=sandbox_settings.limits)
        self.created, self.setup_outcome = outcome.created, outcome
        log.info("mining environment " + ("built" if outcome.succeeded else "failed"), source=declaration.source,
                 duration_s=round(outcome.duration_s, 1), created=list(outcome.created)[:10])
        return outcome

    def run_tests(self, command: str, timeout_s: int) -> TestRun:
        """Run ``command`` (bash) in the work tree, in the sandbox with no network."""
        options = ToolOptions(bash_timeout_s=timeout_s, max_output_chars=OUTPUT_MAX_CHARS, sandbox=self.sandbox(),
                              limits=self.settings.sandbox.limits, home=self.home)
        outcome = BashTool().run(Workspace(self.checkout), {"command": command}, options)
        lines = outcome.output.splitlines()
        code = exit_code_of(lines[-1]) if lines else None
        output = "\n".join(lines[:-1] if code is not None else lines)
        timed_out = outcome.error is not None and "timed out" in outcome.error
        return TestRun(output, code, timed_out)

    def close(self) -> None:
        """Remove the clone, the work tree and the home."""
        shutil.rmtree(self.root, ignore_errors=True)



def _secrets(names: tuple[str, ...]) -> dict[str, str]:
    """The miner's variables named in ``environments.setup_secrets`` (for the setup only, as a task's)."""
    return {name: os.environ[name] for name in names if name in os.environ}


def _refused(refusal: Refusal) -> None:
    log.warning("mining setup egress refused", host=refusal.host, port=refusal.port, reason=refusal.reason)
