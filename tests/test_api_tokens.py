"""Personal API tokens (issue 40): stored hashed, expiring, revocable, scoped to a role; the task API served by a
real uvicorn acts as the token's owner — never the body's ``user`` — checks each route's role, and holds the owner
to their user and team budgets."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts.api_tokens import PREFIX, TOKENS_FILE, TokenError, Tokens, TokenStore, hash_secret, new_secret
from contexts.clock import utc_now
from contexts.masking import mask
from contexts.usage import Usage
from tests.helpers.cli_process import ok, one_line_error
from tests.helpers.intake_server import IntakeServer, intake_server
from webhooks.budget import over_budget
from worker.api_tokens import issue_token, token_store
from worker.audit import audit_log
from worker.metering import Meter
from worker.roles import Role
from worker.settings_models import Settings
from worker.spend import day_of, team_key, user_key

TEAMS = json.dumps({"blue": ["g-blue"], "red": ["g-red"]})


def store_files(base: Path) -> list[Path]:
    """The token database and its WAL companions: everything of the store on disk."""
    return sorted(base.glob(TOKENS_FILE + "*"))


def make_token(settings: Settings, owner: str, role: Role = Role.OPERATOR, groups: tuple[str, ...] = (),
               owner_role: Role = Role.ADMIN) -> str:
    _, secret = issue_token(settings, token_store(settings), owner=owner, owner_role=owner_role, groups=groups,
                            role=role, expires_days=7, name="tests", now=utc_now())
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def queued_request(raw: bytes) -> dict[str, Any]:
    """The ``tasuki.run_task`` request of a queued Celery message (kombu keeps the body base64-encoded)."""
    args = json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
    request: dict[str, Any] = args[1]
    return request


def audit_events(settings: Settings) -> list[dict[str, Any]]:
    return list(audit_log(settings).read())


# -- the store -----------------------------------------------------------------------------------


def test_a_token_is_shown_once_and_stored_only_as_its_hash(tmp_path: Path) -> None:
    store, now = TokenStore.beside(tmp_path), utc_now()
    token, secret = store.create("alice", "operator", ["g-blue"], "laptop", now + timedelta(days=1), now)
    assert secret.startswith(PREFIX)
    assert len(secret) >= len(PREFIX) + 43
    assert store.lookup(secret, now) == token
    store.close()
    files = store_files(tmp_path)
    assert files
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    on_disk = b"".join(f.read_bytes() for f in files)
    assert secret.encode() not in on_disk
    assert secret.removeprefix(PREFIX).encode() not in on_disk
    assert hash_secret(secret).encode() in on_disk  # what is kept instead


@pytest.fixture(params=["sqlite", "postgresql"])
def tokens(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tokens]:
    """Each store behind the one contract: the file of one host, the fleet's PostgreSQL."""
    if request.param == "sqlite":
        store = TokenStore.beside(tmp_path)
        yield store
        store.close()
        return
    from fleet.api_tokens import PostgresTokens
    from fleet.store import FleetStore

    with FleetStore(request.getfixturevalue("fleet_dsn")) as fleet:
        yield PostgresTokens(fleet)


def test_a_token_pasted_anywhere_is_masked_before_it_reaches_a_file_or_a_log() -> None:
    secret = new_secret()
    for text in (f"curl -H 'X-Key: {secret}'", f'{{"token": "{secret}"}}', f"see {secret.replace('_', '%5F', 1)}"):
        assert secret.removeprefix(PREFIX) not in mask(text)
        assert "[TASUKI_TOKEN]" in mask(text)
    assert mask("the tsk_short file") == "the tsk_short file"


def test_unknown_expired_and_revoked_tokens_are_not_found(tokens: Tokens) -> None:
    now = utc_now()
    token, secret = tokens.create("alice", "viewer", ["g-b", "g-a", "g-a"], "t", now + timedelta(hours=1), now)
    other, _ = tokens.create("bob", "operator", [], "u", now + timedelta(days=1), now + timedelta(seconds=1))
    assert tokens.lookup(secret, now) == token
    assert token.groups == ("g-a", "g-b")
    assert tokens.lookup(secret + "x", now) is None
    assert tokens.lookup(secret.removeprefix(PREFIX), now) is None
    assert tokens.lookup(secret, now + timedelta(hours=1)) is None  # expired
    assert [t.id for t in tokens.list()] == [other.id, token.id]
    assert tokens.list("alice") == [token]
    tokens.revoke(token.id, now)
    tokens.revoke(token.id, now + timedelta(minutes=5))  # the first revocation's time stays
    assert tokens.lookup(secret, now) is None
    revoked = tokens.get(token.id)
    assert revoked is not None
    assert revoked.status(now) == "revoked"
    assert revoked.revoked_at is not None
    assert abs((revoked.revoked_at - now).total_seconds()) < 0.001  # not the second revocation's time
    with pytest.raises(TokenError):
        tokens.revoke("nope", now)


