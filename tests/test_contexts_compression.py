"""The compression policy (SPEC §6): when to summarize, which span, what a summary record is, and chaining."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contexts import CompressionPolicy, Context, ContextStore, SummaryRejectedError, jsonl
from contexts.compression import make_summary_record, select_span
from contexts.context import MAX_PINNED
from contexts.state import update_state
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)
from tests.helpers.schemas import validate_context_dir, validate_record

NOW = datetime(2025, 5, 5, 5, 5, tzinfo=UTC)
POLICY = CompressionPolicy()


@pytest.mark.parametrize(
    ("tokens", "stage"),
    [(0, "ok"), (600, "ok"), (601, "warn"), (700, "warn"), (701, "compress"), (999, "compress"), (1000, "emergency")],
)
def test_stage_follows_the_thresholds(tokens: int, stage: str) -> None:
    assert POLICY.stage(tokens, 1000) == stage


@pytest.mark.parametrize(
    ("tokens", "count", "compress"),
    [
        (701, 10, True),
        (5000, 50, True),
        (700, 10, False),  # exactly the threshold is not past it
        (701, 9, False),  # too few messages to be worth a summary
        (0, 100, False),
    ],
)
def test_should_compress_needs_tokens_past_the_threshold_and_enough_messages(
    tokens: int, count: int, compress: bool
) -> None:
    assert POLICY.should_compress(tokens, count, 1000) is compress


def msg(seq: int, role: str, tokens: int = 10, **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "role": role, "content": "c", "token_count": tokens, **extra}


def test_select_span_keeps_the_newest_and_moves_the_cut_back_to_the_calling_assistant() -> None:
    history = [
        msg(3, "assistant"),
        msg(4, "user"),
        msg(5, "assistant", tool_calls=[{"id": "a"}, {"id": "b"}]),
        msg(6, "tool", tool_call_id="a"),
        msg(7, "tool", tool_call_id="b"),
        msg(8, "assistant"),
    ]
    assert [m["seq"] for m in select_span(history, 1)] == [3, 4, 5, 6, 7]
    assert [m["seq"] for m in select_span(history, 2)] == [3, 4]  # the cut fell on seq 7, a result of seq 5
    assert [m["seq"] for m in select_span(history, 3)] == [3, 4]
    assert [m["seq"] for m in select_span(history, 4)] == [3, 4]
    assert [m["seq"] for m in select_span(history, 0)] == [3, 4, 5, 6, 7, 8]
    assert select_span(history, 6) == []
    assert select_span(history, 60) == []
    assert select_span([], 5) == []


turns = st.lists(
    st.one_of(st.sampled_from(["user", "assistant"]), st.integers(1, 4)),  # an int: a call with that many results
    max_size=40,
)


def flatten(spec: list[str | int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in spec:
        if isinstance(turn, int):
            ids = [f"c{len(out)}-{n}" for n in range(turn)]
            out.append(msg(len(out) + 3, "assistant", tool_calls=[{"id": i} for i in ids]))
            out.extend(msg(len(out) + 3, "tool", tool_call_id=i) for i in ids)
        else:
            out.append(msg(len(out) + 3, turn))
    return out


@settings(max_examples=300)
@given(spec=turns, keep_recent=st.integers(0, 12))
def test_select_span_never_splits_a_tool_call_from_its_results(spec: list[str | int], keep_recent: int) -> None:
    history = flatten(spec)
    span = select_span(history, keep_recent)
    kept = history[len(span) :]

    assert history[: len(span)] == span  # the oldest messages, in order
    assert len(kept) >= min(keep_recent, len(history))
    assert not kept or kept[0]["role"] != "tool"  # the cut is never between a call and its results
    called = {c["id"] for m in span for c in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in span if m["role"] == "tool"}
    assert answered == called
    # The cut only moved back as far as the calling assistant message.
    longest = max(len(history) - keep_recent, 0)
    assert all(m["role"] == "tool" for m in history[len(span) + 1 : longest])


def test_make_summary_record_fills_the_001_fields_and_counts_the_previous_summary() -> None:
    span = [msg(11, "assistant", 300), msg(12, "user", 200)]
    previous = {"summary_id": 1, "start_seq": 3, "end_seq": 10, "summary": "x", "summary_tokens": 100}

    record = make_summary_record(span=span, previous=previous, text="  did things  ", now=NOW)

    assert record == {
        "start_seq": 11,
        "end_seq": 12,
        "summary": "did things",
        "created_at": "2025-05-05T05:05:00.000000Z",
        "original_tokens": 600,
        "summary_tokens": 3,
        "compression_ratio": 0.005,
        "previous_summary_id": 1,
    }
    validate_record("summary", {"summary_id": 2, **record})


@pytest.mark.parametrize("text", ["", "   \n\t", "y" * 400])
def test_make_summary_record_rejects_an_empty_or_not_shorter_summary(text: str) -> None:
    with pytest.raises(SummaryRejectedError):
        make_summary_record(span=[msg(3, "assistant", 100)], previous=None, text=text, now=NOW)


def test_make_summary_record_rejects_an_empty_span() -> None:
    with pytest.raises(SummaryRejectedError):
        make_summary_record(span=[], previous=None, text="summary", now=NOW)


class RecordingSummarizer:
    """Remembers what it was given; answers with a short summary naming the span."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, list[int]]] = []

    def __call__(self, previous: str | None, span: list[dict[str, Any]]) -> str:
        self.calls.append((previous, [m["seq"] for m in span]))
        return f"summary #{len(self.calls)} of {span[0]['seq']}-{span[-1]['seq']}"


