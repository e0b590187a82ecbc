"""One delivery of ``tasuki.run_task``: take the baton (create or resume the context), run, hand on.

A delivery for a context that is held by a live worker, or already finished, is dropped: the context
lock, not Celery, decides who runs a task (SPEC §5).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from agent import fencing
from agent.fencing import fence_of
from agent.finish_gate import FinishGate, remove_scratch
from agent.instructions import NESTED_SHARE, InstructionFiles, OwnerInstructions, open_with_instructions
from agent.loop import Agent, AgentLimits, Cancelled, Compressor, Finished
from agent.prompts import SYSTEM_PROMPT, task_message
from agent.tools.toolbox import Toolbox
from agent.tools.workspace import Workspace
from contexts import (
    Context,
    ContextCompletedError,
    ContextExistsError,
    ContextStore,
    FencedError,
    InvalidUUIDError,
    LockHeldError,
    TasukiError,
)
from contexts.atomic import DiskFullError
from contexts.errors import StoreUnavailable
from contexts.lock import heartbeat_age_s, holder_alive
from contexts.masking import mask
from contexts.state import read_state
from sandbox.egress import RefusalLog, egress_policy, egress_proxy
from sandbox.jail import backend, make_sandbox
from worker.attempt_work import attempt_work
from worker.attempts import attempt_note
from worker.checkout import Checkout
from worker.environment import EnvironmentReport, TaskEnvironment, maybe_sweep, repository_of
from worker.evidence import base_checks, checks_failed, files_touched, pull_request_body, task_page
from worker.forges.base import CredentialError
from worker.grading import grade_work, recover
from worker.inbox import Inbox
from worker.instructions import CommitInstructions
from worker.leftout import LeftOut, NeverCommitted, with_note
from worker.mcp_tools import task_toolbox
from worker.metering import Meter
from worker.services import services_for
from worker.settings_models import Settings
from worker.stops import Stop, commit_message, draft_body, last_words, stop_of
from worker.threads import thread_history
from worker.workcopy import GitCache

log = structlog.get_logger(__name__)


class EvalEnvironmentFailed(TasukiError):
    """An eval task whose row's environment could not be set up: it ends before its first model call."""

UNTESTED = "The task stopped before its finish: Tasuki ran no checks on this work."


@dataclass(frozen=True)
class TaskRequest:
    """What a task is asked to do; JSON in the Celery message (never a secret)."""

    task_key: dict[str, str]
    prompt: str = ""
    repo_path: str | None = None
    repo_url: str | None = None
    issue: dict[str, Any] | None = None
    user: str | None = None
    team: str | None = None  # the submitter's team (auth.teams, issue 40): its calls' cost counts toward its budget
    config: dict[str, Any] = field(default_factory=dict)
    trigger: dict[str, Any] = field(default_factory=dict)  # how it started: {"kind": "label"|"comment"|"api", ...}
    # A follow-up on a pull/merge request a task opened (SPEC §14): {"kind": "review"|"comment"|"ci"|"retry",
    # "pull_kind", "pull", "branch", "previous" (UUID), "review_id"?, "comments"?, "ci"?}
    followup: dict[str, Any] = field(default_factory=dict)
    # An eval task's (issue 39): {"repository": "owner/name", "setup": str | None}: the environment's cache key names
    # this repository (not the row's bare remote), and ``setup`` takes the place of the repository's declaration.
    environment: dict[str, Any] | None = None
    # An eval task's held-back tests (worker/grading.py): {"test_patch", "fail_to_pass", "pass_to_pass",
    # "test_command", "parser"}; such a task neither recalls nor writes memory.
    grading: dict[str, Any] | None = None
    # Several attempts (issue 39, docs/attempts.md): ``attempts`` asks for N agents (None: the settings decide);
    # ``attempt`` marks one of them: {"parent", "number", "of", "branch", "parent_task_key"}; it opens no request.
    attempts: int | None = None
    attempt: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRequest:
        """Parse a request, ignoring fields this version does not know."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @property
    def remote(self) -> str:
        """Where the repository is cloned from and the task branch pushed to."""
        if self.repo_path:
            return str(Path(self.repo_path).resolve())  # its real path: one mirror for every spelling of it
        if self.repo_url:
            return self.repo_url
        raise TasukiError("task request has neither repo_path nor repo_url")


@dataclass(frozen=True)
class Workplace:
    """Where a task works: the remote to clone, git's credentials for it, the issue text for the prompt."""

    remote: str
    git_env: Mapping[str, str] | None = None
    issue: dict[str, Any] | None = None


