"""GitHub App authentication: the renewal rule as pure functions of ``now``, the JWT GitHub verifies, and the
forge client against the fake GitHub's App (a real HTTP server that checks the JWT with the App's public key
and lets tokens expire) on a clock both share — an hour passes without waiting for it."""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import jwt
import pytest
from structlog.testing import capture_logs

from contexts import ContextStore
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from tests.helpers.deliveries import load_payload
from tests.helpers.fake_forge import FakeForge
from tests.helpers.fake_github_app import FakeApp, rsa_private_key
from tests.helpers.stack import git, make_buggy_repo
from tests.helpers.worker_scenarios import provider_env
from webhooks.events import Ignore, Trigger, github_action
from webhooks.followups import new_task_request
from worker.checkout import Checkout
from worker.forges import CredentialError, ItemRef, installation_of, make_forge
from worker.forges.app_tokens import (
    CLOCK,
    SUSPENDED,
    UNINSTALLED,
    WRONG_KEY,
    IssuedToken,
    TokenCache,
    app_jwt,
    parse_expiry,
    refresh_due,
    refusal,
)
from worker.forges.github import GitHubForge
from worker.forges.github_app import GitHubApp, InstallationCredential, bot_email
from worker.run import LocalReporter, TaskRequest, TaskRun
from worker.runtime import provider_for
from worker.settings import ConfigError, load_settings
from worker.settings_models import GitHubSettings, LabelSettings, Settings
from worker.user_config import llm_config

OWNER, REPO = "octo", "hello"
APP_ID, SLUG, INSTALLATION = 7, "tasuki-app", 42
HOUR = 3600.0


# -- pure: when a token is renewed ------------------------------------------------------------------


def test_an_hours_token_is_renewed_five_minutes_before_it_expires() -> None:
    token = IssuedToken("ghs_x", issued_at=1000.0, expires_at=1000.0 + HOUR)
    assert refresh_due(None, 0.0)
    assert not refresh_due(token, 1000.0)
    assert not refresh_due(token, 1000.0 + HOUR - 301)
    assert refresh_due(token, 1000.0 + HOUR - 300)
    assert refresh_due(token, 1000.0 + HOUR + 1)


def test_a_short_lived_token_is_renewed_as_early_in_proportion() -> None:
    token = IssuedToken("ghs_x", issued_at=0.0, expires_at=3.0)
    assert not refresh_due(token, 2.7)
    assert refresh_due(token, 2.75)  # a twelfth of its life before its end


def test_the_cache_asks_github_once_per_installation_per_token_life_not_per_call() -> None:
    cache = TokenCache()
    asked: list[tuple[int, float]] = []
    now = 0.0

    def issue(installation: int) -> IssuedToken:
        asked.append((installation, now))
        return IssuedToken(f"ghs_{len(asked)}", now, now + HOUR)

    while now < 2 * HOUR:  # a call per second and installation, for two hours
        for installation in (1, 2):
            assert cache.get(installation, now, issue).valid(now)
        now += 1.0
    assert [t for i, t in asked if i == 1] == [0.0, 3300.0, 6600.0]
    assert len(asked) == 6
    assert cache.issued == 6


def test_a_revoked_token_dropped_from_the_cache_is_replaced_at_the_next_call() -> None:
    cache = TokenCache()
    tokens = iter(["ghs_a", "ghs_b"])
    first = cache.get(1, 0.0, lambda i: IssuedToken(next(tokens), 0.0, HOUR))
    cache.drop(1, "ghs_other")  # another token's refusal does not touch this one
    assert cache.get(1, 1.0, lambda i: IssuedToken(next(tokens), 1.0, HOUR)) == first
    cache.drop(1, first.token)
    assert cache.get(1, 2.0, lambda i: IssuedToken(next(tokens), 2.0, HOUR)).token == "ghs_b"