def working_context(tmp_path: Path, steps: int) -> Context:
    ctx = ContextStore(tmp_path, fsync="step").create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "you are a coding agent")
    ctx.append_message("user", "fix the failing test")
    for n in range(steps):
        add_step(ctx, n)
    return ctx


def add_step(ctx: Context, n: int) -> None:
    call_id = f"call-{n}"
    ctx.append_message(
        "assistant",
        None,
        tool_calls=[
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": '{"command": "pytest"}'}}
        ],
    )
    ctx.append_message("tool", f"output {n} " + "o" * 300, tool_call_id=call_id, tool_name="bash")


def test_compression_is_incremental_and_summaries_chain(tmp_path: Path) -> None:
    ctx = working_context(tmp_path, steps=6)  # seq 3..14
    summarizer = RecordingSummarizer()
    policy = CompressionPolicy(keep_recent=3)

    first = ctx.compress(summarizer, policy)
    assert first is not None
    assert (first["summary_id"], first["start_seq"], first["end_seq"]) == (1, 3, 10)  # cut moved back from 11
    assert ctx.boundary_seq == 10
    for n in range(6, 10):
        add_step(ctx, n)  # seq 15..22
    second = ctx.compress(summarizer, policy)

    assert second is not None
    assert (second["summary_id"], second["start_seq"]) == (2, first["end_seq"] + 1)
    assert second["previous_summary_id"] == 1
    assert summarizer.calls[0] == (None, list(range(3, 11)))
    assert summarizer.calls[1][0] == "summary #1 of 3-10"  # the previous summary goes in: incremental
    assert summarizer.calls[1][1][0] == 11
    assert second["original_tokens"] > sum(
        m["token_count"] for m in ctx.messages() if 11 <= m["seq"] <= second["end_seq"]
    )  # it replaces the previous summary too
    assert ctx.read_state()["compression_count"] == 2
    assert ctx.latest_summary == second
    assert validate_context_dir(ctx.path)["summaries.jsonl"] == 2


