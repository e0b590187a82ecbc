"""The task API under a real uvicorn server: bearer token, submit, look up, cancel (SPEC §8).

These tests call it with the legacy shared token, which works only with ``auth.break_glass`` (issue 40); personal
tokens, roles and the task's user are tests/test_api_tokens.py's."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore
from memory.records import repository_key
from tests.helpers.intake_server import IntakeServer, intake_server
from worker.attempt_tasks import GROUP_PREFIX
from worker.attempts import attempt_uuid
from worker.names import CANCEL_PREFIX
from worker.settings_models import Settings

pytestmark = pytest.mark.integration

API_TOKEN = "api-token-for-tests"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
LEGACY = {"TASUKI_API_TOKEN": API_TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true"}


@pytest.fixture
def api(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[IntakeServer]:
    roots = json.dumps([str(tmp_path / "repos")])
    settings = make_settings(
        {"TASUKI__BROKER__URL": redis_url, **LEGACY, "TASUKI__API__ALLOWED_REPO_ROOTS": roots}
    )
    with intake_server(settings) as server:
        yield server


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


@pytest.mark.parametrize("env", [{}, {"TASUKI_API_TOKEN": API_TOKEN}], ids=["no token", "no break-glass"])
def test_the_legacy_token_is_refused_without_break_glass(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis, env: dict[str, str]
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, **env})
    with intake_server(settings) as server, server.client() as client:
        response = client.post("/api/tasks", json={"repo": "octo/calc", "prompt": "p"}, headers=AUTH)
    assert response.status_code == 401
    assert server.queued() == []


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Basic {API_TOKEN}", f"Bearer {API_TOKEN}x", "Bearer"]
)
def test_wrong_or_missing_bearer_token_is_401(api: IntakeServer, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    with api.client() as client:
        response = client.post("/api/tasks", json={"repo_path": "/tmp/x", "prompt": "p"}, headers=headers)
        assert response.status_code == 401
        assert client.get("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11", headers=headers).status_code == 401
    assert api.queued() == []


def test_submitted_local_task_is_queued_and_visible_before_it_starts(api: IntakeServer, tmp_path: Path) -> None:
    with api.client(headers=AUTH) as client:
        repo = git_repo(tmp_path / "repos" / "repo")
        response = client.post("/api/tasks", json={"repo_path": str(repo), "prompt": "Fix it."})
        task_id = response.json()["task_id"]
        shown = client.get(f"/api/tasks/{task_id}").json()

    assert response.status_code == 202
    assert shown["status"] == "queued"
    assert shown["task_key"] == {
        "task_source": "local",
        "owner": "local",
        "repo": "repo",
        "task_type": "prompt",
        "task_id": task_id[:8],
    }
    message = json.loads(api.queued()[0])
    assert message["headers"]["id"] == task_id


def test_second_submission_for_the_same_issue_reports_the_active_task(api: IntakeServer) -> None:
    body = {"repo": "octo/calc", "issue": 7}
    with api.client(headers=AUTH) as client:
        first = client.post("/api/tasks", json=body)
        second = client.post("/api/tasks", json={**body, "source": "github"})
    assert first.status_code == 202
    assert (second.status_code, second.json()) == (200, {"status": "active", "task_id": first.json()["task_id"]})
    assert len(api.queued()) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"repo": "octo/calc", "repo_path": "/srv/calc", "prompt": "p"},
        {"repo_path": "relative/path", "prompt": "p"},
        {"repo": "octo/calc"},  # neither issue nor prompt
        {"repo": "not a repo", "issue": 1},
        {"repo": "octo/calc", "issue": 0},
        {"repo": "octo/calc", "issue": 1, "source": "bitbucket"},
        {"repo": "octo/calc", "issue": 1, "config": {"model": "x"}},  # no unknown keys
        [1, 2],
    ],
)
def test_invalid_submissions_are_422_and_enqueue_nothing(api: IntakeServer, body: object) -> None:
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json=body)
    assert response.status_code == 422
    assert api.queued() == []


def test_a_repo_path_holding_a_nul_byte_is_422_not_a_server_error(api: IntakeServer) -> None:
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo_path": "/srv/calc\u0000/../etc", "prompt": "p"})
    assert response.status_code == 422
    assert "NUL byte" in response.text
    assert api.queued() == []


def test_unparsable_submission_is_422(api: IntakeServer) -> None:
    with api.client(headers=AUTH) as client:
        assert client.post("/api/tasks", content=b"{nope").status_code == 422


def test_lookup_of_unknown_or_malformed_ids(api: IntakeServer) -> None:
    with api.client(headers=AUTH) as client:
        assert client.get("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11").status_code == 404
        assert client.get("/api/tasks/..%2F..%2Fetc").status_code in (400, 404)
        assert client.get("/api/tasks/not-a-uuid").status_code == 400
        assert client.post("/api/tasks/not-a-uuid/cancel").status_code == 400


def test_lookup_returns_metadata_and_state_of_a_context(
    api: IntakeServer, make_settings: Callable[..., Settings], redis_url: str
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url})
    store = ContextStore(settings.contexts.base_dir)
    key = {"task_source": "local", "owner": "local", "repo": "r", "task_type": "prompt", "task_id": "1"}
    ctx = store.create(
        key,
        {"llm_provider": "openai", "model": "m", "context_length": 1000, "compression_threshold": 0.7},
        user="alice",
        heartbeat=False,
    )
    try:
        with api.client(headers=AUTH) as client:
            shown = client.get(f"/api/tasks/{ctx.uuid}").json()
        assert shown["status"] == "initializing"
        assert shown["metadata"]["user"] == "alice"
        assert shown["state"]["attempt"] == 1
    finally:
        ctx.release()


def test_cancel_of_a_queued_task_flags_it_and_frees_its_key(api: IntakeServer, redis_client: redis.Redis) -> None:
    with api.client(headers=AUTH) as client:
        task_id = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 9}).json()["task_id"]
        cancelled = client.post(f"/api/tasks/{task_id}/cancel")
        again = client.post("/api/tasks", json={"repo": "octo/calc", "issue": 9})
    assert cancelled.status_code == 202
    assert redis_client.exists(CANCEL_PREFIX + task_id)
    assert again.status_code == 202  # the revoked task no longer holds the issue


def test_cancel_of_a_finished_task_is_409(
    api: IntakeServer, make_settings: Callable[..., Settings], redis_url: str
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url})
    store = ContextStore(settings.contexts.base_dir)
    key = {"task_source": "local", "owner": "local", "repo": "r", "task_type": "prompt", "task_id": "2"}
    ctx = store.create(
        key,
        {"llm_provider": "openai", "model": "m", "context_length": 1000, "compression_threshold": 0.7},
        heartbeat=False,
    )
    ctx.finish("completed")
    with api.client(headers=AUTH) as client:
        assert client.post(f"/api/tasks/{ctx.uuid}/cancel").status_code == 409


def test_a_repo_path_outside_the_allowed_roots_is_refused_and_nothing_is_queued(
    api: IntakeServer, tmp_path: Path
) -> None:
    outside = git_repo(tmp_path / "elsewhere")
    (tmp_path / "repos").mkdir()
    (tmp_path / "repos" / "link").symlink_to(outside)
    with api.client(headers=AUTH) as client:
        for path in (outside, tmp_path / "repos" / "link", Path("/")):
            response = client.post("/api/tasks", json={"repo_path": str(path), "prompt": "p"})
            assert response.status_code == 403, path
            assert "allowed root" in response.json()["detail"]
    assert api.queued() == []


def test_a_repo_path_that_is_not_a_git_repository_is_422(api: IntakeServer, tmp_path: Path) -> None:
    (tmp_path / "repos" / "plain").mkdir(parents=True)
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo_path": str(tmp_path / "repos" / "plain"), "prompt": "p"})
    assert response.status_code == 422
    assert "not a git repository" in json.dumps(response.json())
    assert api.queued() == []


def queued_requests(api: IntakeServer) -> list[dict[str, Any]]:
    """The ``tasuki.run_task`` requests waiting in the queue (kombu keeps each body base64-encoded)."""
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][1] for raw in api.queued()]


def test_a_bare_repository_is_accepted_as_its_real_path(api: IntakeServer, tmp_path: Path) -> None:
    source = git_repo(tmp_path / "source")
    bare = tmp_path / "repos" / "calc.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True)
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo_path": f"{bare}/", "prompt": "Fix it."})
    assert response.status_code == 202, response.text
    [request] = queued_requests(api)
    assert request["repo_path"] == str(bare.resolve())
    assert request["task_key"]["repo"] == "calc.git"


def test_every_spelling_of_a_local_repository_is_one_repository(api: IntakeServer, tmp_path: Path) -> None:
    """The real path is the identity the environment, snapshot, mirror and memory key on (issue 41)."""
    repo = git_repo(tmp_path / "repos" / "x")
    (tmp_path / "repos" / "sub").mkdir()
    (tmp_path / "repos" / "link").symlink_to(repo)
    spellings = [str(repo), f"{tmp_path}/repos/sub/../x", f"{tmp_path}/repos/link", f"{repo}/."]
    with api.client(headers=AUTH) as client:
        answers = [client.post("/api/tasks", json={"repo_path": path, "prompt": "p"}) for path in spellings]
    assert [answer.status_code for answer in answers] == [202] * len(spellings)
    requests = queued_requests(api)
    assert len(requests) == len(spellings)
    assert {request["repo_path"] for request in requests} == {str(repo.resolve())}
    assert {repository_key(request["task_key"], request["repo_path"]) for request in requests} == {
        str(repo.resolve())
    }
    assert {request["task_key"]["repo"] for request in requests} == {"x"}


def test_a_half_bare_layout_is_a_clear_422(api: IntakeServer, tmp_path: Path) -> None:
    plain = tmp_path / "repos" / "plain"
    (plain / "objects").mkdir(parents=True)  # HEAD and refs/ missing: not a bare repository
    (plain / "HEAD").write_text("ref: refs/heads/main\n")
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo_path": str(plain), "prompt": "p"})
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem == {
        "loc": ["repo_path"],
        "msg": f"{plain} is not a git repository (neither a work tree nor a bare one)",
    }
    assert api.queued() == []


def test_local_paths_are_refused_over_http_by_default(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path / "repo")
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, **LEGACY})
    with intake_server(settings) as server, server.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo_path": str(repo), "prompt": "p"})
        assert response.status_code == 403
        assert "api.allowed_repo_roots is empty" in response.json()["detail"]
        assert server.queued() == []


def test_cancel_of_an_unknown_task_is_404(api: IntakeServer) -> None:
    with api.client(headers=AUTH) as client:
        assert client.post("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11/cancel").status_code == 404


def test_the_queued_celery_message_carries_the_request_masked(api: IntakeServer) -> None:
    """Celery's arguments live in Redis and in Flower: issue text with a token in it is masked before."""
    token, email = "ghp_0123456789abcdefABCDEF0123456789abcd", "alice@example.com"
    with api.client(headers=AUTH) as client:
        response = client.post("/api/tasks", json={"repo": "octo/calc", "prompt": f"Use {token}, ask {email}."})
    assert response.status_code == 202
    [raw] = api.queued()
    message = json.loads(raw)
    body = base64.b64decode(message["body"]).decode()  # kombu's JSON envelope holds the body base64-encoded
    assert message["properties"]["body_encoding"] == "base64"
    assert "[GITHUB_TOKEN]" in body
    for secret in (token, email):
        assert secret not in body
        assert secret not in raw.decode()


