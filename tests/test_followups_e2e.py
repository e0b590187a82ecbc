"""Follow-ups end to end (SPEC §14): a published webhook example → the intake (uvicorn) → Redis → a real
celery worker → the scripted model → the fake GitHub/GitLab over real HTTP and git.

Label → PR; a review with three line comments → new commits on the same head branch, no second PR, a reply
in each review thread; failed CI runs → fix tasks with the job's log tail, up to the limit, again after
``/tasuki autofix on``; a comment posted mid-run reaches the next model request; commands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from replay import ReplayServer
from tests.helpers.deliveries import gitea_delivery, gitea_labeled, github_delivery, gitlab_delivery, load_payload
from tests.helpers.fake_forge import FakeChange, FakeForge
from tests.helpers.followup_payloads import (
    check_suite_failed,
    commit_of,
    gitlab_diff_note,
    gitlab_pipeline_failed,
    pull_comment,
    review_comment_created,
    review_submitted,
    workflow_run_failed,
)
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, git, make_buggy_repo
from worker.settings import load_settings
from worker.threads import find_branch_thread

pytestmark = pytest.mark.integration

FORGE_TOKEN = "followups-forge-token-77c1"
GITHUB_SECRET = "followups-github-secret"
GITLAB_SECRET = "followups-gitlab-token"
GITEA_SECRET = "followups-gitea-secret"
OWNER, REPO = "Codertocat", "Hello-World"
GATE = "second-call"  # a task whose text carries a hold mark waits at its second model call until released


def hold(name: object) -> str:
    """The mark that holds a task at its second model call until ``release``/``open_gate`` names it."""
    return f"(held by the test: {name})"
SUMMARY = "Noted the change in notes.txt."
LEAKED = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def trajectory() -> list[dict[str, Any]]:
    """Every task (first or follow-up) appends a line to notes.txt; a task marked with ``hold(…)`` gets its second
    answer only when its test releases it, so a test can speak to a task while it runs, however slow the
    machine."""
    return [
        {"content": "Note it.", "tool_calls": [{"name": "bash", "arguments": {"command": "echo change >> notes.txt"}}]},
        {"gate": GATE, "gate_when": r"\(held by the test: [^)]*\)"},
        {"content": None, "tool_calls": [{"name": "bash", "arguments": {"command": "cat notes.txt"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": SUMMARY}}]},
    ]


@dataclass
class Fleet:
    stack: Stack
    forge: FakeForge
    intake: IntakeServer
    model: ReplayServer

    def github(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = github_delivery(event, payload, GITHUB_SECRET)
        response = httpx.post(self.intake.url + "/webhooks/github", content=body, headers=headers, timeout=10)
        return response.status_code, response.json()

    def gitlab(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = gitlab_delivery(event, payload, token=GITLAB_SECRET)
        response = httpx.post(self.intake.url + "/webhooks/gitlab", content=body, headers=headers, timeout=10)
        return response.status_code, response.json()

    def gitea(self, event: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = gitea_delivery(event, payload, GITEA_SECRET)
        response = httpx.post(self.intake.url + "/webhooks/gitea", content=body, headers=headers, timeout=10)
        return response.status_code, response.json()

    def task_text(self, task_id: str) -> str:
        """The pinned task message of a finished task."""
        path = self.stack.contexts_dir / "completed" / task_id / "messages.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return str(next(r for r in records if r["role"] == "user")["content"])

    def changes_of(self, owner: str, number: int) -> list[FakeChange]:
        """The pull/merge requests opened for issue ``number``."""
        return [c for c in self.forge.changes if c.owner == owner and c.head.startswith(f"tasuki/{number}-")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("followups")
    with model_server(trajectory()) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "github-source"))
        forge.add_repo("gitlabhq", "gitlab-test", make_buggy_repo(root / "gitlab-source"))
        forge.add_repo("gogits", "hello-world", make_buggy_repo(root / "gitea-source"))
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITLAB__API_URL": forge.gitlab_api_url,
            "TASUKI__GITEA__API_URL": forge.gitea_api_url,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
            "TASUKI__GITLAB__LABELS__TRIGGER": "Platform",
            "TASUKI__FOLLOWUPS__CI_LOG_LINES": "5",
            "GITHUB_TOKEN": FORGE_TOKEN,
            "GITLAB_TOKEN": FORGE_TOKEN,
            "GITEA_TOKEN": FORGE_TOKEN,
        })
        try:
            stack.start_worker("followups")
            env = {**stack.env(), "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "GITLAB_WEBHOOK_SECRET": GITLAB_SECRET,
                   "GITEA_WEBHOOK_SECRET": GITEA_SECRET}
            with intake_server(load_settings(env=env)) as intake:
                yield Fleet(stack, forge, intake, model)
        finally:
            stack.stop()


def label_to_pull_request(fleet: Fleet, number: int) -> tuple[str, FakeChange]:
    """Label issue ``number`` on GitHub; the finished task's UUID and its pull request."""
    fleet.forge.add_item(OWNER, REPO, number, f"Issue {number}", "Write it down.", labels=["bug"])
    payload = load_payload("github/issues.labeled.json")
    payload["issue"]["number"] = number
    status, answer = fleet.github("issues", payload)
    assert status == 202, answer
    task_id = answer["task_id"]
    assert fleet.stack.wait_finished(task_id)["status"] == "completed"
    finished_after_summary(fleet, OWNER, REPO, number)
    branch = f"tasuki/{number}-{task_id[:8]}"
    change = fleet.forge.change(OWNER, REPO, branch)
    # The worker remembers the thread by its branch just after the task's finish comment: an event about the
    # branch (a failed CI run) sent before then would find no thread. Wait for it, as the forge's real delay does.
    with redis.Redis.from_url(fleet.stack.redis_url) as client:
        fleet.stack.wait_until(lambda: find_branch_thread(client, "github", OWNER, REPO, branch) is not None,
                               what="the thread remembered by its branch")
    return task_id, change


