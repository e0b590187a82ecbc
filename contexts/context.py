"""One held context: appends, state, prompt building, compression and completion (SPEC §3-§6)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from contexts import compression, jsonl
from contexts.atomic import fsync_dir, read_json
from contexts.clock import iso
from contexts.durable import NO_WRITER, DurableWriter
from contexts.errors import ContextError, FencedError, TasukiError
from contexts.heartbeat import Heartbeat
from contexts.lock import ContextLock, LockInfo
from contexts.masking import mask, mask_reasoning, mask_value
from contexts.names import (
    COMPLETED_DIR,
    FINAL_STATUSES,
    MESSAGES_FILE,
    METADATA_FILE,
    REQUESTS_FILE,
    SUMMARIES_FILE,
    TOOLS_FILE,
)
from contexts.overlap import meanwhile
from contexts.prompt import build_prompt
from contexts.requests import RequestLog, SentRequest
from contexts.state import read_state, update_state
from contexts.tokens import calibrate, estimate_message_tokens
from contexts.usage import Usage, usage_from_record

if TYPE_CHECKING:
    from contexts.store import ContextStore

log = structlog.get_logger(__name__)

MAX_PINNED = 4  # a context that never gets a user message must not pin its whole history in memory


UNSUMMARIZED_FIELD = "unsummarized"  # state.json: {after_seq, through_seq, tokens, count} of the unsummarized messages


class Context:
    """A context directory held by this process; obtained from ``ContextStore.create`` or ``.open``."""

    def __init__(
        self, store: ContextStore, uuid: str, path: Path, lock: ContextLock, durable: DurableWriter = NO_WRITER
    ) -> None:
        self.store = store
        self.uuid = uuid
        self.path = path
        self._lock = lock
        self._durable = durable  # the durable copy's writer under this holder's lease (one host: nothing)
        self._fsync = store.fsync
        self.closed = False
        home = self.home  # this holder's own generation of the directory (contexts/generation.py)
        self.metadata: dict[str, Any] = read_json(home / METADATA_FILE)
        self._messages = jsonl.JsonlWriter(home / MESSAGES_FILE, fsync=store.fsync)
        self._summaries = jsonl.JsonlWriter(home / SUMMARIES_FILE, id_field="summary_id", fsync=store.fsync)
        self._tools = jsonl.JsonlWriter(home / TOOLS_FILE, fsync=store.fsync)
        self._requests = RequestLog(store.fsync)  # requests.jsonl, opened by the first record
        self._write_guard = threading.Lock()
        self.pinned: list[dict[str, Any]] = []
        self._pinned_complete = False
        for record in jsonl.read_head(home / MESSAGES_FILE, MAX_PINNED):
            if self._pinned_complete:
                break
            self._pin(record)
        self.latest_summary = jsonl.last_record(home / SUMMARIES_FILE)
        state = read_state(home)
        self.status = str(state.get("status"))
        self._late: list[dict[str, Any]] | None = None  # the records after the last state write
        self.unsummarized_tokens, self.unsummarized_count = self._count_unsummarized(state.get(UNSUMMARIZED_FIELD))
        self._calibration = float(state.get("token_calibration", 1.0))
        self._heartbeat: Heartbeat | None = None
        self.previous_holder: LockInfo | None = None  # set by ``open`` after a takeover
        self._staged_fields: dict[str, Any] = {}  # state changes waiting for the step's one write
        self._staged_add: dict[str, int] = {}
        self._staged_usage: list[tuple[Usage, float | None]] = []
        missed, spent = self._counts_after(state.get(UNSUMMARIZED_FIELD))
        if missed or spent:  # a holder died between a step's records and its state write: count them now
            self.update_state(add=missed, usage=spent)

    # -- lifecycle -------------------------------------------------------------------------------

    def start_heartbeat(self) -> None:
        """Refresh ``.lock`` and ``state.json`` every ``heartbeat_interval_s`` from a background thread."""
        self._heartbeat = Heartbeat(self.uuid, self.store.heartbeat_interval_s, self.beat)
        self._heartbeat.start()

    def beat(self) -> None:
        """One heartbeat: the fleet's lease, the lock, ``state.json.updated_at`` and the store's hook (the Redis
        index). A lease found taken over raises :class:`FencedError` before anything local is refreshed."""
        try:
            self._durable.renew()
        except FencedError:
            raise
        except TasukiError as exc:  # the fleet's store out of reach: the lease runs on, the host's own beat goes on
            log.warning("lease not renewed", uuid=self.uuid, error=str(exc)[:200])
        now = self.store.clock()
        self._lock.refresh(now)
        try:
            self.status = str(update_state(self.home, now, fsync=False).get("status"))
        except FileNotFoundError:
            self._lock.check()  # taken over between the refresh and this write: the old generation is gone
            raise
        if self.store.on_heartbeat is not None:
            self.store.on_heartbeat(self.uuid, now, self.status)

    @property
    def home(self) -> Path:
        """Where this holder reads and writes: its own generation of the directory while it holds it (after a
        takeover that is a directory nobody else reads), ``path`` once closed."""
        return self.path if self.closed else self._lock.home

    @property
    def fenced(self) -> bool:
        """True once this holder learned that its lock was taken over."""
        return self._lock.fenced or (self._heartbeat is not None and self._heartbeat.fenced)

    @property
    def cancel_requested_elsewhere(self) -> bool:
        """A cancel request in the durable copy that this holder's take or last state commit found: ``tasuki
        cancel`` on any host of a fleet, even one whose Redis flag was lost (one host: False, its ``state.json``
        has the request)."""
        return self._durable.cancel_requested

    def assert_owner(self) -> None:
        """Raise :class:`FencedError` unless this process still holds the context: the one check the worker makes
        before every effect outside the context (a tool run, a model call, a push, a forge write). One ``fstat``
        of the held ``.lock``, and in fleet mode what the last renewal or commit learned of the lease (SPEC §12)."""
        self._check()

    @contextlib.contextmanager
    def holding(self, checkpoint: str | None = None) -> Iterator[str | None]:
        """One effect outside the context (a push, a forge write) under this holder's ownership: the owner check,
        then, in fleet mode, the lease held until the effect is over, so it lands only while this epoch is current
        (SPEC §12). ``checkpoint`` and what it yields: :meth:`~contexts.durable.DurableWriter.hold`."""
        self._check()
        with self._durable.hold(checkpoint) as recorded:
            yield recorded

    def _check(self) -> None:
        if self.closed:
            raise ContextError(f"{self.uuid}: context is closed")
        if self._heartbeat is not None and self._heartbeat.fenced:
            self._lock.fenced = True
        self._lock.check()
        self._durable.check()

    # -- records -------------------------------------------------------------------------------

    @property
    def boundary_seq(self) -> int:
        """Messages up to this seq are pinned or covered by the latest summary."""
        pinned_end = self.pinned[-1]["seq"] if self.pinned else 0
        summary_end = int(self.latest_summary["end_seq"]) if self.latest_summary else 0
        return max(pinned_end, summary_end)

    def _count_unsummarized(self, kept: object) -> tuple[int, int]:
        """Tokens and number of the messages after the boundary. ``state.json`` keeps both as of some seq (every
        state write records them), so a resume reads only what came after that — not every message since the
        latest summary, which is all of history while summaries keep failing. Counters that do not fit the
        files (another boundary, or a seq the file does not reach) are not trusted: then the messages are read."""
        if isinstance(kept, dict) and kept.get("after_seq") == self.boundary_seq:
            try:
                tokens, count, through = int(kept["tokens"]), int(kept["count"]), int(kept["through_seq"])
            except (KeyError, TypeError, ValueError):
                through = -1
            if self.boundary_seq <= through <= self.last_seq:
                self._late = []
                for record in jsonl.iter_from_id(self.home / MESSAGES_FILE, through + 1):
                    tokens += int(record.get("token_count", 0))
                    count += 1
                    self._late.append(record)
                return tokens, count
        tokens = count = 0
        for record in jsonl.iter_records_reversed(self.home / MESSAGES_FILE):
            if record["seq"] <= self.boundary_seq:
                break
            tokens += int(record.get("token_count", 0))
            count += 1
        return tokens, count

    def _counts_after(self, kept: object) -> tuple[dict[str, int], list[tuple[Usage, float | None]]]:
        """The counters and spend of the records after the last state write (``through_seq``): each ``assistant``
        message is one LLM call (with the usage it recorded), each ``tool`` message one tool call. Both are staged
        right after their record is appended and written with the step's state, so these are exactly the ones a
        crash kept off the disk."""
        late = self._late
        if late is None:  # not read while counting the unsummarized messages: read them now
            through = kept.get("through_seq") if isinstance(kept, dict) else None
            if not isinstance(through, int) or not 0 <= through < self.last_seq:
                return {}, []
            late = list(jsonl.iter_from_id(self.home / MESSAGES_FILE, through + 1))
        roles = Counter(str(record.get("role")) for record in late)
        counts = {"llm_call_count": roles["assistant"], "tool_call_count": roles["tool"]}
        spent = [usage_from_record(r["usage"]) for r in late if r.get("role") == "assistant" and r.get("usage")]
        return {key: value for key, value in counts.items() if value}, spent

    def _unsummarized_marker(self) -> dict[str, int]:
        return {"after_seq": self.boundary_seq, "through_seq": self.last_seq, "tokens": self.unsummarized_tokens,
                "count": self.unsummarized_count}

    @property
    def last_seq(self) -> int:
        """The seq of the newest message on disk."""
        return self._messages.last_id

    def _pin(self, record: dict[str, Any]) -> None:
        """Pinned: the leading system message(s) and the first user message (the task), at most a few."""
        self.pinned.append(record)
        if record.get("role") == "user" or len(self.pinned) >= MAX_PINNED:
            self._pinned_complete = True

    def append_message(self, role: str, content: str | None, **extra: Any) -> int:
        """Mask and append one message; returns its ``seq``."""
        record: dict[str, Any] = {"role": role, "content": mask(content) if content else content}
        reasoning = extra.pop("reasoning", None)
        if extra:
            record.update(mask_value(extra))  # type: ignore[call-overload]
        if reasoning:  # signed or encrypted: kept byte for byte, or dropped (contexts.masking.mask_reasoning)
            record["reasoning"] = mask_reasoning(reasoning)
        record["timestamp"] = iso(self.store.clock())
        record.setdefault("token_count", estimate_message_tokens(record["content"], record.get("tool_calls")))
        with self._write_guard:
            self._check()
            seq = self._messages.append(record)
            self._durable.record(MESSAGES_FILE, seq, self._messages.last_line)
        if not self._pinned_complete:
            self._pin({"seq": seq, **record})
        else:
            self.unsummarized_tokens += int(record["token_count"])
            self.unsummarized_count += 1
        return seq

    def append_tool(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        status: str,
        duration_ms: int,
        result: Any = None,
        error: str | None = None,
        **extra: Any,
    ) -> int:
        """Mask and append one ``tools.jsonl`` record; returns its ``seq``."""
        record = mask_value(
            {
                "tool_name": tool_name,
                "arguments": arguments,
                "result": result,
                "status": status,
                "error": error,
                "duration_ms": int(duration_ms),
                "timestamp": iso(self.store.clock()),
                **extra,
            }
        )
        with self._write_guard:
            self._check()
            seq = self._tools.append(record)  # type: ignore[arg-type]
            self._durable.record(TOOLS_FILE, seq, self._tools.last_line)
            return seq

    def record_request(self, sent: SentRequest) -> int:
        """Mask, delta-code and append one model call's request to ``requests.jsonl``; returns its ``request_id``."""
        with self._write_guard:
            self._check()
            request_id = self._requests.append(self.home, sent, self.store.clock())
            self._durable.record(REQUESTS_FILE, request_id, self._requests.last_line)
            return request_id

    @property
    def next_step(self) -> int:
        """The number of the model call a step asks next (1 for the first): the calls ``state.json`` counted, plus
        one."""
        return int(self.read_state().get("llm_call_count", 0)) + 1

    def step_done(self, *, write_state: bool = True, **fields: Any) -> None:
        """End of an agent step: fsync the JSONL files under the ``step`` policy, then write the step's staged
        state changes, and ``fields``, in one ``state.json`` write (``write_state=False``: leave them staged for
        the next write, which :meth:`finish` and :meth:`release` make)."""
        fleet = self._durable is not NO_WRITER  # its commit waits on the database, beside the host's fsyncs
        if write_state and (self._staged_fields or self._staged_add or self._staged_usage or fields):
            if not fleet:
                with self._write_guard:
                    self._sync_lines()
            self._update_state(fields, {}, (), sync_lines=fleet)  # the step's commit point: its lines, its state
        elif fleet:
            with self._write_guard, meanwhile() as start:
                start(lambda: self._durable.commit(None))  # the step's lines, its state left staged
                self._sync_lines()
        else:
            with self._write_guard:
                self._sync_lines()

    def _sync_lines(self) -> None:
        for writer in (self._messages, self._tools, self._summaries):
            writer.sync()
        self._requests.sync()

    def messages(self) -> list[dict[str, Any]]:
        """Every message record, oldest first (reads the whole file: for viewers and tests)."""
        return list(jsonl.iter_records(self.home / MESSAGES_FILE))

    def unsummarized(self) -> list[dict[str, Any]]:
        """Messages after the boundary, oldest first."""
        newest: list[dict[str, Any]] = []
        for record in jsonl.iter_records_reversed(self.home / MESSAGES_FILE):
            if record["seq"] <= self.boundary_seq:
                break
            newest.append(record)
        return newest[::-1]

    def _oldest_unsummarized(self, keep_recent: int, max_tokens: int | None) -> tuple[list[dict[str, Any]], bool]:
        """The oldest unsummarized messages, as many as a span can take (and whether that was all of them): a
        retry after failed summaries reads what it may summarize, not all of history since the latest summary."""
        limit = max(self.unsummarized_count - keep_recent, 0)
        read: list[dict[str, Any]] = []
        tokens = 0
        for record in jsonl.iter_from_id(self.home / MESSAGES_FILE, self.boundary_seq + 1):
            if compression.span_prefix_done(read, tokens, limit, max_tokens):
                return read, False
            read.append(record)
            tokens += int(record.get("token_count", 0))
        return read, True

    # -- state ---------------------------------------------------------------------------------

    def stage_state(
        self, add: dict[str, int] | None = None, usage: tuple[Usage, float | None] | None = None, **fields: Any
    ) -> None:
        """Like :meth:`update_state`, but written with the step's one state write (:meth:`step_done`) or the
        next :meth:`update_state`; a change of ``status`` is written at once (the index mirrors it)."""
        if "status" in fields and fields["status"] != self.status:
            self.update_state(add=add, usage=[usage] if usage else (), **fields)
            return
        with self._write_guard:
            self._staged_fields.update(fields)
            for key, delta in (add or {}).items():
                self._staged_add[key] = self._staged_add.get(key, 0) + delta
            if usage is not None:
                self._staged_usage.append(usage)

    def update_state(
        self, add: dict[str, int] | None = None, usage: Sequence[tuple[Usage, float | None]] = (), **fields: Any
    ) -> dict[str, Any]:
        """Set ``fields`` (and increment the counters in ``add``, and add model calls' ``(usage, cost)`` to the
        totals) in ``state.json``, with whatever was staged; returns the new state."""
        return self._update_state(fields, add or {}, usage, sync_lines=False)

    def _update_state(
        self,
        fields: dict[str, Any],
        add: dict[str, int],
        usage: Sequence[tuple[Usage, float | None]],
        *,
        sync_lines: bool,
    ) -> dict[str, Any]:
        """:meth:`update_state`; with ``sync_lines`` the step's lines are synced before the state is written, on
        the thread that writes it, while this one commits both to the durable copy (fleet mode)."""
        with self._write_guard:
            self._check()
            fields = {**self._staged_fields, **fields}
            add = dict(Counter(self._staged_add) + Counter(add))
            if self._pinned_complete:  # the counters ride along with every state write: no write of their own
                fields = {**fields, UNSUMMARIZED_FIELD: self._unsummarized_marker()}
            now = self.store.clock()
            usage = [*self._staged_usage, *usage]
            try:  # with sync_lines, the commit point (the lines since the last one, and this state) beside the host's
                state = update_state(
                    self.home,
                    now,
                    fsync=self._fsync != "never",
                    set_fields=fields,
                    add=add,
                    usage=usage,
                    first=self._sync_lines if sync_lines else None,
                    alongside=self._durable.commit if sync_lines else None,
                )
            except FileNotFoundError:
                self._lock.check()  # the old generation was deleted under a holder paused after its check
                raise
            if not sync_lines:
                self._durable.commit(state)  # the commit point: the lines since the last one, and this state
            self._staged_fields.clear()
            self._staged_add.clear()
            self._staged_usage.clear()
        status = str(state.get("status"))
        if status != self.status:
            self.status = status
            steps, tokens = int(state.get("llm_call_count", 0)), int(state.get("total_tokens_used", 0))
            self.store.mirror(lambda index: index.set_status(self.uuid, status, steps=steps, tokens=tokens))
            if self.store.on_heartbeat is not None:  # the index knows each running task's status at once
                try:
                    self.store.on_heartbeat(self.uuid, now, status)
                except Exception as exc:  # the index is a mirror: the state on disk is what counts
                    log.warning("status not mirrored to the index", uuid=self.uuid, error=str(exc)[:200])
        return state

    def read_state(self) -> dict[str, Any]:
        """The current ``state.json``."""
        return read_state(self.home)

    def calibrate_tokens(self, estimated_prompt_tokens: int, reported_prompt_tokens: int) -> float:
        """Correct future estimates with the provider's reported prompt tokens; returns the new factor."""
        self._calibration = calibrate(self._calibration, estimated_prompt_tokens, reported_prompt_tokens)
        self.stage_state(token_calibration=self._calibration)
        return self._calibration

    @property
    def token_factor(self) -> float:
        """Multiplier that turns stored estimates into the provider's token counts."""
        return self._calibration

    # -- prompt and compression ------------------------------------------------------------------

    def build_prompt(self, context_length: int, reserve_tokens: int = 0) -> list[dict[str, Any]]:
        """The messages to send: pinned task, latest summary, and the newest messages that fit."""
        return build_prompt(
            self.pinned,
            self.latest_summary,
            jsonl.iter_records_reversed(self.home / MESSAGES_FILE),
            boundary_seq=self.boundary_seq,
            last_seq=self.last_seq,
            budget_tokens=context_length - reserve_tokens,
            factor=self._calibration,
        )

    def compress(
        self,
        summarizer: compression.Summarizer,
        policy: compression.CompressionPolicy,
        max_span_tokens: int | None = None,
    ) -> dict[str, Any] | None:
        """Summarize the oldest unsummarized span (at most ``max_span_tokens``) into ``summaries.jsonl``;
        ``None`` if there is nothing to summarize."""
        self._check()  # a fenced holder reads a generation nobody writes: it must not spend a model call on it
        oldest, whole = self._oldest_unsummarized(policy.keep_recent, max_span_tokens)
        count = len(oldest) if whole else self.unsummarized_count  # read to the end: the count it saw is exact
        span = compression.select_span(oldest, policy.keep_recent, max_span_tokens, count=count)
        if not span:
            return None
        previous = self.latest_summary
        made = summarizer(previous["summary"] if previous else None, span)
        if isinstance(made, compression.Summarized) and made.request is not None:
            self.record_request(made.request)  # sent and paid for, kept or not
        text, facts = (made.text, dict(made.facts)) if isinstance(made, compression.Summarized) else (made, {})
        record = {
            **compression.make_summary_record(span=span, previous=previous, text=mask(text), now=self.store.clock()),
            **facts,
        }
        with self._write_guard:
            self._check()
            summary_id = self._summaries.append(record)
            self._summaries.sync()
            self._durable.record(SUMMARIES_FILE, summary_id, self._summaries.last_line)
        self.latest_summary = {"summary_id": summary_id, **record}
        self.unsummarized_tokens -= sum(int(r.get("token_count", 0)) for r in span)
        self.unsummarized_count -= len(span)
        timings = {f"compression_{k}": int(facts[k]) for k in ("queue_wait_ms", "run_ms") if k in facts}
        self.update_state(add={"compression_count": 1, **timings})
        return self.latest_summary

    # -- completion ------------------------------------------------------------------------------

    def finish(self, status: str, error: str | None = None, **final: Any) -> Path:
        """Complete the context (SPEC §3 rule 9) and return its path under ``completed/``."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"not a final status: {status!r}")
        now = self.store.clock()
        self.step_done(write_state=False)  # what the last step staged goes with the completing write
        # final_status lets the monitor finish the move with the right status after a crash (SPEC §3 rule 9).
        self.update_state(status="completing", completed_at=iso(now), error=error, final_status=status, **final)
        self._stop_heartbeat()
        self._close_files()
        target = self.store.base_dir / COMPLETED_DIR / self.uuid
        # Drop the lock and move the directory under the lock's mutex: an opener cannot take the lock in
        # between (and leave its .lock in completed/), nor can a holder that was taken over move the context.
        with self._lock.mutex():
            if not self._lock.release_under_mutex():
                self._lock.fenced = True
                raise FencedError(f"{self.uuid}: lock taken over before completion; this holder stops writing")
            os.rename(self.path, target)
        fsync_dir(target.parent)
        self.path = target
        finished = update_state(target, self.store.clock(), fsync=self._fsync != "never", set_fields={"status": status})
        try:
            self._durable.commit(finished)
        finally:
            self._durable.release()
        self.store.mirror(lambda index: index.record(target))
        log.info("context finished", uuid=self.uuid, status=status)
        return target

    def release(self) -> None:
        """Hand the context back without finishing it (warm shutdown, or a disk too full to finish it): stop, sync
        (what a step staged is written too, if the disk takes it), remove the lock — always: an unlink needs no
        free space, and a lock left behind by a live process would keep the task from anyone, forever."""
        self._stop_heartbeat()
        if self._staged_fields or self._staged_add or self._staged_usage:
            try:
                self.update_state()
            except FencedError:
                pass
            except (TasukiError, OSError) as exc:  # a full disk: the state on disk stays the previous, whole one
                log.warning("staged state not written as the context was handed back", uuid=self.uuid,
                            error=mask(str(exc))[:300])
        try:
            self._close_files(keep_home=True)
        except (ContextError, OSError) as exc:
            log.warning("context files not closed cleanly as it was handed back", uuid=self.uuid, error=str(exc))
        try:
            self._durable.commit(None)  # lines appended since the last commit point
        except FencedError:
            pass
        except TasukiError as exc:  # the fleet's store unreachable: the next holder resumes from its last commit
            log.warning("lines not committed as the context was handed back", uuid=self.uuid, error=str(exc)[:300])
        with contextlib.suppress(TasukiError):
            self._durable.release()
        # After the files are closed (nothing of this holder's can land in this generation any more, which is what
        # lets the next holder take it as it is), and through the home: never the lock at the public name.
        with contextlib.suppress(FencedError):
            self._lock.release()
        self._lock.close()

    def detach(self) -> None:
        """Stop using the context and leave the lock behind, as a crashed holder would."""
        self._stop_heartbeat()
        self._close_files()

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def _close_files(self, *, keep_home: bool = False) -> None:
        with self._write_guard:
            for writer in (self._messages, self._tools, self._summaries):
                writer.close()
            self._requests.close()
            if not keep_home:
                self._lock.close()
            self.closed = True

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.closed:
            self.detach()


HeartbeatHook = Callable[[str, datetime, str], None]
"""(uuid, now, status): called on every heartbeat and whenever the holder changes the status (the Redis index)."""
