"""Building the prompt (SPEC §6, §13): pinned task, latest summary, the newest step and the most important
messages that fit, a marker for every gap, never more than the budget."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contexts import ContextStore
from contexts.prompt import build_prompt, to_prompt_message
from contexts.tokens import estimate_message_tokens
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)
from tests.helpers.schemas import validate_context_dir

SUMMARY_PREFIX = "Summary of the work so far"
MARKER = re.compile(r"\[(\d+) (?:earlier messages omitted|messages omitted here); the recall tool finds them\]")


def message_cost(message: dict[str, Any], factor: float) -> int:
    """What a prompt message costs, estimated the way records are (UTF-8 bytes / 4 + framing)."""
    return int(estimate_message_tokens(message.get("content"), message.get("tool_calls")) * factor + 0.5)


def prompt_cost(prompt: list[dict[str, Any]], factor: float = 1.0) -> int:
    return sum(message_cost(m, factor) for m in prompt)


def record(seq: int, role: str, size: int, **extra: Any) -> dict[str, Any]:
    content = None if role == "assistant" and extra.get("tool_calls") and size == 0 else "w" * size
    out = {"seq": seq, "role": role, "content": content, **extra}
    out["token_count"] = estimate_message_tokens(content, extra.get("tool_calls"))
    return out


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"c": call_id})}}


# A turn: ("user", [size]), ("assistant", [size]) or ("calls", [assistant size, result sizes...]).
turns = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["user", "assistant"]), st.lists(st.integers(0, 400), min_size=1, max_size=1)),
        st.tuples(st.just("calls"), st.lists(st.integers(0, 400), min_size=2, max_size=4)),
    ),
    max_size=30,
)


def history(spec: list[tuple[str, list[int]]]) -> tuple[list[dict[str, Any]], list[int]]:
    """Records (system, task, then the turns) and the seqs at which a turn ends (where a summary may end)."""
    records = [record(1, "system", 40), record(2, "user", 120)]
    turn_ends = [2]
    for kind, sizes in spec:
        if kind == "calls":
            ids = [f"call_{len(records) + 1}_{n}" for n in range(len(sizes) - 1)]
            records.append(record(len(records) + 1, "assistant", sizes[0], tool_calls=[call(i) for i in ids]))
            for call_id, size in zip(ids, sizes[1:], strict=True):
                records.append(record(len(records) + 1, "tool", size, tool_call_id=call_id, tool_name="bash"))
        else:
            records.append(record(len(records) + 1, kind, sizes[0]))
        turn_ends.append(len(records))
    return records, turn_ends


@settings(max_examples=300, deadline=None)
@given(
    spec=turns,
    summary_at=st.integers(0, 31),
    summary_size=st.integers(1, 300),
    share=st.integers(0, 110),
    factor=st.sampled_from([1.0, 0.6, 1.37, 2.0]),
)
def test_the_prompt_never_exceeds_the_budget_and_keeps_its_shape(
    spec: list[tuple[str, list[int]]], summary_at: int, summary_size: int, share: int, factor: float
) -> None:
    records, turn_ends = history(spec)
    pinned = records[:2]
    summary = None
    boundary = 2
    end = turn_ends[min(summary_at, len(turn_ends) - 1)]
    if summary_at and end > 2:
        summary = {
            "summary_id": 1,
            "start_seq": 3,
            "end_seq": end,
            "summary": "s" * summary_size,
            "summary_tokens": (summary_size + 3) // 4,
        }
        boundary = end
    after = [r for r in records if r["seq"] > boundary]
    fixed = prompt_cost([to_prompt_message(r) for r in pinned], factor)
    if summary is not None:
        fixed += message_cost(
            {"content": f"{SUMMARY_PREFIX} (messages 3-{end}, condensed by Tasuki):\n\n{summary['summary']}"}, factor
        )
    marker_reserve = message_cost(
        {"content": f"[{len(after)} earlier messages omitted; the recall tool finds them]"}, factor
    )
    budget = fixed + marker_reserve + prompt_cost(after, factor) * share // 100  # from nothing to all of it

    prompt = build_prompt(
        pinned,
        summary,
        reversed(records),
        boundary_seq=boundary,
        last_seq=len(records),
        budget_tokens=budget,
        factor=factor,
    )

    assert prompt_cost(prompt, factor) <= budget
    assert prompt[:2] == [to_prompt_message(r) for r in pinned]
    rest = prompt[2:]
    if summary is not None:
        assert rest[0]["role"] == "user"
        assert rest[0]["content"].startswith(SUMMARY_PREFIX)
        rest = rest[1:]
    # The kept messages in their order, a marker counting exactly each run of left-out ones between them.
    kept: list[dict[str, Any]] = []
    position = 0
    for message in rest:
        found = MARKER.fullmatch(message.get("content") or "")
        if found:
            assert position == 0 or kept[-1] is not None  # never two markers in a row
            position += int(found.group(1))
            kept.append(None)  # type: ignore[arg-type]
            continue
        assert message == to_prompt_message(after[position])
        position += 1
        kept.append(message)
    assert position == len(after)
    # Never a tool result without the assistant message that called it.
    called: set[str] = set()
    for message in rest:
        called |= {c["id"] for c in message.get("tool_calls") or []}
        if message["role"] == "tool":
            assert message["tool_call_id"] in called
    # The newest step is kept whenever it fits on its own beside one marker.
    newest: list[dict[str, Any]] = []
    for older in reversed(after):
        newest.insert(0, older)
        if older["role"] != "tool":
            break
    if newest and newest[0]["role"] != "tool" and fixed + marker_reserve + prompt_cost(newest, factor) <= budget:
        assert rest[-len(newest):] == [to_prompt_message(r) for r in newest]


def test_when_not_all_fit_errors_are_kept_over_plain_chatter_with_a_marker_per_gap() -> None:
    error = "FAILED test_parse - AssertionError: 3 != 4"
    records = [record(1, "system", 40), record(2, "user", 120), record(3, "assistant", 0, tool_calls=[call("c1")])]
    records.append({"seq": 4, "role": "tool", "content": error, "tool_call_id": "c1", "tool_name": "bash",
                    "token_count": estimate_message_tokens(error)})
    records += [record(seq, "assistant", 100) for seq in range(5, 13)]
    markers = message_cost({"content": "[12 messages omitted here; the recall tool finds them]"}, 1.0)  # one gap
    budget = prompt_cost([to_prompt_message(r) for r in records[:4]]) + prompt_cost([records[4], records[-1]]) + markers
    prompt = build_prompt(records[:2], None, reversed(records), boundary_seq=2, last_seq=12, budget_tokens=budget)
    contents = [m["content"] for m in prompt[2:]]
    assert contents == [None, error, "[7 messages omitted here; the recall tool finds them]", "w" * 100]
    assert prompt_cost(prompt) <= budget


def test_everything_fits_in_a_large_budget_without_a_marker() -> None:
    records, _ = history([("user", [10]), ("calls", [0, 30, 40]), ("assistant", [20])])
    prompt = build_prompt(
        records[:2], None, reversed(records), boundary_seq=2, last_seq=len(records), budget_tokens=10_000
    )
    assert prompt == [to_prompt_message(r) for r in records]
    assert prompt[4] == {
        "role": "tool",
        "content": "w" * 30,
        "tool_call_id": records[4]["tool_call_id"],
        "name": "bash",
    }


def test_a_tool_group_that_does_not_fit_is_left_out_whole() -> None:
    records, _ = history([("calls", [0, 400, 400]), ("assistant", [8])])
    pinned_cost = prompt_cost(records[:2])
    budget = pinned_cost + 12 + prompt_cost([records[-1]]) + prompt_cost(records[-2:-1])  # the newest + one result
    prompt = build_prompt(
        records[:2], None, reversed(records), boundary_seq=2, last_seq=len(records), budget_tokens=budget
    )
    assert [m["role"] for m in prompt] == ["system", "user", "user", "assistant"]
    assert prompt[2]["content"] == "[3 earlier messages omitted; the recall tool finds them]"


def test_the_pinned_task_is_kept_even_when_nothing_else_fits() -> None:
    records, _ = history([("user", [100])] * 5)
    prompt = build_prompt(records[:2], None, reversed(records), boundary_seq=2, last_seq=len(records), budget_tokens=1)
    assert prompt[:2] == [to_prompt_message(r) for r in records[:2]]
    assert prompt[2:] == [{"role": "user", "content": "[5 earlier messages omitted; the recall tool finds them]"}]


def test_a_context_builds_its_prompt_from_the_files_after_the_latest_summary(tmp_path: Path) -> None:
    ctx = ContextStore(tmp_path, fsync="never").create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "you are a coding agent")
    ctx.append_message("user", "fix issue #42")
    for n in range(12):
        ctx.append_message("assistant", f"step {n} " + "x" * 200)
    from contexts import CompressionPolicy

    ctx.compress(lambda _prev, span: f"did steps up to {span[-1]['seq']}", CompressionPolicy(keep_recent=4))
    ctx.append_message("assistant", "after the summary")

    prompt = ctx.build_prompt(100_000)

    assert [m["content"] for m in prompt[:2]] == ["you are a coding agent", "fix issue #42"]
    assert prompt[2]["content"].startswith(f"{SUMMARY_PREFIX} (messages 3-10")
    assert prompt[2]["content"].endswith("did steps up to 10")
    assert [m["content"][:7] for m in prompt[3:]] == ["step 8 ", "step 9 ", "step 10", "step 11", "after t"]
    tight = ctx.build_prompt(prompt_cost(prompt[:3]) + 12 + 20)
    assert tight[3]["content"] == "[4 earlier messages omitted; the recall tool finds them]"  # seq 11-14
    assert tight[4:] == [{"role": "assistant", "content": "after the summary"}]
    assert prompt_cost(tight) <= prompt_cost(prompt[:3]) + 12 + 20
    ctx.release()
    validate_context_dir(ctx.path)


@pytest.mark.parametrize("reserve", [0, 500])
def test_reserve_tokens_leave_room_for_the_reply(tmp_path: Path, reserve: int) -> None:
    ctx = ContextStore(tmp_path, fsync="never").create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "s")
    ctx.append_message("user", "t")
    for _ in range(10):
        ctx.append_message("assistant", "y" * 396)  # 103 tokens each
    prompt = ctx.build_prompt(1000, reserve_tokens=reserve)
    assert prompt_cost(prompt) <= 1000 - reserve
    assert len([m for m in prompt if m["role"] == "assistant"]) == (9 if reserve == 0 else 4)
