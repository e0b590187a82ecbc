"""End to end: a published webhook example → the intake (uvicorn) → Redis → a real celery worker → the
scripted model → a pull/merge request on a fake GitHub/GitLab over real HTTP and git, with labels moved,
one progress comment edited in place, a summary comment, duplicates dropped and one task per issue."""

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
from tests.helpers.fake_forge import FakeForge
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server
from tests.helpers.stack import FIXED_CALC, Stack, fix_calc_trajectory, make_buggy_repo
from tests.helpers.user_config_server import UserConfigServer
from worker.forges.reporter import MARKER
from worker.names import ACTIVE_PREFIX
from worker.settings import load_settings

pytestmark = pytest.mark.integration

FORGE_TOKEN = "e2e-forge-token-5d1c9a"
GITHUB_SECRET = "e2e-github-webhook-secret"
GITLAB_SECRET = "e2e-gitlab-webhook-token"
GITEA_SECRET = "e2e-gitea-webhook-secret"
DONE, FAILED = "coding agent done", "coding agent failed"
GATE = "second-call"  # a task whose text carries a hold mark waits at its second model call until released


def hold(name: object) -> str:
    """The mark that holds a task at its second model call until ``release``/``open_gate`` names it."""
    return f"(held by the test: {name})"


@dataclass
class Fleet:
    stack: Stack
    forge: FakeForge
    intake: IntakeServer
    model: ReplayServer
    elsewhere: IntakeServer  # an intake on another host: it cannot see the workers' contexts directory

    def post(self, route: str, delivery: tuple[bytes, dict[str, str]], *, via: IntakeServer | None = None
             ) -> tuple[int, dict[str, Any]]:
        body, headers = delivery
        response = httpx.post((via or self.intake).url + route, content=body, headers=headers, timeout=10)
        return response.status_code, response.json()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("e2e")
    users = UserConfigServer({"Codertocat": {"llm": {"openai": {"context_length": 64000}}}})
    # A task marked hold(…) waits for its second answer until its test releases it: the cancel test cancels a task
    # while it waits, however slow the machine is.
    trajectory = fix_calc_trajectory()
    trajectory.insert(1, {"gate": GATE, "gate_when": r"\(held by the test: [^)]*\)"})
    with model_server(trajectory) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo("Codertocat", "Hello-World", make_buggy_repo(root / "github-source"))
        forge.add_repo("gitlabhq", "gitlab-test", make_buggy_repo(root / "gitlab-source"))
        forge.add_repo("gogits", "hello-world", make_buggy_repo(root / "gitea-source"))
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__GITLAB__API_URL": forge.gitlab_api_url,
            "TASUKI__GITEA__API_URL": forge.gitea_api_url,
            "TASUKI__GITHUB__LABELS__TRIGGER": "bug",  # the label of the published example
            "TASUKI__GITLAB__LABELS__TRIGGER": "Platform",
            "TASUKI__USER_CONFIG_API__URL": users.url,
            "GITHUB_TOKEN": FORGE_TOKEN,
            "GITLAB_TOKEN": FORGE_TOKEN,
            "GITEA_TOKEN": FORGE_TOKEN,
        })
        try:
            stack.start_worker("e2e")
            env = {**stack.env(), "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "GITLAB_WEBHOOK_SECRET": GITLAB_SECRET,
                   "GITEA_WEBHOOK_SECRET": GITEA_SECRET}
            other_host = {**env, "TASUKI__CONTEXTS__BASE_DIR": str(root / "other-host-contexts")}
            with intake_server(load_settings(env=env)) as intake, \
                    intake_server(load_settings(env=other_host)) as elsewhere:
                yield Fleet(stack, forge, intake, model, elsewhere)
        finally:
            stack.stop()
            users.stop()


def assert_life_on_the_issue(fleet: Fleet, owner: str, repo: str, number: int, task_id: str) -> str:
    """The checks every forge shares; returns the URL of the opened pull/merge request."""
    stack, forge = fleet.stack, fleet.forge
    state = stack.wait_finished(task_id)
    assert state["status"] == "completed", state

    branch = f"tasuki/{number}-{task_id[:8]}"
    change = next(c for c in forge.changes if (c.owner, c.repo, c.head) == (owner, repo, branch))
    assert change.base == "main"
    assert forge.branch_file(owner, repo, branch, "calc.py") == FIXED_CALC

    item = forge.item(owner, repo, number)
    # The forge hears of the end after the context is final: wait for the summary comment, posted last.
    stack.wait_until(lambda: item.comments[-1].body.startswith("**Tasuki"), what="the summary comment")
    assert item.labels == [DONE]
    progress = [c for c in item.comments if MARKER.format(uuid=task_id) in c.body]
    assert len(progress) == 1  # one progress comment, edited in place
    assert progress[0].history, "the progress comment was never updated"
    assert "`completed`" in progress[0].body
    assert "5 model calls" in progress[0].body
    assert change.url in progress[0].body
    assert item.comments[-1].body.startswith(f"**Tasuki finished.** {change.url}")
    assert "Fix add(): it subtracted." in item.comments[-1].body

    git_requests = [r for r in forge.requests if r["path"].startswith("/git/")]
    assert git_requests
    assert all((r["authorization"] or "").startswith("Basic ") for r in git_requests)
    for path in (stack.contexts_dir / "completed" / task_id).iterdir():
        assert FORGE_TOKEN not in path.read_text(errors="replace")
    result = json.loads((stack.contexts_dir / "completed" / task_id / "state.json").read_text())
    assert result["result"]["pull_request_url"] == change.url
    return change.url


