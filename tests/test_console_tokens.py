"""The console's API-token page (issue 40) on the intake served by a real uvicorn: an operator makes a token for
themselves, sees its secret once, and calls the API with it as themselves and their team; a token cannot outrank
its maker; a viewer has no token page; only the owner or an admin revokes, and a revoked token is refused."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from console.sessions import COOKIE, Sessions, session_key
from tests.helpers.intake_server import IntakeServer, intake_server
from worker.audit import audit_log
from worker.roles import Role
from worker.settings_models import Settings

pytestmark = pytest.mark.integration

SESSION_SECRET = "console-session-secret-for-tests"
SECRET_RE = re.compile(r'<code id="token-secret">([^<]+)</code>')


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_url: str, redis_client: redis.Redis) -> Settings:
    return make_settings({"TASUKI__BROKER__URL": redis_url, "TASUKI__CONSOLE__ENABLED": "true",
                          "TASUKI_CONSOLE_SESSION_SECRET": SESSION_SECRET,
                          "TASUKI__AUTH__TEAMS": json.dumps({"blue": ["g-blue"]}),
                          "TASUKI__AUTH__TOKEN_MAX_DAYS": "30"})


@pytest.fixture
def server(settings: Settings) -> Iterator[IntakeServer]:
    with intake_server(settings) as served:
        yield served


def browser(server: IntakeServer, settings: Settings, actor: str, role: Role,
            groups: tuple[str, ...] = ()) -> tuple[httpx.Client, str]:
    """A client signed in as ``actor`` (the cookie the sign-in would set) and its session's CSRF token."""
    sessions = Sessions(session_key(SESSION_SECRET, None), settings.console.session_lifetime_s, time.time)
    session, cookie = sessions.new(actor, role, actor.removeprefix("oidc:"), groups)
    client = server.client(cookies={COOKIE: cookie}, follow_redirects=False)
    return client, session.csrf


def make(client: httpx.Client, csrf: str, role: str = "operator", days: str = "7") -> httpx.Response:
    return client.post("/console/tokens", data={"csrf": csrf, "name": "laptop", "role": role, "days": days})


def test_an_operators_token_is_shown_once_and_calls_the_api_as_them(server: IntakeServer, settings: Settings) -> None:
    olga, csrf = browser(server, settings, "oidc:olga@example.com", Role.OPERATOR, ("g-blue",))
    with olga:
        made = make(olga, csrf)
        secret = html.unescape(SECRET_RE.search(made.text).group(1))  # type: ignore[union-attr]
        listed = olga.get("/console/tokens")
    assert made.status_code == 200
    assert secret.startswith("tsk_")
    assert listed.status_code == 200
    assert "laptop" in listed.text
    assert secret not in listed.text  # shown once
    with server.client(headers={"Authorization": f"Bearer {secret}"}) as api:
        submitted = api.post("/api/tasks", json={"repo": "octo/calc", "issue": 4, "user": "someone"})
    assert submitted.status_code == 202
    created = [e for e in audit_log(settings).read() if e["action"] == "token.create"]
    assert [(e["actor"], e["outcome"], e["detail"]["role"]) for e in created] == [
        ("oidc:olga@example.com", "ok", "operator")]
    assert secret not in json.dumps(list(audit_log(settings).read()))


def test_a_token_cannot_outrank_or_outlive_what_its_maker_may(server: IntakeServer, settings: Settings) -> None:
    olga, csrf = browser(server, settings, "oidc:olga@example.com", Role.OPERATOR)
    with olga:
        too_high, too_long, no_csrf = make(olga, csrf, role="admin"), make(olga, csrf, days="31"), make(olga, "x")
    assert (too_high.status_code, too_long.status_code, no_csrf.status_code) == (422, 422, 403)
    assert "cannot exceed its owner" in html.unescape(too_high.text)
    assert "auth.token_max_days" in too_long.text
    assert not SECRET_RE.search(too_high.text)


def test_a_viewer_has_no_token_page(server: IntakeServer, settings: Settings) -> None:
    vic, csrf = browser(server, settings, "oidc:vic@example.com", Role.VIEWER)
    with vic:
        assert vic.get("/console/tokens").status_code == 403
        assert make(vic, csrf, role="viewer").status_code == 403


def test_only_the_owner_or_an_admin_revokes_and_a_revoked_token_is_refused(
    server: IntakeServer, settings: Settings
) -> None:
    olga, olga_csrf = browser(server, settings, "oidc:olga@example.com", Role.OPERATOR)
    otto, otto_csrf = browser(server, settings, "oidc:otto@example.com", Role.OPERATOR)
    ada, ada_csrf = browser(server, settings, "oidc:ada@example.com", Role.ADMIN)
    with olga, otto, ada:
        secret = html.unescape(SECRET_RE.search(make(olga, olga_csrf).text).group(1))  # type: ignore[union-attr]
        token_id = re.search(r'data-token="([0-9a-f]+)"', olga.get("/console/tokens").text).group(1)  # type: ignore[union-attr]
        assert token_id not in otto.get("/console/tokens").text  # another operator does not see it
        assert otto.post(f"/console/tokens/{token_id}/revoke", data={"csrf": otto_csrf}).status_code == 404
        assert token_id in ada.get("/console/tokens").text  # an admin sees every token
        with server.client(headers={"Authorization": f"Bearer {secret}"}) as api:
            before = api.get("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11").status_code
            revoked = ada.post(f"/console/tokens/{token_id}/revoke", data={"csrf": ada_csrf})
            after = api.get("/api/tasks/2f1c0a47-43f1-4c8e-9a4b-0d5f8d5b8f11").status_code
    assert (before, revoked.status_code, after) == (404, 303, 401)
    revokes = [e for e in audit_log(settings).read() if e["action"] == "token.revoke"]
    assert [(e["actor"], e["target"]) for e in revokes] == [("oidc:ada@example.com", token_id)]