def follow_up_waiting_on_the_model(fleet: Fleet, number: int, text: str) -> tuple[FakeChange, str]:
    """A pull request opened for issue ``number``, and a follow-up asked for by a mention on it, held by the
    model on its second request until the test calls ``release(fleet, text)``."""
    _, change = label_to_pull_request(fleet, number)
    status, answer = fleet.github("issue_comment", pull_comment(change, f"@tasuki {text} {hold(text)}"))
    assert status == 202, answer
    fleet.stack.wait_until(lambda: fleet.model.model.gate_reached(GATE, text), what="the follow-up held")
    return change, str(answer["task_id"])


def release(fleet: Fleet, text: str) -> None:
    """Let the task marked ``hold(text)`` have its answer."""
    fleet.model.model.open_gate(GATE, containing=hold(text))


def branch_log(fleet: Fleet, owner: str, repo: str, branch: str) -> list[str]:
    bare = fleet.forge.git_root / owner / f"{repo}.git"
    return git(bare, "log", "--format=%s", branch).splitlines()


def finished_after_summary(fleet: Fleet, owner: str, repo: str, number: int) -> None:
    item = fleet.forge.item(owner, repo, number)
    fleet.stack.wait_until(lambda: item.comments and item.comments[-1].body.startswith("**Tasuki"),
                           what="the summary comment")


