"""A GitHub App end to end: a labeled issue's webhook (naming its installation) → the intake → a real celery
worker → the scripted model → the fake GitHub, whose installation tokens live two seconds here (an hour on
GitHub). The task outlives two of them and still pushes, opens its pull request and comments — every API
call and git command with a token valid at that moment, as the App's bot. A suspended installation fails
its task in one log line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.fake_forge import FakeForge
from tests.helpers.fake_github_app import FakeApp
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, git, make_buggy_repo
from webhooks.events import Trigger, github_action
from webhooks.followups import new_task_request
from worker.forges.app_tokens import SUSPENDED
from worker.settings import load_settings

pytestmark = pytest.mark.integration

APP_ID, SLUG = 7, "tasuki-app"
INSTALLED, SUSPENDED_INSTALLATION = 42, 43
OWNER, REPO, OTHER = "Codertocat", "Hello-World", "Suspended-World"
SECRET = "app-e2e-webhook-secret"
# Scaled down from GitHub's hour; the cache renews a token a twelfth of its life before it ends (an hour's: 5 min),
# so each git run or API call must start within that twelfth: 0.33 s here, which a machine at load 60 can take (a
# CI run failed at 2 s, 0.17 s).
TOKEN_LIFETIME_S = 4.0
SUMMARY = "Wrote notes over two token lifetimes."


def trajectory() -> list[dict[str, Any]]:
    """Two changes, each followed by a model answer that takes longer than a token lives."""
    bash = "bash"
    return [
        {"content": "One.", "tool_calls": [{"name": bash, "arguments": {"command": "echo one >> notes.txt"}}]},
        {"delay_s": TOKEN_LIFETIME_S * 1.5},
        {"content": "Two.", "tool_calls": [{"name": bash, "arguments": {"command": "echo two >> notes.txt"}}]},
        {"delay_s": TOKEN_LIFETIME_S * 1.5},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": SUMMARY}}]},
    ]


@dataclass
class AppFleet:
    stack: Stack
    forge: FakeForge
    app: FakeApp
    intake: IntakeServer

    def labeled(self, repo: str, number: int, installation: int) -> dict[str, Any]:
        """The App's ``issues.labeled`` webhook for issue ``number`` of ``repo`` (the issue made on the forge)."""
        self.forge.add_item(OWNER, repo, number, f"Issue {number}", "Write notes.", labels=["bug"])
        payload = load_payload("github/issues.labeled.json")
        payload["issue"]["number"] = number
        payload["repository"]["name"] = repo
        payload["installation"] = {"id": installation, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNDI="}
        return payload

    def post(self, payload: dict[str, Any]) -> httpx.Response:
        body, headers = github_delivery("issues", payload, SECRET)
        return httpx.post(self.intake.url + "/webhooks/github", content=body, headers=headers, timeout=10)

    def label(self, repo: str, number: int, installation: int) -> str:
        """Label issue ``number`` of ``repo`` through the App's webhook; the task's UUID."""
        response = self.post(self.labeled(repo, number, installation))
        assert response.status_code == 202, response.text
        return str(response.json()["task_id"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[AppFleet]:
    root = tmp_path_factory.mktemp("github-app")
    app = FakeApp.generate(APP_ID, SLUG, token_lifetime_s=TOKEN_LIFETIME_S)
    app.install(INSTALLED, (OWNER, REPO))
    app.install(SUSPENDED_INSTALLATION, (OWNER, OTHER)).suspended = True
    with model_server(trajectory()) as model, \
            FakeForge(root / "forge", "no-static-token", bot_login=app.bot_login, app=app).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        forge.add_repo(OWNER, OTHER, make_buggy_repo(root / "other"))
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITHUB__AUTH": "app",
            "TASUKI__GITHUB__APP_ID": str(APP_ID),
            "TASUKI__GITHUB__BOT_LOGIN": app.bot_login,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
            "GITHUB_APP_PRIVATE_KEY": app.private_key,
        })
        try:
            stack.start_worker("app")
            with intake_server(load_settings(env={**stack.env(), "GITHUB_WEBHOOK_SECRET": SECRET})) as intake:
                yield AppFleet(stack, forge, app, intake)
        finally:
            stack.stop()


def test_a_task_that_outlives_two_tokens_still_pushes_opens_its_pull_request_and_comments(fleet: AppFleet) -> None:
    task_id = fleet.label(REPO, 1, INSTALLED)
    state = fleet.stack.wait_finished(task_id)
    assert state["status"] == "completed", (state.get("error"), state)

    issued = [t for t in fleet.app.issued if t.installation == INSTALLED]
    assert len(issued) >= 3  # the task outlived two tokens
    assert fleet.app.refused == []  # and never sent one GitHub would refuse (expired: 401)
    branch = f"tasuki/1-{task_id[:8]}"
    assert fleet.forge.branch_file(OWNER, REPO, branch, "notes.txt") == "one\ntwo\n"
    assert fleet.forge.change(OWNER, REPO, branch).title.startswith("Issue 1")
    item = fleet.forge.item(OWNER, REPO, 1)
    fleet.stack.wait_until(lambda: item.comments and item.comments[-1].body.startswith("**Tasuki finished."),
                           what="the summary comment")
    assert {c.author for c in item.comments} == {fleet.app.bot_login}
    assert "coding agent done" in item.labels
    bare = fleet.forge.git_root / OWNER / f"{REPO}.git"
    email = f"{fleet.app.bot_user_id}+{SLUG}[bot]@users.noreply.github.com"
    assert set(git(bare, "log", "-1", "--format=%an <%ae>|%cn <%ce>", branch).splitlines()) == {
        f"{SLUG}[bot] <{email}>|{SLUG}[bot] <{email}>"}
    metadata = json.loads((fleet.stack.contexts_dir / "completed" / task_id / "metadata.json").read_text())
    assert metadata["request"]["trigger"]["installation"] == INSTALLED
    written = "".join(p.read_text(errors="replace") for p in (fleet.stack.contexts_dir / "completed" / task_id)
                      .rglob("*") if p.is_file())
    written += "".join(w.log_text() for w in fleet.stack.workers)
    assert not [t.token for t in fleet.app.issued if t.token in written]  # no token on disk or in a log


def test_a_suspended_installation_fails_its_task_in_one_named_log_line(fleet: AppFleet) -> None:
    payload = fleet.labeled(OTHER, 2, SUSPENDED_INSTALLATION)
    # The intake cannot learn the sender's permission without a token: held, nothing queued (fail closed).
    held = fleet.post(payload)
    assert (held.status_code, held.json()["status"]) == (202, "held"), held.text
    # A task that reaches a worker all the same (sent as the intake would have sent it) fails in one line.
    action = github_action("issues", payload, load_settings(env=fleet.stack.env()).github)
    assert isinstance(action, Trigger)
    task_id = fleet.stack.send(new_task_request(action))
    state = fleet.stack.wait_finished(task_id)
    assert state["status"] == "failed"
    assert SUSPENDED in state["error"]
    worker = fleet.stack.workers[0]
    # The issue is told after the context is finished: the log's last word on the task comes after that.

    def told_all() -> str | None:
        text = worker.log_text()
        return text if f'"task finished", "uuid": "{task_id}"' in text else None

    log: str = fleet.stack.wait_until(told_all, what="the task's last log line")
    lines = [json.loads(line) for line in log.splitlines() if task_id in line and line.startswith("{")]
    errors = [line["event"] for line in lines if line["level"] == "error"]
    assert len(errors) == 1, log[-3000:]
    assert SUSPENDED in errors[0]
    told = [line for line in lines if line["event"] == "finish not reported"]
    assert [line["error"].count(SUSPENDED) for line in told] == [1], log[-3000:]  # the issue not told, said once
    assert not [line for line in lines if "exception" in line]  # no traceback: the one line says it
    assert fleet.forge.item(OWNER, OTHER, 2).comments == []  # no token could be had: nothing to tell it with
    assert not [t for t in fleet.app.issued if t.installation == SUSPENDED_INSTALLATION]