def test_a_submission_over_its_users_daily_task_cap_is_429_with_retry_after_and_queues_nothing(
    make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis
) -> None:
    settings = make_settings({"TASUKI__BROKER__URL": redis_url, **LEGACY, "TASUKI__LIMITS__USER_TASKS": "1"})
    with intake_server(settings) as server, server.client(headers=AUTH) as client:
        first = client.post("/api/tasks", json={"repo": "octo/app", "issue": 1, "user": "mona"})
        again = client.post("/api/tasks", json={"repo": "octo/app", "issue": 1, "user": "mona"})  # active: no task
        over = client.post("/api/tasks", json={"repo": "octo/app", "issue": 2, "user": "mona"})
        other = client.post("/api/tasks", json={"repo": "octo/app", "issue": 3, "user": "hubot"})
        queued = server.queued()

    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 202)
    assert over.status_code == 429
    assert over.json()["status"] == "over_budget"
    assert "limits.user_tasks is 1" in over.json()["reason"]
    assert 0 < int(over.headers["Retry-After"]) <= 86400
    assert len(queued) == 2  # mona's first task and hubot's


def test_a_task_run_as_several_attempts_is_described_by_its_group(
    api: IntakeServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    with api.client(headers=AUTH) as client:
        repo = git_repo(tmp_path / "repos" / "repo")
        response = client.post("/api/tasks", json={"repo_path": str(repo), "prompt": "Fix it.", "attempts": 2})
        task_id = response.json()["task_id"]
        queued = json.loads(base64.b64decode(json.loads(api.queued()[0])["body"]))[0]
        assert queued[1]["attempts"] == 2  # the worker fans it out (tests/test_attempts_e2e.py)
        key = client.get(f"/api/tasks/{task_id}").json()["task_key"]
        redis_client.hset(GROUP_PREFIX + task_id, mapping={"request": json.dumps({"task_key": key}), "of": 2,
                                                           "ended.1": "completed"})
        running = client.get(f"/api/tasks/{task_id}").json()
        redis_client.hset(GROUP_PREFIX + task_id, mapping={
            "ended.2": "failed", "finished": "completed", "pick": json.dumps({"winner": 1, "reason": "attempt 1 of 2"}),
            "delivered": json.dumps({"branch": "tasuki/x-a1"})})
        done = client.get(f"/api/tasks/{task_id}").json()

    assert running == {"task_id": task_id, "status": "processing", "task_key": key, "attempts": [
        {"number": 1, "task_id": attempt_uuid(task_id, 1), "status": "completed"},
        {"number": 2, "task_id": attempt_uuid(task_id, 2), "status": None}]}
    assert done["status"] == "completed"
    assert done["pick"] == "attempt 1 of 2"
    assert done["result"] == {"branch": "tasuki/x-a1"}