def test_the_fleets_store_keeps_only_the_secrets_hash(
    make_settings: Callable[..., Settings], fleet_dsn: str
) -> None:
    from fleet.api_tokens import PostgresTokens
    from fleet.store import FleetStore

    settings = make_settings({"TASUKI__FLEET__STORE": fleet_dsn})
    assert isinstance(token_store(settings), PostgresTokens)  # fleet.store set: every intake knows every token
    with FleetStore(fleet_dsn) as fleet:
        _, secret = PostgresTokens(fleet).create("alice", "admin", [], "t", utc_now() + timedelta(days=1), utc_now())
        with fleet.connection() as conn:
            rows = conn.execute("SELECT * FROM tasuki_api_tokens").fetchall()
    stored = json.dumps([list(map(str, row)) for row in rows])
    assert secret.removeprefix(PREFIX) not in stored
    assert hash_secret(secret) in stored


def test_a_token_cannot_outrank_its_owner_or_outlive_the_maximum(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings({"TASUKI__AUTH__TOKEN_MAX_DAYS": "30"})
    store, now = token_store(settings), utc_now()
    common: dict[str, Any] = {"owner": "olga", "groups": (), "name": "n", "now": now}
    with pytest.raises(TokenError, match="cannot exceed"):
        issue_token(settings, store, owner_role=Role.OPERATOR, role=Role.ADMIN, expires_days=1, **common)
    with pytest.raises(TokenError, match=r"auth\.token_max_days"):
        issue_token(settings, store, owner_role=Role.OPERATOR, role=Role.OPERATOR, expires_days=31, **common)
    with pytest.raises(TokenError, match="only operators and admins"):
        issue_token(settings, store, owner_role=Role.VIEWER, role=Role.VIEWER, expires_days=1, **common)
    token, _ = issue_token(settings, store, owner_role=Role.OPERATOR, role=Role.VIEWER, expires_days=30, **common)
    assert (token.role, store.list("olga")) == ("viewer", [token])


# -- the API over HTTP ---------------------------------------------------------------------------

pytestmark_http = pytest.mark.integration


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis) -> Settings:
    return make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__AUTH__TEAMS": TEAMS})


@pytest.fixture
def api(settings: Settings) -> Iterator[IntakeServer]:
    with intake_server(settings) as server:
        yield server


@pytestmark_http
def test_the_tokens_owner_is_the_tasks_user_whatever_the_body_says(api: IntakeServer, settings: Settings) -> None:
    alice = make_token(settings, "alice", groups=("g-blue",))
    with api.client(headers=bearer(alice)) as client:
        response = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 3, "user": "mallory"})
        shown = client.get(f"/api/tasks/{response.json()['task_id']}")
    assert response.status_code == 202
    assert shown.status_code == 200
    [raw] = api.queued()
    assert (queued_request(raw)["user"], queued_request(raw)["team"]) == ("alice", "blue")
    [event] = [e for e in audit_events(settings) if e["action"] == "task.submit"]
    assert (event["actor"], event["target"], event["outcome"]) == ("token:alice", response.json()["task_id"], "ok")
    assert event["detail"]["body_user_ignored"] == "mallory"


@pytestmark_http
@pytest.mark.parametrize("kind", ["unknown", "expired", "revoked", "legacy without break-glass", "no bearer"])
def test_a_token_that_is_not_live_is_401_on_every_route(api: IntakeServer, settings: Settings, kind: str) -> None:
    store, now = token_store(settings), utc_now()
    if kind == "expired":
        _, secret = store.create("alice", "admin", [], "old", now - timedelta(seconds=1), now - timedelta(days=2))
    elif kind == "revoked":
        token, secret = store.create("alice", "admin", [], "gone", now + timedelta(days=1), now)
        store.revoke(token.id, now)
    elif kind == "unknown":
        secret = make_token(settings, "alice")[:-2] + "AA"
    else:
        secret = "legacy-shared-token"
    headers = bearer(secret) if kind != "no bearer" else {}
    with api.client(headers=headers) as client:
        answers = [client.post("/api/tasks", json={"repo": "octo/calc", "issue": 1}),
                   client.get("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11"),
                   client.post("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11/cancel")]
    assert [a.status_code for a in answers] == [401, 401, 401]
    assert answers[0].headers["WWW-Authenticate"] == "Bearer"
    assert api.queued() == []


