"""One delivery of ``tasuki.run_task``: take the baton (create or resume the context), run, hand on.

A delivery for a context that is held by a live worker, or already finished, is dropped: the context
lock, not Celery, decides who runs a task (SPEC §5).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from celery.exceptions import SoftTimeLimitExceeded

from contexts import (
    CompressionPolicy,
    Context,
    ContextCompletedError,
    ContextExistsError,
    ContextStore,
    FencedError,
    LockHeldError,
    TasukiError,
)
from contexts.masking import mask
from worker.agent import Agent, AgentLimits, Cancelled, Compressor, StepLimit
from worker.checkout import Checkout
from worker.prompts import SYSTEM_PROMPT, task_message
from worker.settings_models import Settings

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TaskRequest:
    """What a task is asked to do; JSON in the Celery message (never a secret)."""

    task_key: dict[str, str]
    prompt: str = ""
    repo_path: str | None = None
    repo_url: str | None = None
    issue: dict[str, Any] | None = None
    user: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRequest:
        """Parse a request, ignoring fields this version does not know."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @property
    def remote(self) -> str:
        """Where the repository is cloned from and the task branch pushed to."""
        if self.repo_path:
            return str(Path(self.repo_path).absolute())
        if self.repo_url:
            return self.repo_url
        raise TasukiError("task request has neither repo_path nor repo_url")


def branch_name(task_key: dict[str, str], uuid: str) -> str:
    """``tasuki/{task_id}-{uuid[:8]}``."""
    return f"tasuki/{task_key['task_id']}-{uuid[:8]}"


def acquire(store: ContextStore, uuid: str, request: TaskRequest, config: dict[str, Any]) -> Context | None:
    """Create the context, or resume it; ``None`` when this delivery must be dropped."""
    try:
        if not store.running_path(uuid).is_dir() and not store.completed_path(uuid).is_dir():
            try:
                return store.create(request.task_key, config, user=request.user, uuid=uuid)
            except ContextExistsError:
                pass  # another delivery created it a moment ago
        return store.open(uuid)
    except LockHeldError as exc:
        log.info("delivery dropped: context held by a live worker", reason=str(exc))
    except ContextCompletedError:
        log.info("delivery dropped: context already finished")
    return None


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

    def execute(self, config: dict[str, Any]) -> dict[str, Any]:
        """Run the task to a final status (or drop the delivery)."""
        ctx = acquire(self.store, self.uuid, self.request, config)
        if ctx is None:
            return {"uuid": self.uuid, "status": "dropped"}
        state = ctx.read_state()
        log.info("task started", attempt=state.get("attempt"), worker=state.get("worker"))
        if int(state.get("attempt", 1)) > self.settings.monitor.max_attempts:
            return self._finish(ctx, "failed", f"gave up after {self.settings.monitor.max_attempts} attempts", None)
        if self.cancel_flagged():
            return self._finish(ctx, "cancelled", None, None)
        checkout = Checkout(
            Path(self.settings.contexts.workspaces_dir).absolute() / self.uuid,
            self.request.remote,
            branch_name(self.request.task_key, self.uuid),
        )
        try:
            return self._run(ctx, checkout)
        except FencedError:
            log.warning("lock taken over by another worker; this delivery stops writing")
            ctx.detach()
            return {"uuid": self.uuid, "status": "fenced"}
        except Exception as exc:
            return self._on_error(ctx, checkout, exc)

    def _run(self, ctx: Context, checkout: Checkout) -> dict[str, Any]:
        checkout.prepare()
        if not ctx.pinned:
            ctx.append_message("system", SYSTEM_PROMPT)
            ctx.append_message("user", task_message(self.request.prompt, self.request.issue))
            ctx.step_done()
        summary = self._agent(ctx, checkout, ctx.metadata["config"]).run()
        checkout.commit(f"tasuki: {summary.splitlines()[0][:60] if summary else 'task'}\n\n{summary}")
        checkout.push()
        result = {"summary": summary, "branch": checkout.branch, "commit": checkout.head()}
        return self._finish(ctx, "completed", None, result, checkout)

    def _on_error(self, ctx: Context, checkout: Checkout, exc: Exception) -> dict[str, Any]:
        """The final status an exception out of the loop means (or a hand-back on warm shutdown)."""
        if isinstance(exc, SoftTimeLimitExceeded):
            return self._finish(ctx, "timeout", "soft time limit reached", None, checkout)
        if isinstance(exc, Cancelled):
            if self.should_stop is not None and self.should_stop() and not ctx.read_state().get("cancel_requested"):
                ctx.release()  # warm shutdown: hand the baton back; another worker resumes at once
                log.info("task handed back on shutdown")
                return {"uuid": self.uuid, "status": "handed_back"}
            return self._finish(ctx, "cancelled", str(exc), None, checkout)
        if isinstance(exc, StepLimit):
            return self._finish(ctx, "failed", str(exc), None, checkout)
        log.exception("task failed")
        error = mask(f"{type(exc).__name__}: {exc}".splitlines()[0])[:2000]
        return self._finish(ctx, "failed", error, None, checkout)

    def _agent(self, ctx: Context, checkout: Checkout, config: dict[str, Any]) -> Agent:
        s = self.settings
        limits = AgentLimits(
            max_steps=s.agent.max_steps,
            context_length=int(config["context_length"]),
            tool_output_max_chars=s.agent.tool_output_max_chars,
            bash_timeout_s=s.agent.bash_timeout_s,
        )
        policy = CompressionPolicy(
            warn_at=s.compression.warn_at,
            threshold=float(config.get("compression_threshold", s.compression.threshold)),
            min_messages=s.compression.min_messages,
            keep_recent=s.compression.keep_recent,
        )
        return Agent(
            ctx,
            self.provider_for(config),
            checkout,
            limits,
            policy,
            compressor=self.compressor,
            should_stop=self.should_stop,
        )

    def _finish(
        self,
        ctx: Context,
        status: str,
        error: str | None,
        result: dict[str, Any] | None,
        checkout: Checkout | None = None,
    ) -> dict[str, Any]:
        extra = {"result": result} if result else {}
        ctx.finish(status, error=error, **extra)
        if checkout is not None:
            shutil.rmtree(checkout.path, ignore_errors=True)
        if self.on_finish is not None:
            self.on_finish(self.uuid, status)
        log.info("task finished", status=status, error=error)
        return {"uuid": self.uuid, "status": status, "error": error, **(result or {})}