def test_the_jwt_is_rs256_backdated_and_within_githubs_ten_minutes() -> None:
    key = rsa_private_key()
    public = FakeApp(APP_ID, SLUG, key).public_key
    claims = jwt.decode(app_jwt(APP_ID, key, 1_700_000_000.5), public, algorithms=["RS256"],
                        options={"verify_exp": False, "verify_iat": False})
    assert claims["iss"] == str(APP_ID)
    assert claims["iat"] == 1_700_000_000 - 60
    assert 0 < claims["exp"] - 1_700_000_000 <= 600
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(app_jwt(APP_ID, rsa_private_key(), 1_700_000_000), public, algorithms=["RS256"],
                   options={"verify_exp": False, "verify_iat": False})


def test_refusals_are_named() -> None:
    assert refusal(401, "A JSON web token could not be decoded", 0.5) == WRONG_KEY
    assert refusal(401, "A JSON web token could not be decoded", 3600.0) == CLOCK  # the Date header says so
    assert refusal(401, "'Expiration time' claim ('exp') is too far in the future", None) == CLOCK
    assert refusal(403, "This installation has been suspended", 0.0) == SUSPENDED
    assert refusal(404, "Not Found", 0.0) == UNINSTALLED
    assert refusal(500, "oops", 0.0) == ""


def test_expiry_is_read_with_or_without_fractions() -> None:
    assert parse_expiry("2016-07-11T22:14:10Z") == 1468275250.0
    assert parse_expiry("2016-07-11T22:14:10.500Z") == 1468275250.5


def test_bot_identity_is_githubs_noreply_address() -> None:
    assert bot_email(41898282, "tasuki-app") == "41898282+tasuki-app[bot]@users.noreply.github.com"


# -- settings ---------------------------------------------------------------------------------------


def test_app_settings_take_the_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    key = rsa_private_key()
    env = {"TASUKI__GITHUB__AUTH": "app", "TASUKI__GITHUB__APP_ID": "7"}
    settings = load_settings(env={**env, "GITHUB_APP_PRIVATE_KEY": key}, cwd=tmp_path)
    assert settings.github.app_id == 7
    assert settings.secrets.github_app_private_key is not None
    assert settings.secrets.github_app_private_key.get_secret_value() == key
    assert key not in json.dumps(settings.public_dump())
    (tmp_path / "app.pem").write_text(key)
    from_file = load_settings(env={**env, "GITHUB_APP_PRIVATE_KEY_PATH": str(tmp_path / "app.pem")}, cwd=tmp_path)
    assert from_file.secrets.github_app_private_key == settings.secrets.github_app_private_key
    with pytest.raises(ConfigError, match=r"^config: GITHUB_APP_PRIVATE_KEY_PATH: cannot read .*missing\.pem"):
        load_settings(env={**env, "GITHUB_APP_PRIVATE_KEY_PATH": str(tmp_path / "missing.pem")}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"^config: github\.app_id = None: the GitHub App's ID"):
        load_settings(env={"TASUKI__GITHUB__AUTH": "app"}, cwd=tmp_path)


def test_app_auth_without_a_private_key_fails_in_one_line(tmp_path: Path) -> None:
    settings = load_settings(env={"TASUKI__GITHUB__AUTH": "app", "TASUKI__GITHUB__APP_ID": "7"}, cwd=tmp_path)
    with pytest.raises(CredentialError, match="GITHUB_APP_PRIVATE_KEY"):
        make_forge("github", settings, {"owner": OWNER, "repo": REPO})


def test_the_installation_comes_from_the_trigger_when_it_is_a_number() -> None:
    assert installation_of({"kind": "label", "installation": 42}) == 42
    assert installation_of({"kind": "api"}) is None
    assert installation_of({"installation": "42"}) is None
    assert installation_of({"installation": True}) is None


# -- the App's webhooks ----------------------------------------------------------------------------


