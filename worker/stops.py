"""A task stopped before it finished: which limit stopped it, and what its draft and its commit say (docs/endings.md).

Reaching a limit — all of its steps, its time, its budget — or a model that stays down past its retry window (and
its fallbacks), or that answers ``agent.max_format_errors`` times in a row without a call Tasuki can run, ends a
task without its ``finish``, but not without its work: what the agent changed so far is committed, pushed and
opened as a **draft** pull/merge request that says why the task stopped and what it was doing. The task's status
stays what such an ending always was (``failed``, ``timeout``), with a ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded

from agent.llm.base import ContextOverflow, ModelUnavailable
from agent.loop import BudgetExceeded, FormatErrors, Repeating, StepLimit
from contexts import Context, jsonl
from contexts.masking import mask
from contexts.names import MESSAGES_FILE
from worker.settings_models import Settings

LAST_WORDS_MAX_CHARS = 2000
LAST_WORDS_SCAN = 200  # the newest records looked through for the agent's last text (tool results come between)
TIME_ERROR = "soft time limit reached"
SUBJECTS = {
    "steps": "stopped at its step limit",
    "time": "stopped at its time limit",
    "budget": "stopped at its budget",
    "model": "stopped by its model",
}
"""The unfinished commit's subject, by reason."""
MODEL_STOPS: dict[type[Exception], str] = {
    ModelUnavailable: "its model stayed unavailable ({})",
    ContextOverflow: "its prompt did not fit the model's context window even once shrunk ({})",
    FormatErrors: "its model stopped writing tool calls ({})",
    Repeating: "its model was caught in a loop ({}; agent.max_repeats)",
}
"""The ``model`` stops: a model that stays down, a prompt that never fits, replies with no call to run, one call
made again and again with the same result."""


@dataclass(frozen=True)
class Stop:
    """Why a task stopped before it finished."""

    reason: str
    """``steps``, ``time``, ``budget`` or ``model`` (state.json's ``reason``)."""
    status: str
    """The final status: ``timeout`` for the time limit, else ``failed``."""
    error: str
    """The task's one-line error, as ``state.json`` keeps it."""
    why: str
    """The limit in words, with its figure: "it used all of its 30 steps (agent.max_steps)"."""


def stop_of(exc: BaseException, settings: Settings) -> Stop | None:
    """The limit ``exc`` means, or None for an ending that is not a limit (a crash, a cancel)."""
    if isinstance(exc, StepLimit):
        steps = settings.agent.max_steps
        why = f"it used all of its {steps} steps (agent.max_steps) without finishing"
        return Stop("steps", "failed", str(exc), why)
    if timed_out(exc):
        limit = settings.agent.soft_time_limit_s
        return Stop("time", "timeout", TIME_ERROR, f"it ran past its time limit of {limit} s (agent.soft_time_limit_s)")
    if isinstance(exc, BudgetExceeded):
        figures = str(exc).removeprefix("budget: ")
        return Stop("budget", "failed", str(exc), f"it reached its budget ({figures})")
    model = next((why for kind, why in MODEL_STOPS.items() if isinstance(exc, kind)), None)
    if model is not None:
        return Stop("model", "failed", mask(str(exc)), model.format(mask(str(exc))))
    return None


def timed_out(exc: BaseException) -> bool:
    """Whether the soft time limit ended the task: ``exc`` itself, or what it was raised from or while handling (a
    client that wraps whatever interrupted its request, as the ``openai`` one does)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SoftTimeLimitExceeded):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def last_words(ctx: Context) -> str:
    """The agent's newest text (what it was doing when it stopped), masked and cut; "" when it wrote none lately."""
    for count, record in enumerate(jsonl.iter_records_reversed(ctx.home / MESSAGES_FILE)):
        if count >= LAST_WORDS_SCAN:
            break
        content = record.get("content")
        if record.get("role") == "assistant" and isinstance(content, str) and content.strip():
            text = mask(content.strip())
            return text if len(text) <= LAST_WORDS_MAX_CHARS else text[: LAST_WORDS_MAX_CHARS - 3] + "..."
    return ""


def commit_message(stop: Stop, words: str) -> str:
    """The commit of the unfinished work: says it is unfinished and why, then the agent's last words."""
    subject = f"tasuki: unfinished, {SUBJECTS.get(stop.reason, 'stopped before it finished')}"
    return "\n\n".join(part for part in (subject, f"The task stopped before it finished: {stop.why}.", words) if part)


def draft_body(stop: Stop, words: str) -> str:
    """The draft pull/merge request's text: why the task stopped (the limit and its figure), what was done."""
    parts = [
        f"**Unfinished.** Tasuki stopped before it finished: {stop.why}.",
        "This draft holds what it changed so far: review it, push to it, or have Tasuki go on with a review or a "
        "comment that mentions it, as on any of its pull requests.",
    ]
    if words:
        quoted = "\n".join(f"> {line}" if line else ">" for line in words.splitlines())
        parts.append(f"What it was doing last:\n\n{quoted}")
    return "\n\n".join(parts)