def test_review_then_ci_failures_continue_the_same_branch(fleet: Fleet, redis_client: redis.Redis) -> None:
    _, change = label_to_pull_request(fleet, 1)
    assert "tasuki-thread:" in change.body  # the pull request records its thread
    commits_before = len(branch_log(fleet, OWNER, REPO, change.head))

    review_id, comments = fleet.forge.add_review(OWNER, REPO, change.number, "Codertocat", [
        ("notes.txt", 1, "@@ -0,0 +1 @@\n+change", "Say what changed."),
        ("calc.py", 2, "@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b", "Is this still subtracting?"),
        ("test_calc.py", 8, "@@ -6,3 +6,3 @@\n class AddTest", "Add a test for negatives."),
    ])
    status, answer = fleet.github("pull_request_review", review_submitted(change, review_id, "Three things."))
    assert status == 202, answer
    followup = answer["task_id"]
    # GitHub also sends each line comment of the review: one active task per thread, nothing new starts.
    for comment in comments:
        status, again = fleet.github("pull_request_review_comment", review_comment_created(change, comment))
        assert again.get("task_id") == followup, again

    state = fleet.stack.wait_finished(followup)
    assert state["status"] == "completed", state
    assert fleet.changes_of(OWNER, 1) == [change]  # no second pull request
    assert fleet.forge.branch_file(OWNER, REPO, change.head, "notes.txt") == "change\nchange\n"
    assert len(branch_log(fleet, OWNER, REPO, change.head)) == commits_before + 1
    fleet.stack.wait_until(lambda: all(c.replies for c in comments), what="a reply in every review thread")
    assert [len(c.replies) for c in comments] == [1, 1, 1]
    assert all(SUMMARY in c.replies[0] for c in comments)

    task = fleet.task_text(followup)
    for path in ("notes.txt:1", "calc.py:2", "test_calc.py:8", "Is this still subtracting?", "-    return a - b"):
        assert path in task
    assert SUMMARY in task  # the thread's history: the first task's final summary
    metadata = json.loads((fleet.stack.contexts_dir / "completed" / followup / "metadata.json").read_text())
    assert metadata["task_key"]["task_type"] == "issue"  # the thread's key: one active task per thread
    pull = fleet.forge.item(OWNER, REPO, change.number)
    finished_after_summary(fleet, OWNER, REPO, change.number)
    assert any(followup in c.body and "`completed`" in c.body for c in pull.comments)  # its progress comment

    # CI: two fix tasks in a row, then none, until `/tasuki autofix on`.
    log = "\n".join([f"line {i}" for i in range(1, 40)] + [f"token {LEAKED}", "FAILED test_calc.py::test_add"])
    fixes = []
    for event in ("workflow_run", "check_suite"):
        run = fleet.forge.add_run([("lint", "success", "ok"), ("test", "failure", log)])
        payload = (workflow_run_failed if event == "workflow_run" else check_suite_failed)(OWNER, REPO,
                                                                                          change.head, run)
        status, answer = fleet.github(event, payload)
        assert status == 202, answer
        fixes.append(answer["task_id"])
        assert fleet.stack.wait_finished(answer["task_id"])["status"] == "completed"
        if event == "workflow_run":  # the check suite of the same failed commit starts nothing more
            same = check_suite_failed(OWNER, REPO, change.head, fleet.forge.add_run([]), sha=commit_of(run))
            assert fleet.github("check_suite", same)[1]["reason"] == "this commit's failure already has a fix task"
    for fix in fixes:
        task = fleet.task_text(fix)
        assert "CI job test failed" in task
        assert "FAILED test_calc.py::test_add" in task
        assert "line 37" in task
        assert "line 36" not in task
        assert "[GITHUB_TOKEN]" in task
        assert LEAKED not in task
    run = fleet.forge.add_run([("test", "failure", log)])
    status, answer = fleet.github("workflow_run", workflow_run_failed(OWNER, REPO, change.head, run))
    assert (status, answer["status"]) == (200, "ignored")
    assert "CI fixes in a row" in answer["reason"]

    assert fleet.github("issue_comment", pull_comment(change, "/tasuki autofix on"))[1]["status"] == "autofix_on"
    status, answer = fleet.github("workflow_run", workflow_run_failed(OWNER, REPO, change.head, run))
    assert status == 202, answer
    assert fleet.stack.wait_finished(answer["task_id"])["status"] == "completed"
    assert fleet.github("issue_comment", pull_comment(change, "/tasuki autofix off"))[1]["status"] == "autofix_off"
    status, answer = fleet.github("workflow_run", workflow_run_failed(OWNER, REPO, change.head, run))
    assert answer == {"status": "ignored", "reason": "autofix is off"}
    assert fleet.changes_of(OWNER, 1) == [change]
    assert fleet.forge.branch_file(OWNER, REPO, change.head, "notes.txt").count("change") == 5


