"""The agent loop (SPEC §5): ``run → step → query → execute``, durable after every step.

The model's reply is on disk before its tool calls run, so a resumed task first answers the calls of
the last reply it has (``unanswered``) and never repeats an LLM call whose answer is already written.
Control flow uses exceptions, like mini-swe-agent: :class:`Finished`, :class:`Cancelled`, :class:`StepLimit`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from agent.fencing import owner_check
from agent.finish_gate import FinishGate
from agent.instructions import OwnerInstructions, give_nested
from agent.llm import Provider, Reply, ToolCall
from agent.llm.base import ContextOverflow, parse_arguments
from agent.llm.textcalls import text_calls
from agent.lost_steps import lost_steps
from agent.prompts import NUDGE
from agent.recorded import sent_request
from agent.repeats import Repeats
from agent.repeats import note as repeat_note
from agent.seams import Checkout, Meter, usage_of
from agent.tools import TOOL_SCHEMAS, Workspace, cap_output, run_tool
from agent.tools.dispatch import changes_checkout
from agent.tools.protocol import ToolOptions, ToolOutcome
from agent.tools.shell import BashTool, stop_leftover
from agent.tools.toolbox import BUILTINS, Toolbox
from contexts import CompressionPolicy, Context, TasukiError, jsonl
from contexts.lock import process_started
from contexts.names import MESSAGES_FILE
from contexts.tokens import estimate_message_tokens, estimate_tokens
from contexts.usage import call_record
from sandbox.jail import NoSandbox, Sandbox
from sandbox.settings import SandboxLimits

log = structlog.get_logger(__name__)

TOOLS_TOKENS = estimate_tokens(json.dumps(TOOL_SCHEMAS))
FULL_OUTPUT_MAX_CHARS = 1_000_000  # what tools.jsonl keeps of one output; the prompt gets far less
COMPRESSION_RETRY_STEPS = 3
OVERFLOW_RETRIES = 3  # sends of a step's prompt after the model refused it as too long, each one smaller
OVERFLOW_SHRINK = 0.75  # the emergency budget after a refusal: this share of the prompt the model refused
LOST_STEPS = (
    "note: the worker running attempt {attempt} stopped before the checkout as step {last} left it reached the "
    "remote, so this attempt's checkout is as it was after step {restored}: the changes made by the tool calls of "
    "step(s) {steps} are not in it. Check the state and redo what is needed."
)
INTERRUPTED = (
    "not run: the worker running attempt {attempt} stopped while this reply's tool calls were being run, so this "
    "call may have run partly. Nothing was run again: the checkout was put back to the last checkpoint, which is "
    "before this reply's calls, so their changes to it are undone. Check the state and run again what is needed."
)


class Finished(Exception):
    """The model called ``finish`` (and the finish gate, when on, accepted it: ``evidence`` is what it found)."""

    def __init__(self, summary: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.evidence = evidence


class Cancelled(TasukiError):
    """Someone asked for the task to stop; it stops at a step boundary."""


class StepLimit(TasukiError):
    """The task used all of its steps without finishing."""


class FormatErrors(TasukiError):
    """The model answered ``max_format_errors`` times in a row without a tool call Tasuki could run."""


class Repeating(TasukiError):
    """The model made the same call with the same result ``max_repeats`` times in a row (agent/repeats.py)."""


class BudgetExceeded(TasukiError):
    """The task reached ``limits.task_tokens`` or ``limits.task_cost``; the message carries the figures."""


@dataclass(frozen=True)
class AgentLimits:
    """How far one task may go."""

    max_steps: int
    context_length: int
    tool_output_max_chars: int
    bash_timeout_s: int
    response_reserve_tokens: int = 1024
    max_format_errors: int = 3  # replies in a row without a usable tool call before the task fails
    max_repeats: int = 6  # one call answered the same way this many times in a row ends the task

    @property
    def reserve_tokens(self) -> int:
        """Prompt room kept free for the tool schemas and the model's answer."""
        return TOOLS_TOKENS + min(self.response_reserve_tokens, self.context_length // 8)


Compressor = Callable[[Context], None]


class Agent:
    """Runs one task's loop over a held context, a provider and a checkout."""

    def __init__(
        self,
        ctx: Context,
        provider: Provider,
        checkout: Checkout,
        limits: AgentLimits,
        policy: CompressionPolicy,
        compressor: Compressor | None = None,
        should_stop: Callable[[], bool] | None = None,
        sandbox: Sandbox | None = None,
        sandbox_limits: SandboxLimits | None = None,
        recall: Callable[[str, set[str]], str] | None = None,
        meter: Meter | None = None,
        gate: FinishGate | None = None,
        toolbox: Toolbox | None = None,
        instructions: OwnerInstructions | None = None,
    ) -> None:
        self.instructions = instructions  # the owner's nested instruction files, given as their directories are touched
        self.toolbox = toolbox or BUILTINS  # the tools this task offers (the built-ins and its MCP servers')
        self.gate = gate  # answers the first finish with a review (agent/finish_gate.py); None: finish ends at once
        self.evidence: dict[str, Any] | None = None  # what the gate found when it accepted the finish
        self.meter = meter  # prices and counts each call; None: usage is still recorded, without prices
        self.sandbox = sandbox or NoSandbox()
        self.recall = recall  # (query, contents now in the prompt) -> the recall tool's answer
        self.sandbox_limits = sandbox_limits
        self.ctx = ctx
        self.provider = provider
        self.checkout = checkout
        self.workspace = Workspace(checkout.path)
        self.limits = limits
        self.policy = policy
        self.compressor = compressor
        self.should_stop = should_stop or (lambda: False)
        self._skip_compression_until = 0
        self._window: int | None = None  # the prompt budget a model that refused a prompt as too long showed it has
        self._restore_told = False
        self.touched = False  # whether this attempt ran anything that can change the checkout
        self._repeats: Repeats | None = None  # read from state.json when first needed (a resume goes on counting)
        self.owner_check = owner_check(ctx.assert_owner)

    def run(self) -> str:
        """Step until the model finishes; return its summary."""
        try:
            while True:
                self.step()
        except Finished as done:
            self.evidence = done.evidence
            return done.summary

    def step(self) -> None:
        """One step: answer pending calls, or ask the model and run what it asks for."""
        state = self.ctx.read_state()
        if state.get("cancel_requested"):
            raise Cancelled("cancelled on request")
        if self.should_stop():
            raise Cancelled("worker is shutting down")
        if not self._restore_told:
            self.tell_lost_steps(state)
        calls = self.unanswered()
        if calls:
            calls = self.settle_interrupted(calls)
        if calls is None:
            if int(state.get("llm_call_count", 0)) >= self.limits.max_steps:
                raise StepLimit(f"step limit of {self.limits.max_steps} reached without finish")
            over = self.meter.over_budget(state) if self.meter is not None else None
            if over is not None:  # checked before every call: the step that reached the cap was the last
                raise BudgetExceeded(over)
            self.maybe_compress(int(state.get("llm_call_count", 0)))
            if self.instructions is not None:  # before the model reads the results of calls below such a directory
                give_nested(self.ctx, self.instructions)
            calls = self.query().tool_calls
            if not calls:
                self.format_error(int(state.get("format_errors", 0)) + 1)
            elif state.get("format_errors"):
                self.ctx.stage_state(format_errors=0)
        self.touched = self.touched or any(self.changes(c.name) for c in calls)
        summary = self.execute(calls)
        # The finishing step's state rides with the context's completing write (a crash before it: the resume
        # finds finish answered and recounts the step's call from its record).
        self.ctx.step_done(write_state=summary is None)
        # Only tools that declare they change the checkout need a snapshot after their step.
        if any(self.changes(c.name) for c in calls) and self.checkout.checkpoint(
            int(self.ctx.read_state().get("llm_call_count", 0))
        ):
            # Written with the next step's state: the commit this holder put on the checkpoint branch.
            self.ctx.stage_state(last_activity="checkpoint", checkpoint=self.checkout.lease.latest)
        self.end_step(summary)

    def end_step(self, summary: str | None) -> None:
        """A finish its check accepted ends the task; so does a model caught in a loop (agent/repeats.py)."""
        if summary is not None:
            raise Finished(summary, self.evidence)
        if self.repeats.count >= self.limits.max_repeats:
            raise Repeating(f"the model made the same call with the same result {self.repeats.count} times in a row")

    @property
    def repeats(self) -> Repeats:
        """How many times in a row the newest call has been answered the same way (agent/repeats.py)."""
        if self._repeats is None:
            self._repeats = Repeats.from_state(self.ctx.read_state())
        return self._repeats

    def changes(self, name: str) -> bool:
        """Whether a call of ``name`` can change the checkout, as the task's tool of that name declares."""
        return changes_checkout(name, self.toolbox.tools)

    def format_error(self, count: int) -> None:
        """The ``count``-th reply in a row without a usable call: the model is nudged, or, at the cap, the task
        ends (a model that never writes a call would otherwise spend every step on nudges)."""
        self.ctx.stage_state(format_errors=count)  # in state.json: a resumed task goes on counting
        if count >= self.limits.max_format_errors:
            raise FormatErrors(f"the model answered {count} times in a row without a tool call Tasuki could run")
        self.ctx.append_message("user", NUDGE)

    def unanswered(self) -> list[ToolCall] | None:
        """Tool calls of the newest reply that have no result on disk yet (``None``: ask the model).

        A reply whose calls were all answered, including a ``finish``, ends the task at once.
        """
        record, answered = self._newest_reply()
        if record is None:
            return None
        calls = [_stored_call(c) for c in record.get("tool_calls") or []]
        if not calls:  # a reply without calls whose nudge was lost in a crash
            self.ctx.append_message("user", NUDGE)
            return []
        pending = [c for c in calls if c.id not in answered]
        finish = next((c for c in calls if c.name == "finish"), None)
        if not pending and finish is not None and not answered[finish.id].startswith("error:"):
            gated = self._gate_record(finish.id)
            if gated.get("stage") == "gate":  # the gate answered it: the model has not seen that answer yet
                ran = {"ran": True, "tree": gated.get("tree"), "checks": gated.get("checks")}
                self.ctx.update_state(finish_gate=ran)  # now: the model's next finish must find it
                return None
            raise Finished(str(finish.arguments.get("summary", "")).strip(), gated.get("evidence"))
        return pending or None

    def _gate_record(self, call_id: str) -> dict[str, Any]:
        """The finish gate's record on the result of call ``call_id`` ({} when the gate did not answer it)."""
        for record in self._newest_records():
            if record.get("role") == "tool" and record.get("tool_call_id") == call_id:
                gated = record.get("finish_gate")
                return gated if isinstance(gated, dict) else {}
        return {}

    def _newest_reply(self) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """The newest message if it is a reply or its calls' results follow it (else None), and those results by
        call id."""
        answered: dict[str, str] = {}
        for record in self._newest_records():
            if record.get("role") == "tool":
                answered[str(record.get("tool_call_id"))] = str(record.get("content") or "")
                continue
            return (record if record.get("role") == "assistant" else None), answered
        return None, answered

    def settle_interrupted(self, calls: list[ToolCall]) -> list[ToolCall]:
        """A resumed reply's calls: mutating ones are never run a second time (one may have been running when
        the worker died, and its recorded arguments are masked); the checkout goes back to the last checkpoint
        and the model is told. The rest (read_file, finish) is returned to run as usual."""
        interrupted = [c for c in calls if self.changes(c.name)]
        if not interrupted:
            return calls
        self.stop_leftover_command()
        self.checkout.restore_last_checkpoint()
        attempt = int(self.ctx.read_state().get("attempt", 1))
        message = INTERRUPTED.format(attempt=attempt - 1)
        for call in interrupted:
            self._record_result(call, f"error: {message}", "error", message, 0)
        log.info("interrupted calls answered without running them", calls=[c.id for c in interrupted])
        return [c for c in calls if not self.changes(c.name)]

    def tell_lost_steps(self, state: dict[str, Any]) -> None:
        """On a tree rebuilt from the remote: tell the model which steps' changes never reached it (their worker
        died before their checkpoint's push), so it redoes them rather than build on files that are not there.
        Once per attempt, first thing: the newest reply's calls still pending are answered as not run (a
        ``finish`` among them, or already answered, must not end the task on a tree without the work)."""
        self._restore_told = True
        restored = self.checkout.restored_step()
        if restored is None:
            return
        records = jsonl.iter_records_reversed(self.ctx.path / MESSAGES_FILE)
        lost = lost_steps(records, restored, int(state.get("llm_call_count", 0)), self.changes)
        if lost:
            note = LOST_STEPS.format(attempt=int(state.get("attempt", 1)) - 1, last=lost[-1], restored=restored,
                                     steps=", ".join(str(s) for s in lost))
            record, answered = self._newest_reply()
            for call in [_stored_call(c) for c in (record or {}).get("tool_calls") or []]:
                if call.id not in answered:
                    self._record_result(call, f"error: not run: {note}", "error", note, 0)
            self.ctx.append_message("user", note)
            log.warning("steps lost with the previous worker's checkout", steps=lost, restored_step=restored)
        self.checkout.restore_told()

    def stop_leftover_command(self) -> None:
        """Before anything else on resume: a command the dead worker left running on this host (without a
        sandbox it outlives its worker) is killed, so it cannot touch the checkout any more."""
        running = self.ctx.read_state().get("running_command")
        if not isinstance(running, dict) or running.get("host") != socket.gethostname():
            return
        if stop_leftover(int(running.get("pgid", 0)), running.get("started")):
            log.warning("killed a command left running by the previous attempt", pgid=running.get("pgid"))

    def _command_started(self, pgid: int) -> None:
        """Record the running command's process group, so a resumed attempt can make sure it is dead."""
        running = {"pgid": pgid, "host": socket.gethostname(), "started": process_started(pgid)}
        self.ctx.update_state(running_command=running)

    def _newest_records(self) -> Any:
        for record in jsonl.iter_records_reversed(self.ctx.path / MESSAGES_FILE):
            if record["seq"] <= (self.ctx.pinned[-1]["seq"] if self.ctx.pinned else 0):
                return
            yield record

    def maybe_compress(self, step: int) -> None:
        """Hand the context to compression when the unsummarized history passes the threshold."""
        tokens = int(self.ctx.unsummarized_tokens * self.ctx.token_factor)
        # Thresholds apply to the room messages really have: the tool schemas and the answer's reserve
        # are sent with every request, and with a small context_length they are a large share of it.
        budget = self.limits.context_length - self._reserve()  # less once the model showed a smaller window
        stage = self.policy.stage(tokens, budget)
        if stage == "warn":
            log.info("context filling up", tokens=tokens, budget=budget)
        if self.compressor is None or step < self._skip_compression_until:
            return
        if not self.policy.should_compress(tokens, self.ctx.unsummarized_count, budget):
            return
        self.ctx.update_state(status="compressing", last_activity="compression")
        try:
            self.compressor(self.ctx)
        except TasukiError as exc:  # the prompt builder's emergency rule keeps the prompt in budget meanwhile
            self._skip_compression_until = step + COMPRESSION_RETRY_STEPS
            log.warning("compression failed; will retry", error=str(exc), retry_at_step=self._skip_compression_until)
        finally:
            self.ctx.update_state(status="processing")

    def ask(self) -> tuple[Reply, list[dict[str, Any]], int]:
        """Send the step's prompt; the reply, the prompt it answers and that prompt's estimated tokens.

        A prompt the model refuses as too long for its window (:class:`ContextOverflow`) is made smaller and sent
        again: the history is compressed at once, whatever the threshold says; when that cannot shrink it (no
        compressor, too few messages, a summary that failed) the prompt builder's emergency rule cuts it to a
        smaller budget, kept for the rest of the task. After :data:`OVERFLOW_RETRIES` more refusals the task stops
        (``reason: model``). Nothing is written nor counted for a refused request: the step is the reply's.
        """
        compressed = False
        for refused in range(OVERFLOW_RETRIES + 1):
            prompt = self.ctx.build_prompt(self.limits.context_length, self._reserve())
            estimated = self.toolbox.tokens + sum(
                estimate_message_tokens(m.get("content"), m.get("tool_calls")) for m in prompt
            )
            self.ctx.stage_state(
                status="processing", last_activity="llm_call",
                current_context_tokens=int(estimated * self.ctx.token_factor),
            )
            self.owner_check()  # a fenced holder never asks: the answer would go to a context it may not write
            try:
                return self.provider.chat(prompt, self.toolbox.schemas, cache_key=self.ctx.uuid), prompt, estimated
            except ContextOverflow as exc:
                if refused == OVERFLOW_RETRIES:
                    raise ContextOverflow(
                        f"the prompt did not fit the model's window after {refused} tries to shrink it: {exc}",
                        exc.status,
                    ) from exc
                sent = int((estimated - self.toolbox.tokens) * self.ctx.token_factor)
                log.warning("the model refused the prompt as too long for its window", tokens=sent, tries=refused + 1)
                if not compressed:
                    compressed = True
                    if self.compress_now():
                        continue
                self._window = int(min(self.limits.context_length - self._reserve(), sent) * OVERFLOW_SHRINK)
                log.info("prompt cut to a smaller budget by the emergency rule", budget=self._window)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _reserve(self) -> int:
        """The room ``build_prompt`` keeps free: the tool schemas and the answer's, and what a model that refused a
        prompt as too long showed its window to lack (:meth:`ask`)."""
        reserve = self.limits.reserve_tokens + self.toolbox.tokens - TOOLS_TOKENS  # a task's MCP tools are sent too
        if self._window is None:
            return reserve
        return max(reserve, self.limits.context_length - self._window)

    def compress_now(self) -> bool:
        """Compress the history now, below the threshold too (the model refused the prompt as too long); whether
        the history in the prompt got smaller."""
        if self.compressor is None:
            return False
        before = (self.ctx.unsummarized_tokens, self.ctx.unsummarized_count)
        self.ctx.update_state(status="compressing", last_activity="compression")
        try:
            self.compressor(self.ctx)
        except TasukiError as exc:  # the emergency rule shrinks the prompt instead
            log.warning("compression after a refused prompt failed", error=str(exc)[:300])
            return False
        finally:
            self.ctx.update_state(status="processing")
        return (self.ctx.unsummarized_tokens, self.ctx.unsummarized_count) < before

    def query(self) -> Reply:
        """Ask the model; its reply is written before anything it asks for runs."""
        step = self.ctx.next_step
        reply, prompt, estimated = self.ask()
        offered = self.toolbox.names
        written = [] if reply.tool_calls else text_calls(reply.content or "", offered, seed=self.ctx.last_seq + 1)
        if written:  # calls written in the text (small local models): run like native ones, the text kept as it came
            reply = replace(reply, tool_calls=written)
        message = reply.to_message()
        usage = usage_of(reply, "agent", estimated)
        priced = self.meter.priced(usage) if self.meter is not None else (usage, None)
        extra: dict[str, Any] = {k: message[k] for k in ("tool_calls", "thinking", "reasoning") if k in message}
        if written:
            extra["tool_calls_from"] = "text"
        seq = self.ctx.append_message("assistant", message["content"], usage=call_record(*priced), **extra)
        self.ctx.stage_state(  # right after its record: a resume recounts calls whose state write a crash lost
            add={"llm_call_count": 1},
            usage=priced,
            current_context_tokens=int(reply.prompt_tokens or estimated),
            last_activity="llm_reply",
        )
        self.ctx.record_request(sent_request(self.provider, step, "agent", prompt, self.toolbox.schemas, reply, seq))
        if self.meter is not None:
            self.meter.count(usage)
        if reply.prompt_tokens:
            self.ctx.calibrate_tokens(estimated, reply.prompt_tokens)
        log.info("llm call", prompt_tokens=reply.prompt_tokens, tool_calls=[c.name for c in reply.tool_calls])
        return reply

    def execute(self, calls: list[ToolCall]) -> str | None:
        """Run each call through its tool's own argument check; record it in ``tools.jsonl`` and as a ``tool``
        message (cut for the prompt). Returns the summary of a ``finish`` that its check accepted, else None:
        a blank or missing summary goes back to the model as the tool's error."""
        summary = None
        for call in calls:
            self.owner_check()  # a fenced holder runs nothing: the checkout may be another holder's by now
            result = run_tool(
                self.workspace,
                call.name,
                call.arguments if call.raw_arguments is None else call.raw_arguments,
                bash_timeout_s=self.limits.bash_timeout_s,
                max_output_chars=FULL_OUTPUT_MAX_CHARS,
                sandbox=self.sandbox,
                limits=self.sandbox_limits,
                on_start=self._command_started if call.name == "bash" else None,
                recall=self._recall if self.recall is not None else None,
                home=self.checkout.home,
                tools=self.toolbox.tools,
                view_chars=self.limits.tool_output_max_chars,
            )
            if call.name == "bash":
                self.ctx.stage_state(running_command=None)  # a resume checks the process's start time anyway
            gated: dict[str, Any] = {}
            if result.finished and self.gate is not None:
                started = time.monotonic()
                answer = self.gate.on_finish(self.ctx, call.arguments.get("keep"), self._gate_shell, self.workspace)
                gate_ms = int((time.monotonic() - started) * 1000)  # the call's recorded time is the gate's too
                result = replace(result, output=answer.output, finished=answer.finished,
                                 duration_ms=result.duration_ms + gate_ms)
                gated = answer.record
                self.evidence = gated.get("evidence")
            if result.finished:
                summary = result.summary
            count = self.repeats.seen(call.name, call.arguments, result.output)
            self.ctx.stage_state(repeat=self.repeats.state())
            repeated = repeat_note(count, self.limits.max_repeats)
            self._record_result(call, result.output, result.status, result.error, result.duration_ms,
                                finish_gate=gated or None, note=repeated)
        return summary

    def _gate_shell(self, command: str, timeout_s: int) -> ToolOutcome:
        """One of the finish gate's commands, run as the bash tool runs the agent's: in the sandbox, in the checkout."""
        options = ToolOptions(bash_timeout_s=timeout_s, max_output_chars=FULL_OUTPUT_MAX_CHARS, sandbox=self.sandbox,
                              limits=self.sandbox_limits, on_start=self._command_started, home=self.checkout.home)
        try:
            return BashTool().run(self.workspace, {"command": command}, options)
        finally:
            self.ctx.stage_state(running_command=None)

    def _recall(self, query: str) -> str:
        """The recall tool's search, told what the prompt holds now (so it returns only what is gone)."""
        assert self.recall is not None  # noqa: S101 - only handed to run_tool when set
        prompt = self.ctx.build_prompt(self.limits.context_length, self.limits.reserve_tokens)
        return self.recall(query, {str(m.get("content")) for m in prompt if m.get("content")})

    def _record_result(self, call: ToolCall, result_text: str, status: str, error: str | None, duration: int,
                       finish_gate: dict[str, Any] | None = None, note: str = "") -> None:
        """One call's result: a ``tools.jsonl`` record and a ``tool`` message (cut for the prompt); ``finish_gate``:
        the gate's record of a ``finish`` it answered, kept on the message (a resume reads it there); ``note``: said
        to the model after the result (agent/repeats.py), never part of the record."""
        tool_seq = self.ctx.append_tool(
            call.name, call.arguments, status, duration, result=result_text, error=error, tool_call_id=call.id
        )
        content, cut = cap_output(result_text, self.limits.tool_output_max_chars)
        extra: dict[str, Any] = {"tool_call_id": call.id, "tool_name": call.name}
        if finish_gate is not None:
            extra["finish_gate"] = finish_gate
        if cut is not None:
            content += f"\n[full output: tools.jsonl seq {tool_seq}]"
            extra["truncated_from"] = cut
        content += note
        self.ctx.append_message("tool", content, **extra)
        self.ctx.stage_state(add={"tool_call_count": 1}, last_activity=f"tool:{call.name}")


def _stored_call(raw: dict[str, Any]) -> ToolCall:
    function = raw.get("function", {})
    arguments, bad = parse_arguments(function.get("arguments"))
    return ToolCall(id=str(raw.get("id")), name=str(function.get("name")), arguments=arguments, raw_arguments=bad)
