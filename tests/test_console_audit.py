"""The console's audit page (issue 40) on the intake served by a real uvicorn: an admin reads the newest events,
filtered, and asks whether the chain is intact; an operator or viewer is refused; nothing shown is unescaped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from console.audit import NEEDED_ROLE
from console.sessions import COOKIE, Sessions, session_key
from tests.helpers.intake_server import IntakeServer, intake_server
from worker.audit import audit_path, record_audit
from worker.roles import Role
from worker.settings_models import Settings

pytestmark = pytest.mark.integration

SESSION_SECRET = "console-session-secret-for-tests"
NOW = datetime.now(UTC)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    settings = make_settings({"TASUKI__CONSOLE__ENABLED": "true", "TASUKI_CONSOLE_SESSION_SECRET": SESSION_SECRET})
    events = [("github:alice", "trigger.admitted", "ok", "", timedelta(days=3)),
              ("github:mallory", "trigger.refused", "refused", "read permission on o/r", timedelta(hours=5)),
              ("oidc:<script>alert(1)</script>", "signin.refused", "refused", "not in an admitted group",
               timedelta(hours=2)),
              ("cli:bob", "task.cancel", "ok", "", timedelta(minutes=5))]
    for actor, action, outcome, reason, ago in events:
        record_audit(settings, actor=actor, action=action, outcome=outcome, reason=reason, target="o/r#1",
                     source="test", now=NOW - ago)
    return settings


@pytest.fixture
def server(settings: Settings) -> Iterator[IntakeServer]:
    with intake_server(settings) as served:
        yield served


def browser(server: IntakeServer, settings: Settings, role: Role) -> httpx.Client:
    sessions = Sessions(session_key(SESSION_SECRET, None), settings.console.session_lifetime_s, time.time)
    _, cookie = sessions.new(f"oidc:{role.label}@example.com", role, role.label)
    return server.client(cookies={COOKIE: cookie}, follow_redirects=False)


def _actors(page: str) -> list[str]:
    return [actor for actor in ("cli:bob", "oidc:&lt;script&gt;", "github:mallory", "github:alice") if actor in page]


def test_an_admin_reads_the_newest_events_first_escaped(server: IntakeServer, settings: Settings) -> None:
    with browser(server, settings, Role.ADMIN) as admin:
        page = admin.get("/console/audit")
    assert page.status_code == 200
    assert _actors(page.text) == ["cli:bob", "oidc:&lt;script&gt;", "github:mallory", "github:alice"]
    assert page.text.index("cli:bob") < page.text.index("github:alice")
    assert "<script>alert(1)" not in page.text
    assert "read permission on o/r" in page.text
    assert 'href="/console/audit"' in page.text  # in the admin's navigation


def test_the_filters_narrow_by_actor_action_and_time(server: IntakeServer, settings: Settings) -> None:
    with browser(server, settings, Role.ADMIN) as admin:
        by_actor = admin.get("/console/audit", params={"actor": "github:*"})
        by_action = admin.get("/console/audit", params={"action": "trigger.refused"})
        recent = admin.get("/console/audit", params={"since": "24h"})
    assert _actors(by_actor.text) == ["github:mallory", "github:alice"]
    assert _actors(by_action.text) == ["github:mallory"]
    assert _actors(recent.text) == ["cli:bob", "oidc:&lt;script&gt;", "github:mallory"]


def test_verify_says_intact_then_names_an_altered_line(server: IntakeServer, settings: Settings) -> None:
    with browser(server, settings, Role.ADMIN) as admin:
        intact = admin.get("/console/audit", params={"verify": "1"})
        log = audit_path(settings) / "audit.jsonl"
        log.write_text(log.read_text().replace("github:mallory", "github:nobody"))
        broken = admin.get("/console/audit", params={"verify": "1"})
    assert "The chain is intact" in intact.text
    assert "The chain is broken: line 2:" in broken.text


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.VIEWER])
def test_below_the_admin_role_the_page_is_refused(server: IntakeServer, settings: Settings, role: Role) -> None:
    assert NEEDED_ROLE is Role.ADMIN
    with browser(server, settings, role) as person:
        page = person.get("/console/audit")
        fleet = person.get("/console/")
    assert page.status_code == 403
    assert "needs the admin role" in page.text
    assert "github:mallory" not in page.text
    assert 'href="/console/audit"' not in fleet.text


def test_without_a_session_the_page_sends_to_sign_in(server: IntakeServer) -> None:
    with server.client(follow_redirects=False) as anonymous:
        page = anonymous.get("/console/audit")
    assert page.status_code == 303
    assert page.headers["location"].endswith("/console/signin")