def test_a_ci_fix_whose_token_may_not_read_checks_starts_and_tells_the_model_why_it_has_no_log(
    fleet: Fleet,
) -> None:
    _, change = label_to_pull_request(fleet, 13)
    run = fleet.forge.add_run([("test", "failure", "FAILED test_unseen.py::test_denied")])
    fleet.forge.ci_refused = 403  # a token without the checks (Actions) permission
    try:
        status, answer = fleet.github("check_suite", check_suite_failed(OWNER, REPO, change.head, run))
        assert status == 202, answer
        state = fleet.stack.wait_finished(answer["task_id"])
    finally:
        fleet.forge.ci_refused = None
    assert state["status"] == "completed", state
    task = fleet.task_text(answer["task_id"])
    assert "CI failed on this branch, but the failed CI jobs and their logs could not be read" in task
    assert "HTTP 403" in task
    assert "permission" in task
    assert "test_denied" not in task
    assert FORGE_TOKEN not in task


def test_a_comment_mid_run_reaches_the_next_model_request(fleet: Fleet) -> None:
    fleet.forge.add_item(OWNER, REPO, 5, f"Issue five {hold('Issue five')}", "Write it down.", labels=["bug"])
    payload = load_payload("github/issues.labeled.json")
    payload["issue"]["number"] = 5
    status, answer = fleet.github("issues", payload)
    assert status == 202
    task_id = answer["task_id"]
    fleet.stack.wait_until(lambda: fleet.model.model.gate_reached(GATE, "Issue five"), what="the task held")

    comment = load_payload("github/issue_comment.created.json")
    comment["issue"]["number"] = 5
    comment["comment"]["body"] = "Please also mention the changelog."
    status, answer = fleet.github("issue_comment", comment)
    assert (status, answer) == (200, {"status": "delivered", "task_id": task_id})
    release(fleet, "Issue five")

    assert fleet.stack.wait_finished(task_id)["status"] == "completed"
    seen = [r for r in fleet.model.requests if r["turn"] == 2 and "Issue five" in json.dumps(r["body"])]
    assert seen
    assert "Please also mention the changelog." in json.dumps(seen[0]["body"])
    path = fleet.stack.contexts_dir / "completed" / task_id / "messages.jsonl"
    heard = [json.loads(line) for line in path.read_text().splitlines() if '"inbox"' in line]
    assert len(heard) == 1
    assert heard[0]["role"] == "user"
    assert "<comment" in heard[0]["content"]


def test_unknown_commands_are_answered_and_retry_carries_the_summary(fleet: Fleet) -> None:
    _, change = label_to_pull_request(fleet, 7)
    finished_after_summary(fleet, OWNER, REPO, 7)
    comment = load_payload("github/issue_comment.created.json")
    comment["issue"]["number"] = 7
    comment["comment"]["body"] = "/tasuki dance"
    status, answer = fleet.github("issue_comment", comment)
    assert (status, answer["status"]) == (200, "ignored")
    item = fleet.forge.item(OWNER, REPO, 7)
    reply = fleet.stack.wait_until(lambda: next((c for c in item.comments if "Unknown command" in c.body), None),
                                   what="the reply to an unknown command")
    assert "`/tasuki retry`" in reply.body
    assert "`/tasuki autofix off`" in reply.body

    comment["comment"]["body"] = "/tasuki retry"
    status, answer = fleet.github("issue_comment", comment)
    assert status == 202, answer
    retried = answer["task_id"]
    assert fleet.stack.wait_finished(retried)["status"] == "completed"
    assert SUMMARY in fleet.task_text(retried)  # the previous task's summary carried over
    assert fleet.changes_of(OWNER, 7) == [change]