def test_github_label_to_pull_request(fleet: Fleet, redis_client: redis.Redis) -> None:
    fleet.forge.add_item("Codertocat", "Hello-World", 1, "Spelling error in the README file",
                         "It looks like you accidently spelled 'commit' with two 't's.", labels=["bug"])
    delivery = github_delivery("issues", load_payload("github/issues.labeled.json"), GITHUB_SECRET)

    status, answer = fleet.post("/webhooks/github", delivery)
    assert status == 202
    task_id = answer["task_id"]
    assert fleet.post("/webhooks/github", delivery) == (200, {"status": "duplicate"})
    second = github_delivery("issues", load_payload("github/issues.labeled.json"), GITHUB_SECRET)
    assert fleet.post("/webhooks/github", second) == (200, {"status": "active", "task_id": task_id})

    assert_life_on_the_issue(fleet, "Codertocat", "Hello-World", 1, task_id)
    metadata = json.loads((fleet.stack.contexts_dir / "completed" / task_id / "metadata.json").read_text())
    assert metadata["user"] == "Codertocat"
    assert metadata["config"]["context_length"] == 64000  # from the user config API
    assert metadata["config"]["user_config"] == "api"
    fleet.stack.wait_until(lambda: redis_client.get(ACTIVE_PREFIX + "github/Codertocat/Hello-World/issue/1") is None,
                           what="the issue's task key to be freed")


def test_gitlab_label_to_merge_request(fleet: Fleet, redis_client: redis.Redis) -> None:
    fleet.forge.add_item("gitlabhq", "gitlab-test", 23, "New API: create/update/delete file",
                         "Create new API for manipulations with repository", labels=["Platform"])
    delivery = gitlab_delivery("Issue Hook", load_payload("gitlab/issue_hook.json"), token=GITLAB_SECRET)

    status, answer = fleet.post("/webhooks/gitlab", delivery)
    assert status == 202
    task_id = answer["task_id"]
    assert fleet.post("/webhooks/gitlab", delivery) == (200, {"status": "duplicate"})

    url = assert_life_on_the_issue(fleet, "gitlabhq", "gitlab-test", 23, task_id)
    assert "/-/merge_requests/" in url


def test_gitea_label_to_pull_request(fleet: Fleet, redis_client: redis.Redis) -> None:
    fleet.forge.add_item("gogits", "hello-world", 1, "Problem", "Found a bug", labels=["coding agent"])
    delivery = gitea_delivery("issues", gitea_labeled(["coding agent"]), GITEA_SECRET)

    status, answer = fleet.post("/webhooks/gitea", delivery)
    assert status == 202
    task_id = answer["task_id"]
    assert fleet.post("/webhooks/gitea", delivery) == (200, {"status": "duplicate"})

    url = assert_life_on_the_issue(fleet, "gogits", "hello-world", 1, task_id)
    assert "/pulls/" in url
    # Gitea's state machine labels were created in the repository, then set on the issue by id.
    assert {"coding agent processing", DONE} <= set(fleet.forge.repo_labels[("gogits", "hello-world")])
    api = [r for r in fleet.forge.requests if r["path"].startswith("/api/v1/")]
    assert api
    assert all(r["authorization"] == f"token {FORGE_TOKEN}" for r in api)
    fleet.stack.wait_until(lambda: redis_client.get(ACTIVE_PREFIX + "gitea/gogits/hello-world/issue/1") is None,
                           what="the issue's task key to be freed")


@pytest.mark.parametrize(("number", "remote"), [(2, False), (3, True)], ids=["same-host", "other-host"])
def test_github_cancel_comment_stops_a_running_task(fleet: Fleet, redis_client: redis.Redis, number: int,
                                                    remote: bool) -> None:
    title = f"Another typo, number {number} {hold(number)}"
    fleet.forge.add_item("Codertocat", "Hello-World", number, title, labels=["bug"])
    trigger = load_payload("github/issues.labeled.json")
    trigger["issue"]["number"] = number
    status, answer = fleet.post("/webhooks/github", github_delivery("issues", trigger, GITHUB_SECRET))
    assert status == 202
    task_id = answer["task_id"]
    # The task is running: its second model call waits for the test.
    fleet.stack.wait_until(lambda: fleet.model.model.gate_reached(GATE, title), what="the task held")

    comment = load_payload("github/issue_comment.created.json")
    comment["issue"]["number"] = number
    comment["comment"]["body"] = "Not needed after all.\n/tasuki cancel"
    # From another host only the Redis cancel flag can be set; the worker reads it after the step.
    delivery = github_delivery("issue_comment", comment, GITHUB_SECRET)
    status, answer = fleet.post("/webhooks/github", delivery, via=fleet.elsewhere if remote else None)
    assert (status, answer["status"], answer["task_id"]) == (200, "cancelled", task_id)
    fleet.model.model.open_gate(GATE, containing=hold(number))

    state = fleet.stack.wait_finished(task_id)
    assert state["status"] == "cancelled"
    assert state["llm_call_count"] == 2  # stopped at the step boundary after the pending call
    item = fleet.forge.item("Codertocat", "Hello-World", number)
    fleet.stack.wait_until(lambda: item.comments[-1].body.startswith("**Tasuki"), what="the summary comment")
    assert item.labels == [FAILED]
    assert item.comments[-1].body.startswith("**Tasuki stopped: cancelled.**")
    assert not [c for c in fleet.forge.changes if c.head.startswith(f"tasuki/{number}-{task_id[:8]}")]
