"""Outcomes (issue 28) without processes: the published ``pull_request.closed`` and Merge Request Hook examples
classified, the SQLite outcome store's records and aggregates, the report's figures, the rejection fact that
reaches the repository memory, and the ``/metrics`` family."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import fakeredis
import pytest

from contexts.outcomes import PullOutcome, Selection, report, row_of, weekly
from contexts.outcomes_sqlite import SQLiteOutcomeStore
from memory.records import Memory
from memory.rejections import PREFIX, with_rejection
from tests.helpers.deliveries import load_payload
from webhooks.events import Ignore, github_action, gitlab_action
from webhooks.metrics import Metrics
from webhooks.pull_events import PullEnded
from worker.names import STATS_KEY
from worker.settings_models import GitHubSettings, GitLabSettings, Settings

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday


# -- the published examples ------------------------------------------------------------------------


def test_github_pull_request_closed_example_is_a_closed_unmerged_ending() -> None:
    action = github_action("pull_request", load_payload("github/pull_request.closed.json"), GitHubSettings())
    assert isinstance(action, PullEnded)
    assert action.pull_key == {"task_source": "github", "owner": "Codertocat", "repo": "Hello-World",
                               "task_type": "pull_request", "task_id": "2"}
    assert action.outcome == "closed"
    assert action.at == datetime(2019, 5, 15, 15, 21, 18, tzinfo=UTC)  # its closed_at
    assert action.head == "changes"
    assert action.review_comments == 1


def test_github_merged_and_reopened_and_other_actions() -> None:
    payload = load_payload("github/pull_request.closed.json")
    payload["pull_request"].update(merged=True, merged_at="2019-05-16T10:00:00Z")
    merged = github_action("pull_request", payload, GitHubSettings())
    assert isinstance(merged, PullEnded)
    assert (merged.outcome, merged.at) == ("merged", datetime(2019, 5, 16, 10, tzinfo=UTC))
    payload["action"] = "reopened"
    reopened = github_action("pull_request", payload, GitHubSettings())
    assert isinstance(reopened, PullEnded)
    assert reopened.outcome == "reopened"
    payload["action"] = "synchronize"
    assert isinstance(github_action("pull_request", payload, GitHubSettings()), Ignore)


def test_github_ending_is_recorded_even_when_the_bot_closed_it() -> None:
    # With a token the "bot" is often a person's account, who may merge the request themselves.
    payload = load_payload("github/pull_request.closed.json")
    assert isinstance(github_action("pull_request", payload, GitHubSettings(bot_login="Codertocat")), PullEnded)


@pytest.mark.parametrize(("action", "outcome"), [("merge", "merged"), ("close", "closed"), ("reopen", "reopened")])
def test_gitlab_merge_request_hook_endings(action: str, outcome: str) -> None:
    payload = load_payload("gitlab/merge_request_hook.json")
    payload["object_attributes"]["action"] = action
    ended = gitlab_action(payload, GitLabSettings())
    assert isinstance(ended, PullEnded)
    assert ended.pull_key == {"task_source": "gitlab", "owner": "gitlabhq", "repo": "gitlab-test",
                              "task_type": "merge_request", "task_id": "1"}
    assert ended.outcome == outcome
    assert ended.head == "ms-viewport"


def test_gitlab_merge_request_hook_opened_is_not_an_ending() -> None:
    assert not isinstance(gitlab_action(load_payload("gitlab/merge_request_hook.json"), GitLabSettings()), PullEnded)


# -- the store and the report ----------------------------------------------------------------------


def outcome(n: int, *, repo: str = "github/acme/api", model: str = "gpt-4o", opened: datetime = T0) -> PullOutcome:
    return PullOutcome(pull=f"{repo}/pull_request/{n}", thread=f"{repo}/issue/{n}", repository=repo, number=n,
                       url=f"https://github.com/acme/api/pull/{n}", branch=f"tasuki/{n}-abc", model=model,
                       first_uuid=f"u{n}", started_at=opened - timedelta(hours=1), opened_at=opened)


@pytest.fixture
def store(tmp_path: Path) -> SQLiteOutcomeStore:
    return SQLiteOutcomeStore(tmp_path)


def test_store_file_is_private_and_an_ending_redelivered_is_not_recorded_twice(store: SQLiteOutcomeStore) -> None:
    assert store.opened(outcome(1)) is True
    assert store.opened(outcome(1)) is False
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    assert store.ended("github/acme/api/pull_request/99", merged=True, at=T0) is None  # no task opened it


def test_thread_records_tasks_spend_reviews_and_merge(store: SQLiteOutcomeStore) -> None:
    pull = outcome(1).pull
    store.opened(outcome(1))
    store.add_task(pull, "u1", followup=False, tokens=1000, cost_usd=0.01)
    store.add_task(pull, "f1", followup=True, tokens=500, cost_usd=None)
    store.add_task(pull, "f1", followup=True, tokens=600, cost_usd=0.002)  # its ending again: replaced, not added
    store.note_review(pull, [{"author": "ann", "body": f"remark {i}"} for i in range(7)])
    assert store.ended(pull, merged=True, at=T0 + timedelta(hours=5), review_comments=3) == "open"

    found = store.get(pull)
    assert found is not None
    assert (found.state, found.followups, found.tokens, found.review_comments) == ("merged", 1, 1600, 7)
    assert found.cost_usd == pytest.approx(0.012)
    assert found.tasks == ("u1", "f1")
    assert found.time_to_merge_s == 6 * 3600  # from the first task's start
    assert [e["body"] for e in found.last_review] == [f"remark {i}" for i in range(2, 7)]  # the newest five
    assert store.reopened(pull) == "merged"
    assert store.get(pull).state == "open"  # type: ignore[union-attr]


def test_a_review_that_comes_before_the_request_is_recorded_waits_for_it(store: SQLiteOutcomeStore) -> None:
    # The request is written by a job after its first task ends; a reviewer can be quicker than that job.
    pull = outcome(1).pull
    assert store.note_review(pull, [{"author": "ann", "body": "Not here."}]) is False
    assert store.note_review(pull, [{"author": "bob", "body": "Nor here."}]) is False
    assert store.get(pull) is None
    assert store.opened(outcome(1)) is True
    found = store.get(pull)
    assert found is not None
    assert ([e["body"] for e in found.last_review], found.review_comments) == (["Not here.", "Nor here."], 2)
    assert store.opened(outcome(1)) is False  # the job again: the reviews are not counted twice
    assert store.get(pull).review_comments == 2  # type: ignore[union-attr]
    assert store.note_review(pull, [{"author": "cy", "body": "Later."}]) is True
    assert store.get(pull).review_comments == 3  # type: ignore[union-attr]


def test_report_figures_by_repository_model_and_week(store: SQLiteOutcomeStore) -> None:
    hours = [2, 4, 30]
    for n, h in enumerate(hours, start=1):  # three merged on api, after 2, 4 and 30 hours
        store.opened(outcome(n))
        store.add_task(outcome(n).pull, f"u{n}", followup=False, tokens=100, cost_usd=1.0)
        store.ended(outcome(n).pull, merged=True, at=T0 + timedelta(hours=h - 1))
    store.opened(outcome(4))
    store.add_task(outcome(4).pull, "f4", followup=True, tokens=100, cost_usd=2.0)
    store.ended(outcome(4).pull, merged=False, at=T0 + timedelta(days=1))
    store.opened(outcome(5, repo="github/acme/web", model="llama3", opened=T0 + timedelta(days=8)))  # still open

    rows, total = report(store, "repo", Selection())
    assert [r.key for r in rows] == ["github/acme/api", "github/acme/web"]
    api = rows[0]
    assert (api.opened, api.merged, api.closed_unmerged, api.still_open) == (4, 3, 1, 0)
    assert api.merge_rate == 0.75
    assert api.cost_per_merged_usd == pytest.approx(5.0 / 3, rel=1e-4)  # every request's spend / merged
    assert api.median_time_to_merge_s == 4 * 3600
    assert api.followups_per_pr == 0.25
    assert (total.opened, total.still_open, total.merge_rate) == (5, 1, 0.75)
    assert rows[1].cost_usd is None
    assert rows[1].merge_rate is None

    by_model, _ = report(store, "model", Selection())
    assert {r.key: r.opened for r in by_model} == {"gpt-4o": 4, "llama3": 1}
    by_week, _ = report(store, "week", Selection())
    assert [(r.key, r.opened) for r in by_week] == [("2026-03-02", 4), ("2026-03-09", 1)]
    only, whole = report(store, None, Selection(repository="github/acme/web"))
    assert only[0].opened == whole.opened == 1
    assert report(store, None, Selection(since=date(2026, 3, 3), until=date(2026, 3, 10)))[1].opened == 1
    assert report(store, None, Selection(until=date(2026, 3, 1)))[1].opened == 0

    chart = weekly(store, T0 + timedelta(days=9), 3)
    assert [(r.key, r.opened, r.merged) for r in chart] == [("2026-02-23", 0, 0), ("2026-03-02", 4, 3),
                                                           ("2026-03-09", 1, 0)]


# -- what reviewers rejected -----------------------------------------------------------------------


def test_a_rejection_becomes_a_repository_fact_with_its_tasks_and_bounded() -> None:
    closed = PullOutcome(**{**outcome(7).__dict__, "state": "closed", "closed_at": T0, "tasks": ("u7", "f7"),
                            "last_review": ({"author": "ann", "body": "We do not vendor libraries.",
                                             "path": "vendor/x.py", "line": 3},)})
    existing = Memory("repository", "github:acme/api", "- Run tests with `make test` (u1)", T0, ("u1",))
    updated = with_rejection(existing, closed, "github:acme/api", 500, T0)
    assert updated is not None
    lines = updated.text.splitlines()
    assert lines[0] == "- Run tests with `make test` (u1)"
    assert lines[1].startswith(PREFIX + "https://github.com/acme/api/pull/7 (closed unmerged 2026-03-02)")
    assert 'ann on vendor/x.py:3: "We do not vendor libraries."' in lines[1]
    assert lines[1].endswith("(u7, f7)")
    assert updated.sources == ("u1", "u7", "f7")
    again = with_rejection(updated, closed, "github:acme/api", 500, T0)
    assert again is not None
    assert again.text == updated.text
    small = with_rejection(updated, PullOutcome(**{**closed.__dict__, "number": 8, "url": "u/8"}), "r", 40, T0)
    assert small is not None
    assert "pull/7" not in small.text
    assert "u/8" in small.text
    assert with_rejection(existing, PullOutcome(**{**closed.__dict__, "last_review": ()}), "r", 500, T0) is None


# -- /metrics ----------------------------------------------------------------------------------------


def test_metrics_count_pull_requests_by_outcome() -> None:
    client = fakeredis.FakeRedis()
    client.hset(STATS_KEY, mapping={"pull_requests:opened": 5, "pull_requests:merged": 3})
    text = Metrics(Settings(), client).render().decode()
    assert 'tasuki_pull_requests_total{outcome="opened"} 5.0' in text
    assert 'tasuki_pull_requests_total{outcome="merged"} 3.0' in text
    assert 'tasuki_pull_requests_total{outcome="closed"} 0.0' in text


def test_row_of_an_empty_group_has_no_rates() -> None:
    from contexts.outcomes import OutcomeGroup

    row = row_of(OutcomeGroup("x"))
    assert (row.opened, row.merge_rate, row.cost_per_merged_usd, row.median_time_to_merge_s) == (0, None, None, None)


def test_tallies_agree_with_a_scan_of_every_request_after_any_history(store: SQLiteOutcomeStore) -> None:
    import random

    rng = random.Random(3)  # noqa: S311 - a reproducible history, not a secret
    repos, models = ["github/acme/api", "github/acme/web", "gitlab/acme/ops"], ["gpt-4o", "llama3"]
    for n in range(120):
        opened = T0 + timedelta(hours=rng.randrange(24 * 7 * 6))
        made = outcome(n, repo=rng.choice(repos), model=rng.choice(models), opened=opened)
        store.opened(made)
        pull = made.pull
        store.add_task(pull, f"u{n}", followup=False, tokens=rng.randrange(1000), cost_usd=rng.choice([None, 0.1]))
        for _ in range(rng.randrange(3)):
            store.add_task(pull, f"f{n}-{_}", followup=True, tokens=10, cost_usd=0.01)
            store.note_review(pull, [{"author": "a", "body": "b"}])
        for _ in range(rng.randrange(3)):  # endings, reopenings, endings again
            if rng.random() < 0.3:
                store.reopened(pull)
            else:
                store.ended(pull, merged=rng.random() < 0.6, at=opened + timedelta(minutes=rng.randrange(1, 9999)))
    everything = Selection(since=date(2000, 1, 1))
    for by in (None, "repo", "model", "week"):
        assert sorted(store.groups(by, Selection()), key=str) == sorted(store.groups(by, everything), key=str), by
        for repo in repos:
            tallied = store.groups(by, Selection(repository=repo))
            scanned = store.groups(by, Selection(repository=repo, since=date(2000, 1, 1)))
            assert sorted(tallied, key=str) == sorted(scanned, key=str), (by, repo)


def test_gitea_pull_request_closed_example_is_an_ending_of_a_gitea_request() -> None:
    from webhooks.gitea_events import gitea_action
    from worker.settings_models import GiteaSettings

    payload = load_payload("gitea/pull_request.closed.json")
    ended = gitea_action("pull_request", payload, GiteaSettings())
    assert isinstance(ended, PullEnded)
    assert ended.pull_key == {"task_source": "gitea", "owner": "gogits", "repo": "hello-world",
                              "task_type": "pull_request", "task_id": "2"}
    assert (ended.outcome, ended.head, ended.body) == ("closed", "feature", "this is big")
    payload["pull_request"].update(merged=True, merged_at="2017-12-10T08:00:00Z")
    merged = gitea_action("pull_request", payload, GiteaSettings())
    assert isinstance(merged, PullEnded)
    assert (merged.outcome, merged.at) == ("merged", datetime(2017, 12, 10, 8, tzinfo=UTC))


# -- the worker's records ------------------------------------------------------------------------------


def test_a_finished_task_records_its_request_once_and_a_follow_up_adds_its_spend(tmp_path: Path) -> None:
    from contexts import ContextStore
    from contexts.usage import Usage
    from worker.outcome_tasks import record_task

    contexts = ContextStore(tmp_path / "contexts", fsync="never")
    key = {"task_source": "github", "owner": "acme", "repo": "api", "task_type": "issue", "task_id": "4"}
    first = contexts.create(key, {"provider": "openai", "model": "gpt-4o"}, heartbeat=False,
                            extra_metadata={"request": {"task_key": key}})
    first.update_state(usage=[(Usage("agent", "gpt-4o", 1000, 100), 0.01)])
    done = first.finish("completed", result={"pull_request_url": "https://github.com/acme/api/pull/12",
                                             "branch": "tasuki/4-abc"})
    followup = {"kind": "review", "pull_kind": "pull_request", "pull": 12, "branch": "tasuki/4-abc"}
    second = contexts.create(key, {"provider": "openai", "model": "gpt-4o"}, heartbeat=False,
                             extra_metadata={"request": {"task_key": key, "followup": followup}})
    second.update_state(usage=[(Usage("agent", "gpt-4o", 300, 30), None)])
    later = second.finish("cancelled")
    store = SQLiteOutcomeStore(tmp_path / "contexts")

    assert record_task(store, done) is True
    assert record_task(store, done) is False  # its ending announced again: not a second request
    assert record_task(store, later) is False
    found = store.get("github/acme/api/pull_request/12")
    assert found is not None
    assert (found.thread, found.model, found.branch, found.first_uuid) == ("github/acme/api/issue/4", "gpt-4o",
                                                                            "tasuki/4-abc", first.uuid)
    assert (found.tasks, found.followups, found.tokens) == ((first.uuid, second.uuid), 1, 1430)
    assert found.cost_usd == pytest.approx(0.01)