def test_gitea_mention_and_review_on_the_pull_request_continue_it_and_a_readers_is_refused(fleet: Fleet) -> None:
    fleet.forge.add_item("gogits", "hello-world", 1, "Problem", "Found a bug", labels=["coding agent"])
    status, answer = fleet.gitea("issues", gitea_labeled(["coding agent"]))
    assert status == 202, answer
    first = answer["task_id"]
    assert fleet.stack.wait_finished(first)["status"] == "completed"
    change = fleet.forge.change("gogits", "hello-world", f"tasuki/1-{first[:8]}")
    finished_after_summary(fleet, "gogits", "hello-world", 1)

    # The published comment on a pull request, on the one the task opened (its body carries the thread).
    comment = load_payload("gitea/pull_request_comment.created.json")
    comment["issue"].update(number=change.number, body=change.body)
    comment["comment"]["body"] = "@tasuki Mention Gitea too."
    fleet.forge.permissions["unknwon"] = "read"
    status, answer = fleet.gitea("issue_comment", comment)
    assert status == 202, answer
    refused = fleet.stack.wait_finished(answer["task_id"])
    assert refused["status"] == "failed"
    assert "may not start tasks" in refused["error"]

    fleet.forge.permissions["unknwon"] = "write"
    status, answer = fleet.gitea("issue_comment", comment)
    assert status == 202, answer
    followup = answer["task_id"]
    assert fleet.stack.wait_finished(followup)["status"] == "completed"
    assert "Mention Gitea too." in fleet.task_text(followup)
    assert fleet.changes_of("gogits", 1) == [change]  # no second pull request
    assert fleet.forge.branch_file("gogits", "hello-world", change.head, "notes.txt") == "change\nchange\n"
    finished_after_summary(fleet, "gogits", "hello-world", change.number)
    assert fleet.forge.item("gogits", "hello-world", change.number).labels == ["coding agent done"]

    # Commands from a comment whose author's role the payload does not say wait for a worker's access check.
    comment["comment"]["body"] = "/tasuki autofix off"
    assert fleet.gitea("issue_comment", comment) == (202, {"status": "autofix_off", "pending": "access check"})

    # A review asking for changes (the published review delivery, on this pull request) continues it again.
    review = load_payload("gitea/pull_request_approved.reviewed.json")
    review["pull_request"].update(number=change.number, body=change.body, head={"ref": change.head})
    review.update(repository=comment["repository"], sender=comment["sender"])
    review["review"] = {"type": "pull_request_review_rejected", "content": "Say which forge it was."}
    status, answer = fleet.gitea("pull_request_rejected", review)
    assert status == 202, answer
    assert fleet.stack.wait_finished(answer["task_id"])["status"] == "completed"
    assert "Say which forge it was." in fleet.task_text(answer["task_id"])
    assert fleet.changes_of("gogits", 1) == [change]
    assert fleet.forge.branch_file("gogits", "hello-world", change.head, "notes.txt") == "change\nchange\nchange\n"


def test_gitlab_diff_note_and_failed_pipeline_continue_the_merge_request(fleet: Fleet) -> None:
    fleet.forge.add_item("gitlabhq", "gitlab-test", 23, "New API", "Create it", labels=["Platform"])
    fleet.forge.members[1] = 40
    status, answer = fleet.gitlab("Issue Hook", load_payload("gitlab/issue_hook.json"))
    assert status == 202
    first = answer["task_id"]
    assert fleet.stack.wait_finished(first)["status"] == "completed"
    change = fleet.forge.change("gitlabhq", "gitlab-test", f"tasuki/23-{first[:8]}")

    note = gitlab_diff_note(change, 4242, "Mention the API here.", "notes.txt", 1, "d1scuss10n")
    status, answer = fleet.gitlab("Note Hook", note)
    assert status == 202, answer
    followup = answer["task_id"]
    assert fleet.stack.wait_finished(followup)["status"] == "completed"
    assert "notes.txt:1" in fleet.task_text(followup)
    assert "Mention the API here." in fleet.task_text(followup)
    fleet.stack.wait_until(lambda: fleet.forge.discussion_replies.get("d1scuss10n"), what="the discussion reply")
    assert fleet.changes_of("gitlabhq", 23) == [change]  # no second merge request
    assert fleet.forge.branch_file("gitlabhq", "gitlab-test", change.head, "notes.txt") == "change\nchange\n"
    finished_after_summary(fleet, "gitlabhq", "gitlab-test", change.number)

    run = fleet.forge.add_run([("rspec", "failure", "boom\nexpected 5, got -1")])
    status, answer = fleet.gitlab("Pipeline Hook", gitlab_pipeline_failed("gitlabhq/gitlab-test", change.head, run,
                                                                          change.number))
    assert status == 202, answer
    assert fleet.stack.wait_finished(answer["task_id"])["status"] == "completed"
    assert "expected 5, got -1" in fleet.task_text(answer["task_id"])


