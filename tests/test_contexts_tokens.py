"""Token estimates (UTF-8 bytes / 4) and their calibration by the provider's reported prompt tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from contexts import ContextStore
from contexts.tokens import MAX_CALIBRATION, MIN_CALIBRATION, calibrate, estimate_message_tokens, estimate_tokens
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        (None, 0),
        ("", 0),
        ("abcd", 1),
        ("abcde", 2),
        ("x" * 400, 100),
        ("日本語", 3),  # 9 UTF-8 bytes: Japanese is not undercounted by half
        ("日本語のテキスト", 6),  # 24 bytes
    ],
)
def test_estimate_is_utf8_bytes_over_four_rounded_up(text: str | None, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_a_message_costs_its_content_its_tool_calls_and_framing() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    assert estimate_message_tokens("abcd") == 1 + 4
    assert estimate_message_tokens(None) == 4
    assert estimate_message_tokens(None, calls) > estimate_message_tokens(None)


@pytest.mark.parametrize(
    ("current", "estimated", "reported", "expected"),
    [
        (1.0, 1000, 1000, 1.0),
        (1.0, 1000, 2000, 1.5),  # halfway towards what the provider observed
        (1.5, 1000, 2000, 1.75),
        (1.0, 1000, 500, 0.75),
        (1.0, 100, 100_000, (1.0 + MAX_CALIBRATION) / 2),  # absurd reports are clamped
        (1.0, 100_000, 1, (1.0 + MIN_CALIBRATION) / 2),
        (1.3, 0, 500, 1.3),  # nothing to learn from
        (1.3, 500, 0, 1.3),
    ],
)
def test_calibration_moves_towards_the_reported_ratio(
    current: float, estimated: int, reported: int, expected: float
) -> None:
    assert calibrate(current, estimated, reported) == pytest.approx(expected)


def test_calibration_converges_to_a_steady_ratio() -> None:
    factor = 1.0
    for _ in range(20):
        factor = calibrate(factor, 1000, 1300)
    assert factor == pytest.approx(1.3, abs=0.001)


def test_a_context_keeps_its_calibration_across_resumes_and_uses_it_for_the_prompt(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    ctx.append_message("system", "s")
    ctx.append_message("user", "task")
    ctx.append_message("assistant", "x" * 396)  # 99 + 4 = 103 estimated tokens
    pinned_cost = 5 + 5
    budget = pinned_cost + 12 + 103  # exactly room for the reply at factor 1
    assert [m["role"] for m in ctx.build_prompt(budget)] == ["system", "user", "assistant"]

    assert ctx.calibrate_tokens(1000, 2000) == 1.5
    ctx.release()
    resumed = store.open(ctx.uuid, heartbeat=False)

    assert resumed.token_factor == 1.5
    assert resumed.read_state()["token_calibration"] == 1.5
    prompt = resumed.build_prompt(budget)
    assert [m["role"] for m in prompt] == ["system", "user", "user"]
    assert prompt[-1]["content"] == "[1 earlier messages omitted; the recall tool finds them]"
