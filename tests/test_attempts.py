"""The pure rules of several attempts per task (worker/attempts.py): which attempt is delivered and why, how many
attempts a task gets, the names its attempts run under, and which kept branches are due for deletion."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from worker.attempts import (
    Candidate,
    KeptBranch,
    attempt_branch,
    attempt_request,
    attempt_task_key,
    attempt_uuid,
    attempts_for,
    due_for_deletion,
    pick,
    pick_body,
    review_prompt,
)
from worker.settings import load_settings


def cand(attempt: int, passed: bool | None, lines: int, *, delivered: bool = True) -> Candidate:
    return Candidate(attempt, f"u{attempt}", f"tasuki/1-abc-a{attempt}", passed, lines, f"diff of {attempt}",
                     delivered=delivered)


def test_the_attempt_whose_checks_pass_wins_over_a_smaller_one_whose_checks_fail() -> None:
    chosen = pick([cand(1, False, 2), cand(2, True, 40)])
    assert chosen.winner is not None
    assert chosen.winner.attempt == 2
    assert "its checks passed" in chosen.reason
    assert "attempt 2 of 2" in chosen.reason


def test_among_passing_attempts_without_a_reviewer_the_smallest_change_wins_and_a_tie_goes_to_the_first() -> None:
    assert pick([cand(1, True, 30), cand(2, True, 5), cand(3, False, 1)]).winner == cand(2, True, 5)
    tie = pick([cand(2, True, 5), cand(1, True, 5)])
    assert tie.winner == cand(1, True, 5)
    assert "smallest change (5 lines)" in tie.reason


def test_a_sensible_reviewer_decides_among_tied_attempts_and_sees_only_them() -> None:
    seen: list[list[int]] = []

    def reviewer(pool: Sequence[Candidate]) -> str:
        seen.append([c.attempt for c in pool])
        return "Attempt 3."

    chosen = pick([cand(1, True, 2), cand(2, False, 1), cand(3, True, 90)], reviewer)
    assert seen == [[1, 3]]
    assert chosen.winner == cand(3, True, 90)
    assert "the reviewer preferred it" in chosen.reason


@pytest.mark.parametrize("answer", ["2", 7, "1 or 3", "", None, True, ["3"], "no idea"])
def test_a_reviewer_that_answers_nonsense_or_a_loser_is_skipped_for_the_smallest_change(answer: object) -> None:
    chosen = pick([cand(1, True, 9), cand(2, False, 1), cand(3, True, 4)], lambda pool: answer)
    assert chosen.winner == cand(3, True, 4)
    assert "smallest change" in chosen.reason


def test_a_reviewer_that_raises_is_skipped() -> None:
    def broken(pool: Sequence[Candidate]) -> int:
        raise RuntimeError("model down")

    assert pick([cand(1, True, 9), cand(2, True, 4)], broken).winner == cand(2, True, 4)


def test_attempts_that_changed_nothing_or_failed_never_win_over_one_that_delivered() -> None:
    failing_checks = cand(3, False, 50)
    chosen = pick([cand(1, True, 0), cand(2, True, 3, delivered=False), failing_checks], lambda pool: 1)
    assert chosen.winner == failing_checks
    assert "every attempt's checks fail" in chosen.reason
    unjudged = pick([cand(1, None, 8), cand(2, False, 1)])
    assert unjudged.winner == cand(1, None, 8)


def test_no_attempt_that_delivered_means_no_winner() -> None:
    chosen = pick([cand(1, None, 0), cand(2, True, 4, delivered=False)])
    assert chosen.winner is None
    assert "none of the 2 attempts delivered a change" in chosen.reason


def test_the_body_names_the_winner_why_and_the_others_branches() -> None:
    candidates = [cand(1, False, 2), cand(2, True, 40), cand(3, None, 0)]
    body = pick_body(pick(candidates), candidates, "Fix add().")
    assert body.startswith("Fix add().\n\n### Attempts\nattempt 2 of 3: its checks passed")
    assert "- attempt 1: 2 lines changed, checks fail on `tasuki/1-abc-a1`, task `u1`" in body
    assert "- attempt 2 (delivered): 40 lines changed, checks pass on `tasuki/1-abc-a2`" in body
    assert "- attempt 3: no change, task `u3`" in body


def test_the_review_prompt_holds_each_diff_within_its_share() -> None:
    big = Candidate(1, "u1", "b1", True, 5, "x" * 50_000)
    text = review_prompt([big, cand(2, True, 3)], "Fix add().", max_chars=10_000)
    assert '<attempt number="1">' in text
    assert "[... diff cut ...]" in text
    assert "diff of 2" in text
    assert len(text) < 12_000


def test_how_many_attempts_the_task_then_labels_then_repository_then_default_within_the_maximum() -> None:
    key = {"task_source": "github", "owner": "octo", "repo": "calc", "task_type": "issue", "task_id": "4"}
    repos = {"octo/calc": 3, "github/octo/other": 5}
    labels = {"try hard": 4, "try twice": 2}
    assert attempts_for(1, repos, labels, 8, key) == 3
    assert attempts_for(1, repos, labels, 8, key, ["bug", "try twice", "try hard"]) == 4
    assert attempts_for(1, repos, labels, 8, key, ["try hard"], requested=2) == 2
    assert attempts_for(1, repos, labels, 8, key, requested=50) == 8
    assert attempts_for(1, repos, labels, 8, {**key, "repo": "other"}) == 5
    assert attempts_for(2, {}, {}, 8, key, requested=0) == 1
    assert attempts_for(2, {}, {}, 8, key) == 2


def test_the_attempts_names_are_derived_from_the_parents() -> None:
    key = {"task_source": "local", "owner": "local", "repo": "calc", "task_type": "prompt", "task_id": "7"}
    parent = "0e6a4c1e-7c43-4c8b-9d5f-1a7d2a8f9b10"
    assert attempt_uuid(parent, 1) == attempt_uuid(parent, 1) != attempt_uuid(parent, 2)
    assert attempt_task_key(key, 2)["task_id"] == "7.a2"
    assert attempt_branch("tasuki/7-0e6a4c1e", 2) == "tasuki/7-0e6a4c1e-a2"
    child = attempt_request({"task_key": key, "prompt": "p", "attempts": 3}, parent, "tasuki/7-0e6a4c1e", 2, 3,
                            {"title": "t"})
    assert "attempts" not in child
    assert child["issue"] == {"title": "t"}
    assert child["prompt"] == "p"
    assert child["attempt"] == {"parent": parent, "number": 2, "of": 3, "branch": "tasuki/7-0e6a4c1e-a2",
                                "parent_task_key": key}


def test_kept_branches_are_due_once_kept_their_days() -> None:
    delivered = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    kept = [KeptBranch("p", "b1", delivered), KeptBranch("q", "b2", delivered + timedelta(days=3))]
    assert due_for_deletion(kept, delivered + timedelta(days=7) - timedelta(seconds=1), 7) == []
    assert due_for_deletion(kept, delivered + timedelta(days=7), 7) == kept[:1]
    assert due_for_deletion(kept, delivered + timedelta(days=30), 7) == kept


def test_settings_bound_the_attempts_and_name_a_known_reviewer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_settings(None, env={}).attempts.default == 1
    loaded = load_settings(None, env={"TASUKI__ATTEMPTS__DEFAULT": "3", "TASUKI__ATTEMPTS__KEEP_BRANCHES_DAYS": "2"})
    assert loaded.attempts.default == 3
    assert loaded.attempts.keep_branches_days == 2
    for env in ({"TASUKI__ATTEMPTS__DEFAULT": "9"}, {"TASUKI__ATTEMPTS__REVIEWER": "nosuch"}):
        with pytest.raises(Exception, match="attempts"):
            load_settings(None, env=env)


def test_a_task_asks_for_its_attempts_on_the_command_line_and_the_api_within_the_bound() -> None:
    import argparse

    from cli.commands import attempt_count
    from webhooks.api import Submission

    assert attempt_count("3") == 3
    for bad in ("0", "9", "two", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            attempt_count(bad)
    asked = Submission(repo="octo/calc", issue=4, attempts=3).request("0e6a4c1e-7c43-4c8b-9d5f-1a7d2a8f9b10")
    assert asked["attempts"] == 3
    assert "attempts" not in Submission(repo="octo/calc", issue=4).request("0e6a4c1e-7c43-4c8b-9d5f-1a7d2a8f9b10")
    with pytest.raises(ValueError, match="attempts"):
        Submission(repo="octo/calc", issue=4, attempts=9)


def test_the_worker_counts_attempts_from_the_task_its_labels_and_settings_and_never_multiplies_an_attempt() -> None:
    from worker.attempt_tasks import wanted
    from worker.run import TaskRequest

    s = load_settings(None, env={"TASUKI__ATTEMPTS__LABELS": '{"try hard": 3}',
                                 "TASUKI__ATTEMPTS__REPOSITORIES": '{"octo/calc": 2}'})
    key = {"task_source": "github", "owner": "octo", "repo": "calc", "task_type": "issue", "task_id": "4"}
    assert wanted(s, TaskRequest(key)) == 2
    assert wanted(s, TaskRequest(key, issue={"labels": ["try hard"]}), ["try hard"]) == 3
    assert wanted(s, TaskRequest(key, attempts=5)) == 5
    assert wanted(s, TaskRequest(key, attempts=5, attempt={"parent": "p", "number": 1})) == 1
    assert wanted(s, TaskRequest(key, attempts=5, grading={"test_patch": ""})) == 1
    assert wanted(s, TaskRequest(key, followup={"kind": "review"})) == 1