def test_a_review_arriving_while_a_follow_up_runs_is_delivered_to_it(fleet: Fleet) -> None:
    change, followup = follow_up_waiting_on_the_model(fleet, 9, "tidy the notes up")

    review_id, [comment] = fleet.forge.add_review(OWNER, REPO, change.number, "Codertocat", [
        ("notes.txt", 2, "@@ -1 +1,2 @@\n change\n+change", "Why twice?")])
    status, answer = fleet.github("pull_request_review", review_submitted(change, review_id, None))
    assert (status, answer) == (200, {"status": "delivered", "task_id": followup})  # not a second task
    release(fleet, "tidy the notes up")

    assert fleet.stack.wait_finished(followup)["status"] == "completed"
    seen = [r for r in fleet.model.requests if r["turn"] == 2 and "tidy the notes up" in json.dumps(r["body"])]
    assert seen
    assert "notes.txt:2" in json.dumps(seen[0]["body"])
    assert "Why twice?" in json.dumps(seen[0]["body"])
    fleet.stack.wait_until(lambda: comment.replies, what="the reply in the review thread")
    assert fleet.changes_of(OWNER, 9) == [change]


def test_cancel_on_the_pull_request_stops_the_follow_up_of_its_thread(fleet: Fleet) -> None:
    change, followup = follow_up_waiting_on_the_model(fleet, 11, "add a line")

    status, answer = fleet.github("issue_comment", pull_comment(change, "/tasuki cancel"))
    assert (status, answer["status"], answer["task_id"]) == (200, "cancelled", followup)
    release(fleet, "add a line")
    assert fleet.stack.wait_finished(followup)["status"] == "cancelled"
    finished_after_summary(fleet, OWNER, REPO, change.number)
    assert fleet.forge.item(OWNER, REPO, change.number).comments[-1].body.startswith("**Tasuki stopped: cancelled.**")
    assert fleet.forge.branch_file(OWNER, REPO, change.head, "notes.txt") == "change\n"  # nothing pushed


def test_a_comment_arriving_while_the_task_opens_its_pull_request_starts_the_next_task_on_it(fleet: Fleet) -> None:
    fleet.forge.add_item(OWNER, REPO, 6, "Issue six", "Write it down.", labels=["bug"])
    said: list[tuple[int, dict[str, Any]]] = []

    def comment_meanwhile(change: FakeChange) -> None:  # the agent is done: its inbox is read no more
        comment = load_payload("github/issue_comment.created.json")
        comment["issue"]["number"] = 6
        comment["comment"]["body"] = "Please also mention the changelog."
        said.append(fleet.github("issue_comment", comment))

    fleet.forge.on_open = comment_meanwhile
    try:
        payload = load_payload("github/issues.labeled.json")
        payload["issue"]["number"] = 6
        task_id = fleet.github("issues", payload)[1]["task_id"]
        assert fleet.stack.wait_finished(task_id)["status"] == "completed"
    finally:
        fleet.forge.on_open = None

    assert said == [(200, {"status": "delivered", "task_id": task_id})]
    [change] = fleet.changes_of(OWNER, 6)

    def next_task() -> dict[str, Any] | None:
        for metadata in (fleet.stack.contexts_dir / "completed").glob("*/metadata.json"):
            request = json.loads(metadata.read_text())["request"]
            if (request.get("followup") or {}).get("previous") == task_id:
                return dict(request, uuid=metadata.parent.name)
        return None

    request = fleet.stack.wait_until(next_task, 90.0, "the next task of the thread to finish")
    assert request["prompt"] == "Please also mention the changelog."
    assert (request["followup"]["kind"], request["followup"]["pull"]) == ("comment", change.number)
    assert fleet.changes_of(OWNER, 6) == [change]  # it continued the pull request, it did not open another
