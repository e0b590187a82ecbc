"""Seed 000's importance: 0.3 recency + 0.3 role + 0.4 content, and what the summarizer keeps verbatim."""

from __future__ import annotations

import pytest

from agent.prompts import summarizer_messages
from contexts.importance import content_score, group_importance, importance, most_important


def test_the_weights_of_seed_000() -> None:
    user = {"role": "user", "content": "Do not touch the public API of parse_date, keep Python 3.9 support"}
    assert importance(user, 9, 10) == pytest.approx(0.3 * 1.0 + 0.3 * 1.0 + 0.4 * 0.2)
    assert importance(user, 0, 10) == pytest.approx(0.3 * 0.0 + 0.3 * 1.0 + 0.4 * 0.2)


@pytest.mark.parametrize(
    ("record", "score"),
    [
        ({"role": "tool", "tool_name": "bash", "content": "FAILED tests/test_a.py::t - AssertionError\nexit code: 1"},
         0.3 + 0.25 + 0.2),
        ({"role": "tool", "tool_name": "edit_file", "content": "edited src/a.py: 1 replacement"}, 0.25 + 0.3),
        ({"role": "tool", "tool_name": "edit_file", "content": "error: old_string not found"}, 0.3 + 0.25),
        ({"role": "tool", "tool_name": "bash", "content": "3 passed in 0.2s\nexit code: 0"}, 0.2 + 0.25),
        ({"role": "assistant", "content": "Let me look at the parser module next."}, 0.0),
        ({"role": "user", "content": "ok"}, 0.2 * 0.7),
    ],
)
def test_content_scores_rank_errors_failures_and_edits_high(record: dict[str, str], score: float) -> None:
    assert content_score(record) == pytest.approx(score)


def test_a_group_counts_as_its_most_important_member() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}
    result = {"role": "tool", "content": "Traceback (most recent call last):\nValueError: bad", "tool_name": "bash"}
    assert group_importance([call, result], 0, 5) == importance(result, 0, 5)


def test_the_summarizer_is_given_the_most_important_items_to_keep_verbatim() -> None:
    span = [{"seq": n, "role": "assistant", "content": f"reading file {n}"} for n in range(3, 12)]
    span.insert(2, {"seq": 99, "role": "tool", "tool_name": "bash",
                    "content": "FAILED tests/test_dates.py::test_feb - AssertionError: 2024-03-01 != None"})
    assert most_important(span, 1) == [span[2]]
    user = summarizer_messages(None, span)[1]["content"]
    verbatim = user.split("=== Keep these verbatim", 1)[1]
    assert "FAILED tests/test_dates.py::test_feb - AssertionError: 2024-03-01 != None" in verbatim