@pytestmark_http
def test_a_viewer_token_reads_but_cannot_submit_or_cancel(api: IntakeServer, settings: Settings) -> None:
    operator, viewer = make_token(settings, "olga"), make_token(settings, "vic", role=Role.VIEWER)
    with api.client(headers=bearer(operator)) as client:
        task_id = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 5}).json()["task_id"]
    with api.client(headers=bearer(viewer)) as client:
        refused = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 6})
        shown = client.get(f"/api/tasks/{task_id}")
        not_cancelled = client.post(f"/api/tasks/{task_id}/cancel")
    with api.client(headers=bearer(operator)) as client:
        cancelled = client.post(f"/api/tasks/{task_id}/cancel")
    assert (refused.status_code, not_cancelled.status_code) == (403, 403)
    assert "needs operator" in refused.json()["detail"]
    assert (shown.status_code, shown.json()["status"]) == (200, "queued")
    assert cancelled.status_code == 202
    assert len(api.queued()) == 1
    cancels = [e for e in audit_events(settings) if e["action"] == "task.cancel"]
    assert [(e["actor"], e["target"]) for e in cancels] == [("token:olga", task_id)]


@pytestmark_http
def test_the_legacy_token_works_only_with_break_glass(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI_API_TOKEN": "shared-secret",
                              "TASUKI__AUTH__BREAK_GLASS": "true"})
    with intake_server(settings) as server, server.client(headers=bearer("shared-secret")) as client:
        response = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 2, "user": "mona"})
    assert response.status_code == 202
    [event] = [e for e in audit_events(settings) if e["action"] == "task.submit"]
    assert event["actor"] == "break-glass"


@pytestmark_http
def test_the_per_user_budget_holds_per_owner_whatever_the_body_names(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__LIMITS__USER_TASKS": "1"})
    alice, bob = make_token(settings, "alice"), make_token(settings, "bob")
    with intake_server(settings) as server:
        with server.client(headers=bearer(alice)) as client:
            first = client.post("/api/tasks", json={"repo": "octo/app", "issue": 1})
            disguised = client.post("/api/tasks", json={"repo": "octo/app", "issue": 2, "user": "somebody-else"})
        with server.client(headers=bearer(bob)) as client:
            other = client.post("/api/tasks", json={"repo": "octo/app", "issue": 3})
        queued = [queued_request(raw)["user"] for raw in server.queued()]
    assert (first.status_code, disguised.status_code, other.status_code) == (202, 429, 202)
    assert "alice started 1 tasks today" in disguised.json()["reason"]
    assert sorted(queued) == ["alice", "bob"]
    refusals = [e for e in audit_events(settings) if e["action"] == "task.submit" and e["outcome"] == "refused"]
    assert [(e["actor"], e["detail"]["body_user_ignored"]) for e in refusals] == [("token:alice", "somebody-else")]


@pytestmark_http
def test_a_team_over_its_daily_tasks_is_refused_while_others_go_on(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__AUTH__TEAMS": TEAMS,
                              "TASUKI__LIMITS__TEAM_TASKS": "2", "TASUKI__LIMITS__USER_TASKS": "5"})
    blue = [make_token(settings, who, groups=("g-blue", "everyone")) for who in ("ann", "ben", "cid")]
    red, loner = make_token(settings, "rita", groups=("g-red",)), make_token(settings, "lou", groups=("other",))
    answers = {}
    with intake_server(settings) as server:
        for number, (who, secret) in enumerate(zip(["ann", "ben", "cid", "rita", "lou"], [*blue, red, loner],
                                                   strict=True), start=1):
            with server.client(headers=bearer(secret)) as client:
                answers[who] = client.post("/api/tasks", json={"repo": "octo/app", "issue": number})
        queued = sorted(queued_request(raw)["user"] for raw in server.queued())
    assert {who: a.status_code for who, a in answers.items()} == {"ann": 202, "ben": 202, "cid": 429, "rita": 202,
                                                                  "lou": 202}
    assert "team blue started 2 tasks today; limits.team_tasks is 2" in answers["cid"].json()["reason"]
    assert queued == ["ann", "ben", "lou", "rita"]
    # cid's refused task gave back the user task it took: cid is not charged for what never started
    assert redis_client.get(user_key(day_of(utc_now()), "cid")) in (None, "0")