def test_a_resumed_context_continues_the_chain(tmp_path: Path) -> None:
    ctx = working_context(tmp_path, steps=6)
    policy = CompressionPolicy(keep_recent=3)
    first = ctx.compress(RecordingSummarizer(), policy)
    tokens, count = ctx.unsummarized_tokens, ctx.unsummarized_count
    ctx.release()

    resumed = ctx.store.open(ctx.uuid, heartbeat=False)
    assert resumed.latest_summary == first
    assert (resumed.unsummarized_tokens, resumed.unsummarized_count) == (tokens, count)
    assert [m["seq"] for m in resumed.unsummarized()] == [11, 12, 13, 14]
    for n in range(6, 9):
        add_step(resumed, n)
    second = resumed.compress(RecordingSummarizer(), policy)
    assert second is not None
    assert first is not None
    assert (second["summary_id"], second["start_seq"]) == (2, first["end_seq"] + 1)
    validate_context_dir(resumed.path)


def test_counters_of_unsummarized_messages_follow_appends_and_summaries(tmp_path: Path) -> None:
    ctx = working_context(tmp_path, steps=4)
    assert ctx.unsummarized_count == 8
    assert ctx.unsummarized_tokens == sum(m["token_count"] for m in ctx.unsummarized())
    ctx.compress(RecordingSummarizer(), CompressionPolicy(keep_recent=2))
    assert ctx.unsummarized_count == len(ctx.unsummarized()) == 2
    assert ctx.unsummarized_tokens == sum(m["token_count"] for m in ctx.unsummarized())


def test_nothing_to_compress_returns_none_and_writes_nothing(tmp_path: Path) -> None:
    ctx = working_context(tmp_path, steps=1)
    assert ctx.compress(RecordingSummarizer(), CompressionPolicy(keep_recent=5)) is None
    assert (ctx.path / "summaries.jsonl").read_bytes() == b""
    assert ctx.read_state()["compression_count"] == 0


@pytest.mark.parametrize("answer", ["", "   ", "x" * 5000])
def test_a_rejected_summary_writes_nothing(tmp_path: Path, answer: str) -> None:
    ctx = working_context(tmp_path, steps=4)
    with pytest.raises(SummaryRejectedError):
        ctx.compress(lambda _previous, _span: answer, CompressionPolicy(keep_recent=2))
    assert (ctx.path / "summaries.jsonl").read_bytes() == b""
    assert ctx.latest_summary is None
    assert ctx.read_state()["compression_count"] == 0
    assert ctx.unsummarized_count == 8


@settings(max_examples=300)
@given(spec=turns, keep_recent=st.integers(0, 12), max_tokens=st.integers(1, 80))
def test_select_span_with_a_token_cap_stays_under_it_and_keeps_tool_groups_whole(
    spec: list[str | int], keep_recent: int, max_tokens: int
) -> None:
    history = flatten(spec)
    span = select_span(history, keep_recent, max_tokens)
    uncapped = select_span(history, keep_recent)

    assert history[: len(span)] == span
    assert len(span) <= len(uncapped)
    kept = history[len(span) :]
    assert not kept or kept[0]["role"] != "tool"
    called = {c["id"] for m in span for c in m.get("tool_calls", [])}
    assert {m["tool_call_id"] for m in span if m["role"] == "tool"} == called
    first_group = 1 + next((i for i, m in enumerate(history[1:]) if m["role"] != "tool"), len(history) - 1)
    # Over the cap only when the cap is smaller than the first group, which is then taken whole.
    assert sum(m["token_count"] for m in span) <= max_tokens or len(span) == first_group


def counted(ctx: Context) -> tuple[int, int]:
    """The unsummarized tokens and messages, counted the slow way: every message after the boundary."""
    after = [m for m in ctx.messages() if m["seq"] > ctx.boundary_seq]
    return sum(m["token_count"] for m in after), len(after)