class Reporter(Protocol):
    """Where a task reports besides its context (a forge issue: labels, progress comment, pull request).

    ``begin`` and ``deliver`` failing fails the task; ``on_step`` and ``finish`` failures are only logged.
    """

    def begin(self, state: dict[str, Any]) -> Workplace:
        """The task starts or resumes: mark it on the forge, say where to work."""
        ...

    def on_step(self, state: dict[str, Any]) -> None:
        """An agent step ended (progress)."""
        ...

    def deliver(self, branch: str, summary: str, *, draft: bool = False) -> dict[str, Any]:
        """The work is pushed on ``branch``: open the pull/merge request (a draft for a task stopped by a limit, and
        ``summary`` says why); extra fields for the result."""
        ...

    def finish(self, status: str, state: dict[str, Any], result: dict[str, Any] | None, error: str | None) -> None:
        """The task reached a final status."""
        ...

    def heard(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """A comment for the running task (from its inbox): what the model gets, or None to drop it."""
        ...


@dataclass(frozen=True)
class LocalReporter:
    """A task on a local repository (or a plain URL): nobody to report to."""

    request: TaskRequest

    def begin(self, state: dict[str, Any]) -> Workplace:
        """Clone the request's own remote."""
        return Workplace(self.request.remote, None, self.request.issue)

    def on_step(self, state: dict[str, Any]) -> None:
        """Nothing to show."""

    def deliver(self, branch: str, summary: str, *, draft: bool = False) -> dict[str, Any]:
        """The branch is the result."""
        return {}

    def finish(self, status: str, state: dict[str, Any], result: dict[str, Any] | None, error: str | None) -> None:
        """Nothing to show."""

    def heard(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Everything said is passed on."""
        return entry


def cannot_start(
    uuid: str,
    report: Reporter,
    on_finish: Callable[[str, str], None] | None,
    base_dir: Path,
    exc: Exception,
) -> dict[str, Any]:
    """No context can be created (an unwritable or full contexts root): fail visibly — log, forge, Celery
    result — and free the task key, so the issue can be triggered again once the disk is fixed."""
    error = mask(f"cannot create the context under {base_dir}: {getattr(exc, 'strerror', None) or exc}")
    log.error("task cannot start", error=error)
    try:
        report.finish("failed", {"status": "failed", "error": error}, None, error)
    except Exception as report_error:
        log.warning("failure not reported", error=mask(str(report_error))[:300])
    if on_finish is not None:
        on_finish(uuid, "failed")
    return {"uuid": uuid, "status": "failed", "error": error}


class ReportingAgent(Agent):
    """The agent loop with a hook after every step (progress reports, cancels flagged from other hosts) and
    the comments that arrived meanwhile, appended for the next model request."""

    def __init__(self, *args: Any, after_step: Callable[[], None], inbox: Inbox | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_step = after_step
        self.inbox = inbox

    def step(self) -> None:
        """One step of :class:`Agent`, then the hook (also after the step that finished), then the comments:
        every call of the step is answered by now, so a user message cannot split a call from its result.
        Comments that came in while the model was deciding to finish outweigh the finish: the task goes on
        with them (they were written to it, and once it ends nothing would read them)."""
        try:
            super().step()
        except Finished:
            self.after_step()
            if not self._hear():
                raise
            log.info("comments arrived as the task finished; it goes on with them")
            return
        self.after_step()
        self._hear()

    def _hear(self) -> int:
        """Append the inbox's new comments as user messages and write the step; returns how many."""
        if self.inbox is None:
            return 0
        heard = self.inbox.hear(self.ctx)
        if heard:
            self.ctx.step_done()
        self.inbox.taken()  # only now: a crash before this step is on disk leaves the comments in the list
        return heard


def branch_name(task_key: dict[str, str], uuid: str) -> str:
    """``tasuki/{task_id}-{uuid[:8]}``."""
    return f"tasuki/{task_key['task_id']}-{uuid[:8]}"


def acquire(store: ContextStore, uuid: str, request: TaskRequest, config: dict[str, Any]) -> Context | None:
    """Create the context, or resume it; ``None`` when this delivery must be dropped."""
    try:
        # A context the fleet already has (its holder on another host was lost) is resumed straight away: a create
        # the store refuses would first stage and fsync a directory for nothing, on the failover's path.
        here = store.running_path(uuid).is_dir() or store.completed_path(uuid).is_dir()
        if not here and not store.durable.knows(uuid):
            try:
                # The request goes into metadata.json: the monitor re-enqueues a lost task from it.
                return store.create(
                    request.task_key, config, user=request.user, uuid=uuid, extra_metadata={"request": asdict(request)}
                )
            except ContextExistsError:
                pass  # another delivery created it a moment ago
        return store.open(uuid)
    except LockHeldError as exc:
        log.info("delivery dropped: context held by a live worker", reason=str(exc))
    except ContextCompletedError:
        log.info("delivery dropped: context already finished")
    return None


def vanished_holder_wait(store: ContextStore, uuid: str) -> float | None:
    """Seconds until the lock of a holder gone from this host turns stale (its pool child was killed, the
    OOM case), so a requeued delivery can come back then; ``None`` when the holder may be alive."""
    try:
        holder = store.read_lock(uuid)
    except (LockHeldError, InvalidUUIDError):
        return None
    # Only a holder of this host that is provably gone (not merely a pid alive in another namespace) defers.
    if holder is None or holder.hostname != store.hostname or holder_alive(holder, store.hostname):
        return None
    # SPEC §4 keeps a fresh lock even when its process is gone; one heartbeat more covers clock granularity.
    return max(store.stale_after_s - heartbeat_age_s(holder, store.clock()), 0.0) + store.heartbeat_interval_s


@dataclass
class TaskRun:
    """Everything one delivery needs; ``execute`` returns what the Celery task returns."""

    uuid: str
    request: TaskRequest
    settings: Settings
    store: ContextStore
    provider_for: Callable[[dict[str, Any]], Any]
    compressor: Compressor | None = None
    should_stop: Callable[[], bool] | None = None
    cancel_flagged: Callable[[], bool] = lambda: False
    on_finish: Callable[[str, str], None] | None = None
    reporter: Reporter | None = None
    # (context, checkout path, task text) -> what memory adds to the first prompt ("" for nothing)
    recollect: Callable[[Context, Path, str], str] | None = None
    # (context, query, contents now in the prompt) -> the recall tool's answer; None: no memory in this task
    recall: Callable[[Context, str, set[str]], str] | None = None
    # the task's inbox: read it (entries, items read) without removing anything; trim the oldest N items
    inbox: Callable[[], tuple[list[dict[str, Any]], int]] = lambda: ([], 0)
    inbox_trim: Callable[[int], None] = lambda count: None
    meter: Meter | None = None  # prices and counts model calls, holds the task budget; None: no prices, no caps
    # A holder that ended the task but could not finish its context (a full disk) records how it ended (record_stop);
    # the next holder finishes the context so (stopped) instead of running on.
    stopped: Callable[[], dict[str, Any] | None] = lambda: None
    record_stop: Callable[[dict[str, Any]], None] = lambda outcome: None
    on_environment: Callable[[EnvironmentReport], None] = lambda report: None  # the environment is ready (metrics)
    # This delivery's environment: its spare is made once the task is over (docs/environments.md "Spares")
    environment: TaskEnvironment | None = field(default=None, init=False, repr=False)
    # The commit the task's work is measured against, once this delivery's checkout is prepared (None: not yet)
    base: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.reporter is None:
            self.reporter = LocalReporter(self.request)

    @property
    def report(self) -> Reporter:
        """The task's reporter (local tasks get :class:`LocalReporter`)."""
        assert self.reporter is not None  # noqa: S101 - set in __post_init__
        return self.reporter

    def execute(self, config: dict[str, Any]) -> dict[str, Any]:
        """Run the task to a final status (or drop the delivery)."""
        try:
            ctx = acquire(self.store, self.uuid, self.request, config)
        except (OSError, DiskFullError) as exc:  # an unwritable or full contexts root
            if self.store.running_path(self.uuid).is_dir():  # its context is there, whole: the monitor sends it again
                log.error("context could not be taken up; it is resumed once there is room", error=mask(str(exc))[:300])
                return {"uuid": self.uuid, "status": "unfinished", "error": mask(str(exc))[:300]}
            return self._cannot_start(exc)  # no context can exist: fail visibly now
        except StoreUnavailable as exc:  # the fleet's database out of reach: nothing taken, nothing written here
            wait = self.settings.monitor.interval_s
            log.warning("delivery deferred: the fleet's store is out of reach", retry_in_s=wait, error=str(exc)[:300])
            return {"uuid": self.uuid, "status": "deferred", "retry_in_s": wait}
        if ctx is None:
            return self._not_taken()
        return self._start(ctx)

    def _start(self, ctx: Context) -> dict[str, Any]:
        """Run a context this delivery holds to a final status."""
        state = ctx.read_state()
        log.info("task started", attempt=state.get("attempt"), worker=state.get("worker"))
        # Attempts handed back on a warm shutdown (a rolling restart) are not lost ones: only those count.
        if int(state.get("attempt", 1)) - int(state.get("handbacks", 0) or 0) > self.settings.monitor.max_attempts:
            return self._finish(ctx, "failed", f"gave up after {self.settings.monitor.max_attempts} attempts", None)
        stop = self.stopped()
        if stop is not None:  # its last holder ended it but could not finish the context: finish it as it meant to
            log.info("finishing a task its last holder ended without room to record it", status=stop["status"])
            return self._finish(ctx, stop["status"], stop.get("error"), stop.get("result") or None)
        if self.cancel_flagged() or ctx.cancel_requested_elsewhere:
            return self._finish(ctx, "cancelled", None, None)
        checkout: Checkout | None = None
        fence = fence_of(ctx)
        try:
            with fence.holding():  # every effect outside the context runs under the holder's fence: the forge's first
                workplace = self.report.begin(state)
            followup = self.request.followup
            checkout = Checkout(
                Path(self.settings.contexts.workspaces_dir).absolute() / self.uuid,
                workplace.remote,
                str(followup.get("branch") or (self.request.attempt or {}).get("branch")
                    or branch_name(self.request.task_key, self.uuid)),
                git_env=workplace.git_env,
                continues=bool(followup.get("branch")),  # the pull/merge request's head branch: new commits go on top
                cache=GitCache(Path(self.settings.contexts.git_cache_dir).absolute(),
                               Path(self.settings.contexts.workspaces_dir).absolute(),
                               self.settings.contexts.warm_copy_days * 86400),
                fence=fence,
                never=NeverCommitted.from_settings(self.settings.environments),
            )
            if ctx.previous_holder is not None and fencing.ENFORCED:
                checkout.set_aside()  # a takeover: what the previous holder may still write lands elsewhere
            return self._run(ctx, checkout, workplace)
        except FencedError:
            log.warning("lock taken over by another worker; this delivery stops writing")
            ctx.detach()
            return {"uuid": self.uuid, "status": "fenced"}

        except Exception as exc:
            return self._on_error(ctx, checkout, exc)
        finally:  # the task's commands are over, however it ended: the copy no longer slows them
            if self.environment is not None:
                self.environment.after_task()

    def _cannot_start(self, exc: Exception) -> dict[str, Any]:
        ended = cannot_start(self.uuid, self.report, self.on_finish, self.store.base_dir, exc)
        try:  # no context will ever say how it ended: whoever waits on it (`tasuki submit --wait`) learns it here
            self.record_stop({"status": "failed", "error": ended["error"], "result": {}})
        except Exception as record_error:
            log.warning("stop not recorded", error=mask(str(record_error))[:300])
        return ended

    def _not_taken(self) -> dict[str, Any]:
        """A delivery that did not get the context: dropped, or deferred when its holder was killed here."""
        wait = vanished_holder_wait(self.store, self.uuid)
        if wait is None:
            return {"uuid": self.uuid, "status": "dropped"}
        log.info("delivery deferred: the holder's process is gone; retry once its lock is stale", retry_in_s=wait)
        return {"uuid": self.uuid, "status": "deferred", "retry_in_s": wait}

    def _run(self, ctx: Context, checkout: Checkout, workplace: Workplace) -> dict[str, Any]:
        sandbox = make_sandbox(self.settings.sandbox)  # a sandbox that cannot run here fails the task before it starts
        user = sandbox.user  # who its commands run as, when the worker is root
        state = ctx.read_state()
        # Never run before: no message yet, and no earlier attempt (one killed before its first message, in its
        # environment's setup, had already pushed its claim).
        fresh = not ctx.pinned and int(state.get("attempt") or 1) <= 1
        resumed = checkout.prepare(fresh=fresh, steps=int(state.get("llm_call_count", 0)))
        checkout.hand_over(user)  # the setup runs as the sandbox's user too
        if checkout.lease.latest:  # the commit this holder leases its checkpoint pushes on
            ctx.stage_state(checkpoint=checkout.lease.latest)
        # What "changed nothing" is measured against: the commit the task's first holder started from (a resumed
        # holder's checkout may start from a moved default branch, or from the branch an earlier holder pushed).
        base = state.get("base") or checkout.tree.base
        if base and not state.get("base"):
            ctx.stage_state(base=base)
        self.base = base  # from now on an ending can tell whether the task changed anything
        owner_files = CommitInstructions(checkout, base)  # the owner's instruction files: the start commit's
        environment = self._prepare_environment(ctx, checkout)
        checkout.hand_over(user)  # what a restore copied or laid (a snapshot's files are the sandbox user's already)
        # Started again on a resume; stopped when the loop ends, however it ends (a hand-back, a failure).
        with services_for(checkout, self._repository, self.settings) as services:
            roles = {record.get("role") for record in ctx.pinned}
            if "user" not in roles:  # a new task, or one whose first worker died between these two writes
                if "system" not in roles:
                    ctx.append_message("system", SYSTEM_PROMPT)
                open_with_instructions(ctx, owner_files, int(ctx.metadata["config"]["context_length"]))
                task = task_message(self.request.prompt, workplace.issue, self._history())
                task = "\n\n".join(part for part in (task, environment.first_message(), services,
                                                       attempt_note(self.request.attempt)) if part)
                remembered = self.recollect(ctx, checkout.path, task) if self.recollect is not None else ""
                ctx.append_message("user", f"{task}\n\n{remembered}" if remembered else task)
                ctx.step_done(status="processing")  # one state write: the first prompt is there, the model is next
            # Masked at the source: it becomes the commit message, the Celery result (Flower) and the PR's body.
            # The egress proxy lives as long as the agent's commands, and the MCP servers as long as its tools.
            with self._egress(ctx) as egress, self._tools(ctx, checkout, egress) as toolbox:
                agent = self._agent(ctx, checkout, ctx.metadata["config"], egress, owner_files, toolbox)
                summary = mask(agent.run())
        evidence = agent.evidence
        if evidence and evidence.get("removed"):  # again: a resume on another host rebuilt the tree with them
            remove_scratch(Workspace(checkout.path), [str(path) for path in evidence["removed"]])
        left_out = LeftOut()
        if resumed or agent.touched:  # else the tree is the start commit's: no git status needed to know
            checkout.commit(f"tasuki: {summary.splitlines()[0][:60] if summary else 'task'}\n\n{summary}")
            left_out = checkout.left_out()
        note = left_out.describe()
        if not checkout.changed_since(base):
            return self._unchanged(ctx, checkout, summary, note)
        graded = self._grade(ctx, checkout)  # before the push, which takes the commit only
        checkout.push()  # after an owner check, and leased: a fenced holder's push is refused by the remote
        result = {"summary": summary, "branch": checkout.branch, "commit": checkout.head(), **graded,
                  **self._attempt_work(checkout, evidence)}
        if note:
            result["left_out"] = note
        draft = checks_failed(evidence)  # a draft when the checks fail on the tree as delivered
        if draft:
            result["checks"] = "failed"
        body = self._body(ctx, checkout, with_note(summary, note), evidence)
        with fence_of(ctx).holding():  # the pull/merge request lands only while this holder holds the task
            result.update(self.report.deliver(checkout.branch, body, draft=draft))
        return self._finish(ctx, "completed", None, result, checkout)

    @property
    def _repository(self) -> str:
        """The repository the task's environment and services belong to."""
        return repository_of(self.request.task_key, self.request.repo_path, self.request.environment)

    def _prepare_environment(self, ctx: Context, checkout: Checkout) -> EnvironmentReport:
        """Keep, restore or build the task's environment (an eval's own setup script, when it has one); an eval task
        whose last holder stopped mid-grading gets the committed files back first (worker/grading.py)."""
        setup = (self.request.environment or {}).get("setup")
        self.environment = TaskEnvironment(self.settings, self._repository, on_report=self.on_environment, setup=setup)
        report = self.environment.prepare(ctx, checkout)
        if self.request.grading:
            recover(ctx, checkout, self.settings)
            if report.outcome == "failed":  # its grade would measure the environment, not the agent: no model call
                raise EvalEnvironmentFailed(f"the eval row's environment setup failed ({report.why_failed}); the row "
                                            "is not run, since its tests could not be trusted to run")
        return report

    def _attempt_work(self, checkout: Checkout, evidence: dict[str, Any] | None) -> dict[str, Any]:
        """One of several attempts: what the pick weighs (worker/attempt_tasks.py); ``{}`` for any other task."""
        return {"attempt_work": attempt_work(checkout, self.base, evidence)} if self.request.attempt else {}

    def _grade(self, ctx: Context, checkout: Checkout) -> dict[str, Any]:
        """An eval task's held-back tests, run on the committed work in the sandbox: ``{"grade": ...}`` for its
        result; ``{}`` for a task that is no eval."""
        if not self.request.grading or not self.base:
            return {}
        return {"grade": grade_work(ctx, checkout, self.request.grading, self.base, self.settings)}

    def _body(self, ctx: Context, checkout: Checkout, text: str, evidence: dict[str, Any] | None,
              untested: str = "") -> str:
        """The pull/merge request's body: ``text``, then the evidence (the checks, the files the branch changed since
        the base, the task's figures and its console page)."""
        return pull_request_body(text, evidence, files_touched(checkout, self.base), ctx.read_state(),
                                 task_page(self.settings.console.public_url, self.uuid),
                                 priced=self.settings.prices_known(), untested=untested)

    def _unchanged(self, ctx: Context, checkout: Checkout, summary: str, note: str) -> dict[str, Any]:
        """The task changed nothing: no branch is pushed and no pull/merge request opened (a follow-up pushes
        nothing to its request's branch); it completes, and its summary comment says so."""
        checkout.drop_checkpoints()  # after an owner check, and leased like every push
        log.info("task changed nothing; no branch pushed")
        result: dict[str, Any] = {"summary": summary, "unchanged": True}
        if note:
            result["left_out"] = note
        return self._finish(ctx, "completed", None, result, checkout)

    def _history(self) -> str:
        """What the thread's previous task did, for a follow-up."""
        previous = self.request.followup.get("previous")
        return thread_history(self.store, str(previous)) if previous else ""

    def _on_error(self, ctx: Context, checkout: Checkout | None, exc: Exception) -> dict[str, Any]:
        """The final status an exception out of the loop means (or a hand-back on warm shutdown)."""
        stop = stop_of(exc, self.settings)
        if stop is not None:  # steps, time, budget, a model that stays down: the work so far goes out as a draft
            return self._stop_on_limit(ctx, checkout, stop)
        if isinstance(exc, Cancelled):
            if self.should_stop is not None and self.should_stop() and not ctx.read_state().get("cancel_requested"):
                if checkout is not None:
                    checkout.settle()  # the next holder may be on another host: the last checkpoint goes out
                ctx.update_state(add={"handbacks": 1})  # not a lost attempt: it does not count towards the cap
                ctx.release()  # warm shutdown: hand the baton back; another worker resumes at once
                log.info("task handed back on shutdown")
                return {"uuid": self.uuid, "status": "handed_back"}
            return self._end_undelivered(ctx, checkout, "cancelled", str(exc))
        if isinstance(exc, CredentialError | EvalEnvironmentFailed):  # said in one line where it arose: no traceback
            return self._end_undelivered(ctx, checkout, "failed", str(exc))
        if isinstance(exc, StoreUnavailable):  # the fleet's database out of reach for a whole lease, mid-task
            return self._hand_back_unreachable(ctx, exc)
        log.exception("task failed")
        error = mask(f"{type(exc).__name__}: {exc}".splitlines()[0])[:2000]
        return self._end_undelivered(ctx, checkout, "failed", error)

    def _end_undelivered(self, ctx: Context, checkout: Checkout | None, status: str, error: str) -> dict[str, Any]:
        """An ending that delivers nothing (a cancel, a failure that is no limit): a task that changed nothing takes
        its checkpoint branch with it, so nothing of it stays in the repository; one that did change something
        keeps it (the only copy of that work). Only the holder deletes it: the delete is fenced and leased like
        every push."""
        if checkout is not None and self.base is not None:
            try:
                if not checkout.work_changed_since(self.base):
                    checkout.drop_checkpoints()
            except FencedError:
                log.warning("lock taken over as the task ended; this delivery stops writing")
                ctx.detach()
                return {"uuid": self.uuid, "status": "fenced"}
            except Exception as drop_error:  # the ending is still recorded and reported
                log.warning("checkpoint branch not removed", error=mask(str(drop_error))[:300])
        return self._finish(ctx, status, error, None, checkout)

    def _hand_back_unreachable(self, ctx: Context, exc: StoreUnavailable) -> dict[str, Any]:
        """The fleet's store out of reach for a whole lease: another host may hold the task by now, so this holder
        writes nothing more and frees the host's lock; the delivery is sent again, and whoever takes it resumes
        from the last commit once the store is back."""
        wait = self.settings.monitor.interval_s
        log.warning("the fleet's store was out of reach for the lease; the task is handed back for a later delivery",
                    retry_in_s=wait, error=str(exc)[:300])
        ctx.release()
        return {"uuid": self.uuid, "status": "deferred", "retry_in_s": wait}

    def _stop_on_limit(self, ctx: Context, checkout: Checkout | None, stop: Stop) -> dict[str, Any]:
        """The task reached a limit (or its model stayed down): what it changed is delivered as a draft that says
        why, and it ends ``failed`` (``timeout``) with its reason; nothing changed, nothing is left behind."""
        log.info("task stopped by a limit", reason=stop.reason, error=stop.error)
        result: dict[str, Any] | None = None
        if checkout is not None and self.base is not None:
            try:
                result = self._deliver_unfinished(ctx, checkout, stop)
            except FencedError:
                log.warning("lock taken over as the task stopped; this delivery stops writing")
                ctx.detach()
                return {"uuid": self.uuid, "status": "fenced"}
        return self._finish(ctx, stop.status, stop.error, result, checkout, reason=stop.reason)

    def _deliver_unfinished(self, ctx: Context, checkout: Checkout, stop: Stop) -> dict[str, Any] | None:
        """Commit the work as unfinished, push the task branch (its checkpoints go with that push) and open the
        draft; None when the task changed nothing (its checkpoint branch is deleted then). A push that fails keeps
        the work on the checkpoint branch; a draft the forge would not open leaves the pushed branch as the result."""
        words = last_words(ctx)
        try:
            checkout.commit(commit_message(stop, words))
            note = checkout.left_out().describe()
            if not checkout.changed_since(self.base):
                checkout.drop_checkpoints()  # leased like every push: a fenced holder's delete is refused
                return None
            checkout.push()
        except FencedError:
            raise
        except Exception as push_error:
            log.warning("the work so far was not pushed; it stays on the checkpoint branch",
                        error=mask(str(push_error))[:300])
            with contextlib.suppress(Exception):
                checkout.checkpoint(int(ctx.read_state().get("llm_call_count", 0)))
                checkout.settle()
            return None
        result: dict[str, Any] = {"branch": checkout.branch, "commit": checkout.head(), "stopped": stop.why}
        if words:
            result["summary"] = words
        if note:
            result["left_out"] = note
        try:
            with fence_of(ctx).holding():  # the draft lands only while this holder holds the task
                body = self._body(ctx, checkout, with_note(draft_body(stop, words), note), None, untested=UNTESTED)
                result.update(self.report.deliver(checkout.branch, body, draft=True))
        except FencedError:
            raise
        except Exception as deliver_error:  # the branch is pushed: it is the result, and the issue is still told
            log.warning("the draft was not opened; the work is on its branch", error=mask(str(deliver_error))[:300])
        return result

    def _egress(self, ctx: Context) -> AbstractContextManager[Path | None]:
        """The task's egress proxy, its commands' only way out with network ``full`` or ``allowlist`` (SPEC §17;
        none with ``none``, nor with ``sandbox.backend: none``, which confines nothing); each refusal is logged and
        staged into ``state.json``'s ``egress_refused``, written with the step that made it."""
        s = self.settings.sandbox
        recorded = ctx.read_state().get("egress_refused") or []
        refusals = RefusalLog(lambda entries: ctx.stage_state(egress_refused=entries), recorded)
        policy = egress_policy(s.network, s.allowed_hosts, s.allowed_internal) if backend(s.backend).confines else None
        return egress_proxy(policy, refusals.add)

    def _tools(self, ctx: Context, checkout: Checkout, egress: Path | None) -> AbstractContextManager[Toolbox]:
        """The task's tools while its agent runs: the built-ins and its MCP servers' (worker/mcp_tools.py)."""
        sandbox = make_sandbox(self.settings.sandbox, read_only=checkout.shared_paths).with_egress(egress)
        return task_toolbox(self.settings.mcp, self.settings, ctx, checkout, self.base, sandbox, egress)

    def _agent(self, ctx: Context, checkout: Checkout, config: dict[str, Any], egress: Path | None = None,
               owner_files: InstructionFiles | None = None, toolbox: Toolbox | None = None) -> Agent:
        s = self.settings
        limits = AgentLimits(
            max_steps=s.agent.max_steps,
            context_length=int(config["context_length"]),
            tool_output_max_chars=s.agent.tool_output_max_chars,
            bash_timeout_s=s.agent.bash_timeout_s,
            max_format_errors=s.agent.max_format_errors,
            max_repeats=s.agent.max_repeats,
        )
        policy = s.compression.policy(float(config.get("compression_threshold", s.compression.threshold)))
        return ReportingAgent(
            ctx,
            self.provider_for(config),
            checkout,
            limits,
            policy,
            compressor=self.compressor,
            should_stop=self.should_stop,
            sandbox=make_sandbox(s.sandbox, read_only=checkout.shared_paths).with_egress(egress),
            sandbox_limits=s.sandbox.limits,
            after_step=lambda: self._after_step(ctx),
            recall=(lambda query, in_prompt: self.recall(ctx, query, in_prompt)) if self.recall is not None else None,
            inbox=Inbox(self.inbox, self.inbox_trim, self.report.heard),
            meter=self.meter,
            toolbox=toolbox,
            instructions=OwnerInstructions(owner_files, int(NESTED_SHARE * limits.context_length))
            if owner_files is not None else None,
            gate=self._gate(checkout),
        )

    def _gate(self, checkout: Checkout) -> FinishGate | None:
        """The task's finish gate (None when ``agent.finish_gate`` is off), its checks read from the base commit."""
        s = self.settings.agent
        if not s.finish_gate:
            return None
        return FinishGate(self.base, base_checks(checkout, self.base, s.checks), s.check_timeout_s, checkout.work_tree)

    def _after_step(self, ctx: Context) -> None:
        state = ctx.read_state()
        if not state.get("cancel_requested") and (ctx.cancel_requested_elsewhere or self.cancel_flagged()):
            # `tasuki cancel` or the API on a host that cannot see this context: the Redis flag, and in a fleet the
            # durable copy (which the step's commit just read), is all it set.
            state = ctx.update_state(cancel_requested=True)
        # The fence outside the try: a fenced holder stops here, it does not just skip a report.
        with fence_of(ctx).holding():
            try:
                self.report.on_step(state)
            except CredentialError:
                raise  # no token can be had any more: the task cannot push or deliver, so it ends now
            except Exception as exc:
                log.warning("progress not reported", error=mask(str(exc))[:300])

    def _finish(
        self,
        ctx: Context,
        status: str,
        error: str | None,
        result: dict[str, Any] | None,
        checkout: Checkout | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {"result": result} if result else {}
        if reason is not None:
            extra["reason"] = reason
        try:
            path = ctx.finish(status, error=error, **extra)
        except FencedError:
            log.warning("lock taken over before completion; this delivery stops writing")
            ctx.detach()
            return {"uuid": self.uuid, "status": "fenced"}
        except Exception as exc:  # e.g. a full disk: leave the context whole and give the lock up
            return self._unfinished(ctx, status, error, result, exc)
        if checkout is not None:
            checkout.release()
            try:  # the hourly sweep rides on task endings, as the warm copies' eviction does
                maybe_sweep(self.settings, time.time())
            except OSError as exc:
                log.warning("environment snapshots not swept", error=str(exc)[:300])
        try:
            self.report.finish(status, read_state(path), result, error)
        except Exception as exc:
            log.warning("finish not reported", error=mask(str(exc))[:300])
        if self.on_finish is not None:
            self.on_finish(self.uuid, status)
        log.info("task finished", status=status, error=error)
        return {"uuid": self.uuid, "status": status, "error": error, **(result or {})}

    def _unfinished(self, ctx: Context, status: str, error: str | None, result: dict[str, Any] | None,
                    exc: Exception) -> dict[str, Any]:
        """The task ended but its context could not be finished (a full disk). Said at once — recorded for the next
        holder and for ``tasuki submit --wait``, and on the forge — and the lock given up (detaching would leave a
        lock whose live holder keeps it from ever going stale; an unlink needs no free space): once there is room
        the monitor sends the task again and the next holder finishes the context as this one meant to."""
        why = mask(f"the context could not be finished ({type(exc).__name__}: {exc})".splitlines()[0])[:500]
        told = f"{error}; {why}" if error else why
        outcome = {"status": status, "error": told, "result": result or {}}
        try:
            self.record_stop(outcome)
        except Exception as record_error:  # Redis too: the next holder resumes the task instead
            log.warning("stop not recorded", error=mask(str(record_error))[:300])
        ctx.release()
        log.error("task ended but its context could not be finished; finished once there is room", status=status,
                  error=told)
        try:
            self.report.finish(status, {**ctx.read_state(), "status": status, "error": told}, result, told)
        except Exception as report_error:
            log.warning("stop not reported", error=mask(str(report_error))[:300])
        return {"uuid": self.uuid, "status": "unfinished", "error": told}
