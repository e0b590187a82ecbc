"""Every trigger checked against the forge's real permission (issue 40): published webhook payloads from read-only and
triage members are refused, answered once and never reach the model; write and admin are admitted; the cache is
warm, dropped on a member event; a forge that cannot say refuses, holds the delivery, and admits it on the retry.

Real HTTP throughout: the fake GitHub/GitLab/Gitea answers permission lookups per person, the intake runs under
uvicorn, a real celery worker and the replay model stand behind it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from contexts.audit import AuditLog, audit_dir
from replay import ReplayServer
from tests.helpers.deliveries import gitea_delivery, gitea_labeled, github_delivery, gitlab_delivery, load_payload
from tests.helpers.fake_forge import FakeForge
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, fix_calc_trajectory, make_buggy_repo
from webhooks.ci_events import CIFailure, github_ci, gitlab_ci
from webhooks.membership_events import MembershipChanged, github_membership, gitlab_membership
from webhooks.permission_gate import subject_of
from worker.forges import GiteaForge, GitHubForge, GitLabForge
from worker.names import ACTIVE_PREFIX, HELD_TRIGGERS_KEY, KEY_PREFIX
from worker.permissions import Level, PermissionUnknown, Person, cache_key, github_level, gitlab_level, minimum
from worker.settings import load_settings
from worker.settings_models import PermissionSettings

TOKEN = "permissions-forge-token-77"
GITHUB_SECRET, GITLAB_SECRET, GITEA_SECRET = "perm-gh-secret", "perm-gl-token", "perm-gt-secret"
OWNER, REPO = "Codertocat", "Hello-World"


# -- the scale ----------------------------------------------------------------------------------------


def test_github_role_name_is_read_before_the_folded_permission() -> None:
    assert github_level({"permission": "write", "role_name": "maintain"}) == Level.MAINTAIN
    assert github_level({"permission": "read", "role_name": "triage"}) == Level.TRIAGE
    # A custom role's name says nothing of its base: the folded permission is the answer.
    assert github_level({"permission": "read", "role_name": "security-reviewer"}) == Level.READ
    assert github_level({"permission": ["admin"]}) == Level.NONE


def test_gitlab_access_levels_on_the_scale() -> None:
    assert [gitlab_level(n) for n in (0, 5, 10, 15, 20, 30, 40, 50)] == [
        Level.NONE, Level.NONE, Level.READ, Level.TRIAGE, Level.TRIAGE, Level.WRITE, Level.MAINTAIN, Level.ADMIN]
    assert gitlab_level(True) == Level.NONE


def test_a_repository_may_ask_more_than_the_default_minimum() -> None:
    settings = PermissionSettings(minimum="write", repositories={"Octo/Secret": "admin"})
    assert minimum(settings, "octo", "secret") == Level.ADMIN
    assert minimum(settings, "octo", "open") == Level.WRITE


def test_membership_events_name_whose_permissions_to_drop() -> None:
    organization = {"organization": {"login": "octo-org"}}
    assert github_membership("member", {"repository": {"owner": {"login": "octo"}}, "member": {"login": "ann"}}) == \
        MembershipChanged("github", "octo", "ann")
    assert github_membership("membership", {**organization, "member": {"login": "bob"}}) == \
        MembershipChanged("github", "octo-org", "bob")
    assert github_membership("organization", {**organization, "membership": {"user": {"login": "cy"}}}) == \
        MembershipChanged("github", "octo-org", "cy")
    assert github_membership("team", organization) == MembershipChanged("github", "octo-org", "")
    assert github_membership("issues", organization) is None
    system_hook = {"event_name": "user_remove_from_team", "project_path_with_namespace": "grp/sub/proj",
                   "user_username": "dee"}
    assert gitlab_membership(system_hook) == MembershipChanged("gitlab", "grp/sub", "dee")
    assert gitlab_membership({"event_name": "user_create", "user_username": "dee"}) is None


def test_a_ci_follow_up_rests_on_the_pusher() -> None:
    run = load_payload("github/workflow_run.completed.json")
    run["workflow_run"]["conclusion"] = "failure"  # the published example succeeded
    failure = github_ci("workflow_run", run)
    assert isinstance(failure, CIFailure)
    subject = subject_of(failure)
    assert subject is not None
    assert (subject.kind, subject.item, subject.person.login) == ("ci", "", "Codertocat")
    hook = load_payload("gitlab/pipeline_hook.json")
    hook["object_attributes"]["status"] = "failed"
    pipeline = gitlab_ci(hook)
    assert isinstance(pipeline, CIFailure)
    assert (pipeline.actor, pipeline.actor_id) == ("user1", 42)


# -- each forge's lookup over HTTP --------------------------------------------------------------------


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[FakeForge]:
    with FakeForge(tmp_path / "forge", TOKEN).serve() as served:
        served.roles.update({"reader": "read", "triager": "triage", "writer": "write", "keeper": "maintain"})
        served.members.update({2: 20, 3: 30, 4: 50})
        served.usernames.update({"reporter": 2, "developer": 3})
        served.permissions.update({"reader": "read", "writer": "write", "boss": "owner"})
        yield served


def test_each_forge_answers_each_persons_permission(forge: FakeForge) -> None:
    github = GitHubForge(forge.github_api_url, TOKEN, backoff_s=0.01)
    gitlab = GitLabForge(forge.gitlab_api_url, TOKEN, backoff_s=0.01)
    gitea = GiteaForge(forge.gitea_api_url, TOKEN, backoff_s=0.01)
    try:
        assert [github.permission("octo", "hello", Person(p)) for p in
                ("reader", "triager", "writer", "keeper", "octo", "stranger")] == [
            Level.READ, Level.TRIAGE, Level.WRITE, Level.MAINTAIN, Level.ADMIN, Level.NONE]
        assert [gitlab.permission("group", "project", Person(p, i)) for p, i in
                (("reporter", 2), ("developer", 3), ("owner", 4), ("outsider", 9))] == [
            Level.TRIAGE, Level.WRITE, Level.ADMIN, Level.NONE]
        assert gitlab.permission("group", "project", Person("developer")) == Level.WRITE  # found by username
        assert gitlab.permission("group", "project", Person("nobody")) == Level.NONE
        assert [gitea.permission("gogits", "hello", Person(p)) for p in ("reader", "writer", "boss", "x")] == [
            Level.READ, Level.WRITE, Level.ADMIN, Level.NONE]
    finally:
        for client in (github, gitlab, gitea):
            client.close()


@pytest.mark.parametrize("status", [503, 403], ids=["unavailable", "suspended"])
def test_a_forge_that_cannot_say_is_never_read_as_an_answer(forge: FakeForge, status: int) -> None:
    forge.permission_fault = status
    clients = [GitHubForge(forge.github_api_url, TOKEN, backoff_s=0.01),
               GitLabForge(forge.gitlab_api_url, TOKEN, backoff_s=0.01),
               GiteaForge(forge.gitea_api_url, TOKEN, backoff_s=0.01)]
    try:
        for client in clients:
            with pytest.raises(PermissionUnknown, match=str(status)):
                client.permission("octo", "hello", Person("writer", 3))
    finally:
        for client in clients:
            client.close()


# -- the intake, end to end ---------------------------------------------------------------------------


@dataclass
class Site:
    stack: Stack
    forge: FakeForge
    intake: IntakeServer
    model: ReplayServer
    redis: redis.Redis

    def post(self, source: str, delivery: tuple[bytes, dict[str, str]]) -> tuple[int, dict[str, Any]]:
        body, headers = delivery
        response = httpx.post(f"{self.intake.url}/webhooks/{source}", content=body, headers=headers, timeout=15)
        return response.status_code, response.json()

    def lookups(self, login: str) -> int:
        return sum(1 for r in self.forge.requests if r["path"].endswith(f"/collaborators/{login}/permission"))

    def audit(self, action: str) -> list[dict[str, Any]]:
        return [line for line in AuditLog(audit_dir(self.stack.contexts_dir)).read() if line["action"] == action]

    def replies_to(self, number: int, login: str) -> list[str]:
        item = self.forge.item(OWNER, REPO, number)
        return [c.body for c in item.comments if c.body.startswith(f"@{login}: Tasuki")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("permissions")
    with model_server(fix_calc_trajectory()) as model, FakeForge(root / "forge", TOKEN).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(root / "source"))
        forge.add_repo("gitlabhq", "gitlab-test", make_buggy_repo(root / "gitlab-source"))
        forge.add_repo("gogits", "hello-world", make_buggy_repo(root / "gitea-source"))
        forge.roles.update({"reader": "read", "triager": "triage", "writer": "write", "promoted": "read"})
        forge.members.update({20: 20})  # a reporter: triage, not enough
        forge.permissions.update({"unknwon": "read"})
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__GITHUB__API_URL": forge.github_api_url, "TASUKI__GITLAB__API_URL": forge.gitlab_api_url,
            "TASUKI__GITEA__API_URL": forge.gitea_api_url, "TASUKI__GITHUB__LABELS__TRIGGER": "bug",
            "TASUKI__GITLAB__LABELS__TRIGGER": "Platform",
            "TASUKI__PERMISSIONS__RETRY_S": "0.2", "TASUKI__PERMISSIONS__RETRIES": "3",
            "GITHUB_TOKEN": TOKEN, "GITLAB_TOKEN": TOKEN, "GITEA_TOKEN": TOKEN,
        })
        client = redis.Redis.from_url(redis_url)
        try:
            stack.start_worker("permissions")
            env = {**stack.env(), "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "GITLAB_WEBHOOK_SECRET": GITLAB_SECRET,
                   "GITEA_WEBHOOK_SECRET": GITEA_SECRET}
            with intake_server(load_settings(env=env)) as intake:
                yield Site(stack, forge, intake, model, client)
        finally:
            stack.stop()
            for key in client.scan_iter(match=f"{KEY_PREFIX}permission:*"):
                client.delete(key)
            client.close()


def labeled(number: int, sender: str) -> tuple[bytes, dict[str, str]]:
    """The published ``issues.labeled`` example, on issue ``number``, sent by ``sender``."""
    payload = load_payload("github/issues.labeled.json")
    payload["issue"]["number"] = number
    payload["sender"]["login"] = sender
    return github_delivery("issues", payload, GITHUB_SECRET)


def mentioned(number: int, author: str, association: str = "MEMBER") -> tuple[bytes, dict[str, str]]:
    """The published ``issue_comment.created`` example by an organization member, mentioning Tasuki."""
    payload = load_payload("github/issue_comment.created.json")
    payload["issue"]["number"] = number
    payload["sender"]["login"] = payload["comment"]["user"]["login"] = author
    payload["comment"]["author_association"] = association  # MEMBER says nothing of write access
    payload["comment"]["body"] = "@tasuki please fix add()"
    return github_delivery("issue_comment", payload, GITHUB_SECRET)


@pytest.mark.integration
def test_read_only_and_triage_members_are_refused_once_and_never_reach_the_model(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 11, "Refused eleven", labels=["bug"])
    for person, delivery in (("reader", labeled(11, "reader")), ("triager", labeled(11, "triager")),
                             ("reader", mentioned(11, "reader"))):
        status, answer = site.post("github", delivery)
        assert (status, answer["status"]) == (200, "refused"), answer
        assert f"{person} has" in answer["reason"]
    assert site.post("github", labeled(11, "reader"))[1]["status"] == "refused"  # again: refused, not told again
    site.stack.wait_until(lambda: len(site.forge.item(OWNER, REPO, 11).comments) == 2, what="the two refusals")
    assert len(site.replies_to(11, "reader")) == 1
    assert "at least write permission" in site.replies_to(11, "triager")[0]
    assert "you have triage" in site.replies_to(11, "triager")[0]
    assert site.redis.get(ACTIVE_PREFIX + f"github/{OWNER}/{REPO}/issue/11") is None
    assert site.intake.queued() == []
    assert not [r for r in site.model.requests if "Refused eleven" in json.dumps(r)]  # nothing reached the model
    refused = [line for line in site.audit("trigger.refused") if line["target"] == f"github:{OWNER}/{REPO}#11"]
    assert {line["actor"] for line in refused} == {"github:reader", "github:triager"}
    assert len(refused) == 4
    assert all(line["outcome"] == "refused" for line in refused)


@pytest.mark.integration
def test_a_writer_is_admitted_the_cache_is_warm_and_the_task_runs(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 12, "Fix add()", labels=["bug"])
    status, answer = site.post("github", labeled(12, "writer"))
    assert status == 202, answer
    state = site.stack.wait_finished(answer["task_id"])
    assert state["status"] == "completed"
    assert site.model.requests  # admitted: it reached the model
    looked_up = site.lookups("writer")
    site.forge.add_item(OWNER, REPO, 13, "Another", labels=["bug"])
    second = site.post("github", mentioned(13, "writer"))
    assert second[0] == 202
    assert site.lookups("writer") == looked_up  # warm: the cache answered
    site.stack.wait_finished(second[1]["task_id"])
    def writers() -> list[dict[str, Any]]:
        return [line for line in site.audit("trigger.admitted") if line["actor"] == "github:writer"
                and line["target"] in (f"github:{OWNER}/{REPO}#12", f"github:{OWNER}/{REPO}#13")]

    admitted = site.stack.wait_until(lambda: writers() if len(writers()) == 2 else None, what="both admissions")
    assert [line["detail"]["kind"] for line in admitted] == ["label", "comment"]
    assert admitted[0]["detail"] == {"kind": "label", "minimum": "write", "permission": "write"}


@pytest.mark.integration
def test_the_owner_is_admitted_as_admin(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 14, "Fix add()", labels=["bug"])
    status, answer = site.post("github", labeled(14, OWNER))
    assert status == 202, answer
    site.stack.wait_finished(answer["task_id"])
    assert site.redis.get(cache_key("github", OWNER, REPO, OWNER)) == b"admin"


@pytest.mark.integration
def test_a_member_event_drops_the_cached_permission(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 15, "Fix add()", labels=["bug"])
    assert site.post("github", labeled(15, "promoted"))[1]["status"] == "refused"
    assert site.redis.get(cache_key("github", OWNER, REPO, "promoted")) == b"read"
    site.forge.roles["promoted"] = "write"
    # Still cached: the forge is not asked again within permissions.cache_s...
    assert site.post("github", labeled(15, "promoted"))[1]["status"] == "refused"
    # ...until GitHub says the collaborator changed (a ``member`` event, ``edited``).
    member = {"action": "edited", "member": {"login": "promoted", "id": 99},
              "changes": {"permission": {"from": "read", "to": "write"}},
              "repository": load_payload("github/issues.labeled.json")["repository"],
              "sender": {"login": OWNER}}
    status, answer = site.post("github", github_delivery("member", member, GITHUB_SECRET))
    assert (status, answer) == (200, {"status": "permissions dropped", "dropped": 1})
    status, answer = site.post("github", labeled(15, "promoted"))
    assert status == 202, answer
    site.stack.wait_finished(answer["task_id"])


@pytest.mark.integration
def test_a_forge_that_cannot_say_refuses_then_admits_on_the_retry(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 16, "Fix add()", labels=["bug"])
    site.redis.delete(cache_key("github", OWNER, REPO, "writer"))
    site.forge.permission_fault = 503
    before = site.lookups("writer")
    try:
        status, answer = site.post("github", labeled(16, "writer"))
        assert (status, answer["status"]) == (202, "held"), answer
        assert site.redis.zcard(HELD_TRIGGERS_KEY) == 1
        # A retry asks the forge again (two tries each time: PERMISSION_RETRIES) and still cannot say: refused.
        site.stack.wait_until(lambda: site.lookups("writer") >= before + 4, what="a retry that failed too")
        assert site.redis.get(ACTIVE_PREFIX + f"github/{OWNER}/{REPO}/issue/16") is None  # fail closed
    finally:
        site.forge.permission_fault = None
    uuid = site.stack.wait_until(lambda: site.redis.get(ACTIVE_PREFIX + f"github/{OWNER}/{REPO}/issue/16"),
                                 what="the held delivery admitted on its retry")
    assert site.stack.wait_finished(uuid.decode())["status"] == "completed"


@pytest.mark.integration
def test_a_forge_that_never_answers_refuses_for_good(site: Site) -> None:
    site.forge.add_item(OWNER, REPO, 17, "Fix add()", labels=["bug"])
    site.forge.permission_fault = 403  # a suspended installation
    try:
        assert site.post("github", labeled(17, "someone"))[1]["status"] == "held"
        site.stack.wait_until(lambda: site.replies_to(17, "someone"), what="the final refusal")
    finally:
        site.forge.permission_fault = None
    assert "could not learn your permission" in site.replies_to(17, "someone")[0]
    assert site.redis.get(ACTIVE_PREFIX + f"github/{OWNER}/{REPO}/issue/17") is None


@pytest.mark.integration
def test_gitlab_and_gitea_triggers_below_the_minimum_are_refused(site: Site) -> None:
    note = load_payload("gitlab/note_hook.issue.json")
    note["user"].update({"id": 20, "username": "reporter"})
    note["object_attributes"]["note"] = "@tasuki refused-by-gitlab please"
    status, answer = site.post("gitlab", gitlab_delivery("Note Hook", note, token=GITLAB_SECRET))
    assert (status, answer["status"]) == (200, "refused"), answer
    assert "reporter has triage" in answer["reason"]
    status, answer = site.post("gitea", gitea_delivery("issues", gitea_labeled(["coding agent"], 31), GITEA_SECRET))
    assert (status, answer["status"]) == (200, "refused"), answer
    assert "unknwon has read" in answer["reason"]
    gitlab_member = {"event_name": "user_update_for_group", "group_path": "gitlab-org", "user_username": "reporter",
                     "user_id": 20, "group_access": "Developer"}
    status, answer = site.post("gitlab", gitlab_delivery("Member Hook", gitlab_member, token=GITLAB_SECRET))
    assert (status, answer) == (200, {"status": "permissions dropped", "dropped": 1})
    assert not [r for r in site.model.requests if "refused-by-gitlab" in json.dumps(r)]