@pytest.mark.parametrize("appended_after_the_last_state_write", [0, 3])
def test_a_resume_counts_unsummarized_messages_from_state_without_reading_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, appended_after_the_last_state_write: int
) -> None:
    ctx = working_context(tmp_path, steps=30)
    ctx.compress(RecordingSummarizer(), CompressionPolicy(keep_recent=3))
    for n in range(30, 40):
        add_step(ctx, n)
    ctx.update_state(last_activity="step")  # every state write carries the counters
    for n in range(appended_after_the_last_state_write):  # a crash after these appends, before a state write
        ctx.append_message("tool", f"late output {n}", tool_call_id=f"late-{n}", tool_name="bash")
    ctx.detach()
    read: list[int] = []  # the message records the open reads, by any of the readers

    def counting(reader: Any) -> Any:
        def wrapped(path: Path, *args: Any) -> Any:
            for record in reader(path, *args):
                if path.name == "messages.jsonl":
                    read.append(record["seq"])
                yield record
        return wrapped

    with monkeypatch.context() as patch:
        for name in ("iter_records", "iter_records_reversed", "iter_from_id"):
            patch.setattr(jsonl, name, counting(getattr(jsonl, name)))
        resumed = ContextStore(tmp_path, fsync="step", hostname="other-host",
                               clock=lambda: datetime(2100, 1, 1, tzinfo=UTC)).open(ctx.uuid, heartbeat=False)

    assert (resumed.unsummarized_tokens, resumed.unsummarized_count) == counted(resumed)
    # The head where the pinned messages are, and what came after the last state write; not the steps since.
    assert len(read) <= MAX_PINNED + 1 + appended_after_the_last_state_write, read


@pytest.mark.parametrize(
    "marker",
    [
        {"after_seq": 0, "through_seq": 5, "tokens": 1, "count": 1},  # written before the latest summary
        {"after_seq": "boundary", "through_seq": 10_000, "tokens": 1, "count": 1},  # past the file: lost lines
        {"after_seq": "boundary", "through_seq": "x", "tokens": 1, "count": 1},  # damaged
        "not a marker",
    ],
)
def test_counters_that_do_not_fit_the_files_are_not_trusted(tmp_path: Path, marker: Any) -> None:
    ctx = working_context(tmp_path, steps=12)
    ctx.compress(RecordingSummarizer(), CompressionPolicy(keep_recent=3))
    if isinstance(marker, dict) and marker["after_seq"] == "boundary":
        marker = {**marker, "after_seq": ctx.boundary_seq}
    ctx.detach()
    update_state(ctx.path, datetime(2100, 1, 1, tzinfo=UTC), fsync=False, set_fields={"unsummarized": marker})

    resumed = ContextStore(tmp_path, fsync="step", hostname="other-host",
                           clock=lambda: datetime(2100, 1, 1, tzinfo=UTC)).open(ctx.uuid, heartbeat=False)

    assert (resumed.unsummarized_tokens, resumed.unsummarized_count) == counted(resumed)


@settings(max_examples=80, deadline=None)
@given(
    spec=st.lists(st.one_of(st.just("a"), st.integers(min_value=1, max_value=3)), min_size=1, max_size=40),
    keep_recent=st.integers(min_value=1, max_value=6),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=400)),
    sizes=st.lists(st.integers(min_value=1, max_value=120), min_size=120, max_size=120),
)
def test_a_compression_reads_only_the_oldest_messages_yet_picks_the_span_a_full_read_would(
    tmp_path_factory: pytest.TempPathFactory, spec: list[str | int], keep_recent: int, cap: int | None,
    sizes: list[int],
) -> None:
    ctx = ContextStore(tmp_path_factory.mktemp("span"), fsync="never").create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "you are a coding agent")
    ctx.append_message("user", "fix the failing test")
    for n, record in enumerate(flatten(spec)):  # assistant calls and their tool results, of varied sizes
        role = record["role"]
        extra = {"tool_call_id": f"c{n}", "tool_name": "bash"} if role == "tool" else {}
        ctx.append_message(role, "x" * sizes[n % len(sizes)] * 4, **extra)
    expected = select_span(ctx.unsummarized(), keep_recent, cap)
    summarizer = RecordingSummarizer()

    try:
        ctx.compress(summarizer, CompressionPolicy(keep_recent=keep_recent), cap)
    except SummaryRejectedError:
        pass  # a span too small for a shorter summary: what matters is which span it was given
    ctx.release()

    given_span = summarizer.calls[0][1] if summarizer.calls else []
    assert given_span == [m["seq"] for m in expected]