def test_the_apps_webhook_carries_its_installation_into_the_task_request() -> None:
    payload = load_payload("github/issues.labeled.json")
    payload["installation"] = {"id": INSTALLATION, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNDI="}
    action = github_action("issues", payload, GitHubSettings(labels=LabelSettings(trigger="bug")))
    assert isinstance(action, Trigger)
    assert new_task_request(action)["trigger"] == {"kind": "label", "user": "Codertocat", "installation": INSTALLATION}
    del payload["installation"]  # a token's webhook (or a hand-made one) names none: looked up by repository
    action = github_action("issues", payload, GitHubSettings(labels=LabelSettings(trigger="bug")))
    assert isinstance(action, Trigger)
    assert "installation" not in action.trigger


def test_what_the_app_itself_did_starts_nothing() -> None:
    cfg = GitHubSettings(auth="app", app_id=APP_ID, bot_login=f"{SLUG}[bot]")
    payload = load_payload("github/issue_comment.created.json")
    payload["comment"]["body"] = "@tasuki please"
    assert isinstance(github_action("issue_comment", payload, cfg), Trigger)
    by_the_bot = {**payload, "sender": {"login": f"{SLUG}[bot]", "type": "Bot"}}
    assert github_action("issue_comment", by_the_bot, cfg) == Ignore("sent by the bot")
    made_by_the_app = {**payload, "comment": {**payload["comment"], "performed_via_github_app": {"id": APP_ID}}}
    assert github_action("issue_comment", made_by_the_app, cfg) == Ignore("sent by the bot")
    another_app = {**payload, "comment": {**payload["comment"], "performed_via_github_app": {"id": APP_ID + 1}}}
    assert isinstance(github_action("issue_comment", another_app, cfg), Trigger)


# -- against the fake GitHub, on a shared clock -----------------------------------------------------


@dataclass
class Clock:
    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    forge: FakeForge
    app: FakeApp
    clock: Clock
    tmp: Path

    def github_app(self, key: str | None = None, clock: Clock | None = None) -> GitHubApp:
        return GitHubApp(self.forge.github_api_url, APP_ID, key or self.app.private_key, clock=clock or self.clock)

    def client(self, installation: int | None = INSTALLATION, *, app: GitHubApp | None = None,
               repo: str = REPO) -> tuple[GitHubForge, InstallationCredential]:
        credential = InstallationCredential(app or self.github_app(), OWNER, repo, installation)
        return GitHubForge(self.forge.github_api_url, credential, identity=credential.identity,
                           backoff_s=0.01), credential


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = Clock(1_800_000_000.0)
    app = FakeApp.generate(APP_ID, SLUG, clock=clock)
    app.install(INSTALLATION, (OWNER, REPO))
    with FakeForge(tmp_path / "forge", "unused-static-token", bot_login=app.bot_login, app=app).serve() as forge:
        forge.add_repo(OWNER, REPO, make_buggy_repo(tmp_path / "source"))
        forge.add_repo(OWNER, "elsewhere", make_buggy_repo(tmp_path / "source2"))
        forge.add_item(OWNER, REPO, 1, "Fix add()", "It subtracts.")
        yield World(forge, app, clock, tmp_path)


def test_the_fake_takes_a_token_until_it_expires_and_a_jwt_only_signed_with_the_apps_key(world: World) -> None:
    api = world.forge.github_api_url
    token = world.github_app().token(INSTALLATION).token
    assert httpx.get(f"{api}/repos/{OWNER}/{REPO}", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    world.clock.now += HOUR
    expired = httpx.get(f"{api}/repos/{OWNER}/{REPO}", headers={"Authorization": f"Bearer {token}"})
    assert (expired.status_code, expired.json()["message"]) == (401, "Bad credentials")
    forged = app_jwt(APP_ID, rsa_private_key(), world.clock.now)
    answer = httpx.post(f"{api}/app/installations/{INSTALLATION}/access_tokens",
                        headers={"Authorization": f"Bearer {forged}"})
    assert (answer.status_code, answer.json()["message"]) == (401, "A JSON web token could not be decoded")


def test_every_call_over_two_hours_goes_out_with_a_token_valid_then(world: World) -> None:
    client, _ = world.client()
    ref = ItemRef(OWNER, REPO, "issue", 1)
    for _ in range(2 * 60):  # a call a minute for two hours
        client.comment(ref, "still here")
        world.clock.now += 60
    client.close()
    assert world.app.refused == []
    assert len(world.app.issued) == 3  # renewed at ~55 and ~110 minutes, not per call
    assert len(world.forge.item(OWNER, REPO, 1).comments) == 120


def test_git_pushes_hours_apart_use_the_token_valid_at_each_push_and_the_bots_identity(world: World) -> None:
    client, _ = world.client()
    env = client.git_env(world.forge.git_url(OWNER, REPO))
    checkout = Checkout(world.tmp / "work", world.forge.git_url(OWNER, REPO), "tasuki/1-app", git_env=env)
    checkout.prepare(fresh=True)
    for hour in range(3):
        (checkout.path / "notes.txt").write_text(f"hour {hour}\n")
        checkout.commit(f"hour {hour}")
        checkout.push()
        world.clock.now += HOUR
    assert world.app.refused == []
    assert len({t.token for t in world.app.issued}) == 3
    bare = world.forge.git_root / OWNER / f"{REPO}.git"
    authors = set(git(bare, "log", "--format=%an <%ae>|%cn", "tasuki/1-app", "-3").splitlines())
    assert authors == {f"{SLUG}[bot] <{world.app.bot_user_id}+{SLUG}[bot]@users.noreply.github.com>|{SLUG}[bot]"}
    assert "ghs_" not in (checkout.path / ".git" / "config").read_text()  # the token never lands in a URL


def test_a_bot_user_the_forge_does_not_show_falls_back_and_is_said_once(world: World) -> None:
    world.app.bot_user_visible = False  # GET /users/{slug}[bot]: 404
    client, _ = world.client()
    env = client.git_env(world.forge.git_url(OWNER, REPO))
    checkout = Checkout(world.tmp / "work", world.forge.git_url(OWNER, REPO), "tasuki/1-nobot", git_env=env)
    with capture_logs() as logs:
        checkout.prepare(fresh=True)
        for turn in range(2):
            (checkout.path / "notes.txt").write_text(f"turn {turn}\n")
            checkout.commit(f"turn {turn}")
        checkout.push()
    client.close()
    bare = world.forge.git_root / OWNER / f"{REPO}.git"
    authors = set(git(bare, "log", "--format=%an <%ae>", "tasuki/1-nobot", "-2").splitlines())
    assert authors == {f"{SLUG}[bot] <{SLUG}[bot]@users.noreply.github.com>"}
    said = [e for e in logs if "bot user could not be looked up" in e["event"]]
    assert len(said) == 1
    assert "HTTP 404" in said[0]["error"]
    assert len([r for r in world.forge.requests if unquote(r["path"]).endswith(f"/users/{SLUG}[bot]")]) == 1


def test_a_repository_submitted_by_hand_finds_its_installation(world: World) -> None:
    client, credential = world.client(installation=None)
    assert client.repository(OWNER, REPO).default_branch == "main"
    assert credential.installation == INSTALLATION
    assert [t.installation for t in world.app.issued] == [INSTALLATION]


def test_a_token_revoked_before_its_time_is_replaced_once_and_the_call_goes_through(world: World) -> None:
    client, _ = world.client()
    ref = ItemRef(OWNER, REPO, "issue", 1)
    client.comment(ref, "first")
    world.app.revoked.add(world.app.issued[0].token)
    client.comment(ref, "second")
    assert [why for _, why in world.app.refused] == ["Bad credentials"]  # the revoked token, once
    assert len(world.app.issued) == 2
    assert [c.body for c in world.forge.item(OWNER, REPO, 1).comments] == ["first", "second"]


def failure(world: World, client: GitHubForge) -> tuple[str, list[dict[str, object]]]:
    with capture_logs() as logs:
        with pytest.raises(CredentialError) as raised:
            client.repository(OWNER, REPO)
        with pytest.raises(CredentialError):  # once refused, the client says so again without a second log line
            client.read_item(ItemRef(OWNER, REPO, "issue", 1))
    return str(raised.value), [entry for entry in logs if entry["log_level"] == "error"]


@pytest.mark.parametrize(("case", "cause", "status"), [
    ("wrong key", WRONG_KEY, 401), ("suspended", SUSPENDED, 403), ("uninstalled", UNINSTALLED, 404),
    ("clock", CLOCK, 401), ("not installed on this repository", UNINSTALLED, 404),
])
def test_a_refused_credential_is_one_named_log_line(world: World, case: str, cause: str, status: int) -> None:
    installation: int | None = INSTALLATION
    app, repo = world.github_app(), REPO
    if case == "wrong key":
        app = world.github_app(key=rsa_private_key())
    elif case == "suspended":
        world.app.installations[INSTALLATION].suspended = True
    elif case == "uninstalled":
        del world.app.installations[INSTALLATION]
    elif case == "clock":
        app = world.github_app(clock=Clock(world.clock.now + HOUR))  # this host an hour ahead of GitHub
    else:
        installation, repo = None, "elsewhere"
    client, _ = world.client(installation, app=app, repo=repo)
    message, errors = failure(world, client)
    assert cause in message
    assert f"HTTP {status}" in message
    assert [e["event"] for e in errors] == [message]
    assert world.app.issued == []
    assert "BEGIN" not in message
    assert "ghs_" not in message


def test_a_key_rotated_mid_task_fails_the_task_and_the_last_token_still_tells_the_issue(world: World) -> None:
    client, credential = world.client()
    ref = ItemRef(OWNER, REPO, "issue", 1)
    client.comment(ref, "working")
    world.app.private_key = rsa_private_key()  # the App's key was replaced on GitHub
    world.clock.now += HOUR - 200  # in the renewal window: the token has 200 s left
    with pytest.raises(CredentialError, match=WRONG_KEY):
        client.comment(ref, "progress")
    client.comment(ref, "**Tasuki stopped: failed.**")  # the old token, while it lasts
    assert credential.failure is not None
    assert [c.body for c in world.forge.item(OWNER, REPO, 1).comments] == ["working", "**Tasuki stopped: failed.**"]
    world.clock.now += 300
    with pytest.raises(CredentialError, match=WRONG_KEY):
        client.comment(ref, "too late")


# -- a refusal mid-task ends the task at that step -------------------------------------------------


def test_a_credential_refused_at_a_step_fails_the_task_there_without_a_traceback(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    refused = "github app 7: wrong private key or app_id (token of installation 42: HTTP 401)"
    finished: list[tuple[str, str | None]] = []

    class RefusedAfterTheFirstStep(LocalReporter):
        def on_step(self, state: dict[str, Any]) -> None:
            raise CredentialError(refused)

        def finish(self, status: str, state: dict[str, Any], result: dict[str, Any] | None,
                   error: str | None) -> None:
            finished.append((status, error))

    repo = make_buggy_repo(tmp_path / "repo")
    turns = [{"content": "one", "tool_calls": [{"name": "bash", "arguments": {"command": "echo 1 >> n.txt"}}]},
             {"content": "two", "tool_calls": [{"name": "bash", "arguments": {"command": "echo 2 >> n.txt"}}]},
             {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]}]
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = make_settings({**provider_env("openai", server.url, 32768), "TASUKI__SANDBOX__BACKEND": "none"})
        request = TaskRequest({"task_source": "local", "owner": "me", "repo": "repo", "task_type": "prompt",
                               "task_id": "1"}, prompt="Write n.txt.", repo_path=str(repo))
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        with capture_logs() as logs:
            outcome = TaskRun(str(uuid_module.uuid4()), request, settings, store,
                              provider_for=lambda config: provider_for(config, settings),
                              reporter=RefusedAfterTheFirstStep(request)).execute(llm_config(settings))
    finally:
        server.stop()
    assert outcome["status"] == "failed"
    assert outcome["error"] == refused
    assert finished == [("failed", refused)]
    assert len([r for r in server.requests if r["kind"] == "agent"]) == 1  # it stopped at the first step
    assert not [entry for entry in logs if "exc_info" in entry]  # no traceback: the line names the cause