@pytestmark_http
def test_a_team_over_its_daily_cost_is_refused(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__AUTH__TEAMS": TEAMS,
                              "TASUKI__LIMITS__TEAM_COST": "2.5",
                              "TASUKI__PRICING": json.dumps({"gpt-4o": {"input": 1, "output": 1}})})
    blue, red = make_token(settings, "ann", groups=("g-blue",)), make_token(settings, "rita", groups=("g-red",))
    redis_client.hincrbyfloat(team_key(day_of(utc_now()), "blue"), "cost", 2.5)  # what blue's tasks cost today
    with intake_server(settings) as server:
        with server.client(headers=bearer(blue)) as client:
            over = client.post("/api/tasks", json={"repo": "octo/app", "issue": 1})
        with server.client(headers=bearer(red)) as client:
            fine = client.post("/api/tasks", json={"repo": "octo/app", "issue": 2})
    assert (over.status_code, fine.status_code) == (429, 202)
    assert "team blue cost $2.5000 today; limits.team_cost is $2.5000" in over.json()["reason"]



@pytestmark_http
def test_anyone_reads_their_own_budget_and_only_an_admin_every_teams(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__AUTH__TEAMS": TEAMS,
                              "TASUKI__LIMITS__TEAM_TASKS": "3", "TASUKI__LIMITS__USER_TASKS": "2"})
    ann, vic = make_token(settings, "ann", groups=("g-blue",)), make_token(settings, "vic", role=Role.VIEWER)
    ada = make_token(settings, "ada", role=Role.ADMIN, groups=("g-red",))
    with intake_server(settings) as server:
        with server.client(headers=bearer(ann)) as client:
            assert client.post("/api/tasks", json={"repo": "octo/app", "issue": 1}).status_code == 202
            own = client.get("/api/budget").json()
            refused = client.get("/api/budgets")
        with server.client(headers=bearer(vic)) as client:
            viewer = client.get("/api/budget").json()
        with server.client(headers=bearer(ada)) as client:
            every = client.get("/api/budgets")
    assert own["user"] == {"name": "ann", "tasks": 1, "tasks_cap": 2}
    assert own["team"] == {"name": "blue", "tasks": 1, "tasks_cap": 3, "cost": 0.0, "cost_cap": None}
    assert (viewer["user"]["tasks"], viewer["team"]) == (0, None)
    assert refused.status_code == 403
    assert every.status_code == 200
    assert [(t["name"], t["tasks"]) for t in every.json()["teams"]] == [("blue", 1), ("red", 0)]
    assert every.json()["limits"]["team_tasks"] == 3


@pytestmark_http
def test_the_worker_counts_a_teams_priced_calls_toward_its_daily_cost(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url,
                              "TASUKI__PRICING": json.dumps({"priced": {"input": 1_000_000, "output": 0}})})
    now = utc_now()
    Meter(settings, "github/octo/app", lambda: redis_client, clock=lambda: now, team="blue").count(
        Usage("agent", "priced", 3))  # three tokens at a dollar each
    Meter(settings, "github/octo/app", lambda: redis_client, clock=lambda: now).count(Usage("agent", "priced", 5))
    assert redis_client.hget(team_key(day_of(now), "blue"), "cost") == "3"
    assert over_budget(settings.limits.model_copy(update={"team_cost": 3.0}), redis_client,
                       {"task_source": "github", "owner": "octo", "repo": "app"}, "ann", now, "blue") == (
        "team blue cost $3.0000 today; limits.team_cost is $3.0000")

# -- tasuki token ----------------------------------------------------------------------------------


def test_tasuki_token_makes_lists_and_revokes_with_the_secret_printed_once(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    config = tmp_path / "empty-config.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base)})

    def tasuki(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "token", *args], capture_output=True, text=True,
                              env=env, cwd=Path(__file__).resolve().parents[1], timeout=60, check=False)

    secret, note = ok(tasuki("create", "ci@example.com", "--role", "viewer", "--group", "g-blue")).splitlines()
    listed = json.loads(ok(tasuki("list", "--json")))
    store = TokenStore.beside(base)
    assert store.lookup(secret, utc_now()) is not None
    assert listed["id"] in note
    assert (listed["owner"], listed["role"], listed["groups"], listed["status"]) == (
        "ci@example.com", "viewer", ["g-blue"], "active")
    assert secret not in json.dumps(listed)
    assert "auth.token_max_days" in one_line_error(tasuki("create", "x", "--days", "91"), 2)
    assert ok(tasuki("revoke", listed["id"])).startswith("revoked")
    assert store.lookup(secret, utc_now()) is None
    assert "no token nope" in one_line_error(tasuki("revoke", "nope"), 2)
