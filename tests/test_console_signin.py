"""Console sign-in through OpenID Connect and the roles it gives (issue 40 items 2-3), in Debian's chromium driven by
Playwright against the intake's app (console enabled) on a real uvicorn server, real Redis, and a fake provider
speaking the whole protocol over real HTTP (tests/helpers/oidc_provider.py: Dex cannot be built offline here).

People: vera (staff: a viewer), otto (staff and oncall: an operator; his groups only in userinfo), ada (platform:
an admin), dom (no group, a verified e-mail at example.com: a viewer), mallory (contractors, elsewhere.net) and eve
(an unverified e-mail at example.com) — the last two are refused.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from itsdangerous import URLSafeSerializer, URLSafeTimedSerializer

from contexts import ContextStore
from contexts.context import Context
from contexts.state import read_state
from tests.conftest import TEST_KEY_PATTERNS, delete_keys
from tests.helpers.console_contexts import running_task
from tests.helpers.intake_server import intake_server
from tests.helpers.oidc_provider import FakeOIDCProvider, Person, s256, serve_provider
from worker.audit import audit_log
from worker.names import HEARTBEATS_KEY
from worker.settings import load_settings
from worker.settings_models import Settings

pytest.importorskip("playwright")
from playwright.sync_api import Browser, Page, expect

from tests.test_console_browser import browser  # noqa: F401 - the module's one chromium

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CLIENT_ID = "tasuki-console"
CLIENT_SECRET = "fake-provider-client-secret-5f1e"
PEOPLE = (
    Person("vera", "vera@other.org", ("staff",)),
    Person("otto", "otto@other.org", ("staff", "oncall"), groups_in_token=False),
    Person("ada", "ada@other.org", ("platform",)),
    Person("dom", "dom@example.com"),
    Person("mallory", "mallory@elsewhere.net", ("contractors",)),
    Person("eve", "eve@example.com", email_verified=False),
)


@dataclass
class Stack:
    url: str
    provider: FakeOIDCProvider
    settings: Settings
    store: ContextStore
    tasks: list[Context]

    def page_url(self, path: str) -> str:
        return f"{self.url}/console{path}"

    @property
    def callback(self) -> str:
        return f"{self.url}/console/oidc/callback"

    def audit(self, action: str) -> list[dict[str, Any]]:
        return [e for e in audit_log(self.settings).read() if e["action"] == action]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("signin")
    (root / "config.yaml").write_text("")
    provider = FakeOIDCProvider(CLIENT_ID, CLIENT_SECRET)
    for person in PEOPLE:
        provider.add(person)
    with serve_provider(provider):
        settings = load_settings(config_path=root / "config.yaml", env={
            "TASUKI__CONTEXTS__BASE_DIR": str(root / "contexts"),
            "TASUKI__CONTEXTS__WORKSPACES_DIR": str(root / "workspaces"),
            "TASUKI__BROKER__URL": redis_url,
            "TASUKI__CONSOLE__ENABLED": "true",
            "TASUKI__CONSOLE__TOKEN": "a-shared-token-that-must-not-work",
            "TASUKI__CONSOLE__SIGNIN_ATTEMPTS_PER_MINUTE": "1000",
            "TASUKI__AUTH__OIDC__ISSUER": provider.url,
            "TASUKI__AUTH__OIDC__CLIENT_ID": CLIENT_ID,
            "TASUKI_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "TASUKI_CONSOLE_SESSION_SECRET": "session-secret-for-the-signin-tests",
            "TASUKI__AUTH__ADMIT__GROUPS": '["staff"]',
            "TASUKI__AUTH__ADMIT__EMAIL_DOMAINS": '["example.com"]',
            "TASUKI__AUTH__ROLES__OPERATOR": '["oncall"]',
            "TASUKI__AUTH__ROLES__ADMIN": '["platform"]',
        })
        store = ContextStore(root / "contexts")
        tasks = [running_task(store, n, user="carol") for n in (1, 2)]
        client = redis.Redis.from_url(redis_url, socket_timeout=5)
        client.zadd(HEARTBEATS_KEY, {t.uuid: time.time() for t in tasks})
        try:
            with intake_server(settings, client) as server:
                provider.redirect_uris = (f"{server.url}/console/oidc/callback",)
                yield Stack(server.url, provider, settings, store, tasks)
        finally:
            for task in tasks:
                task.release()
            delete_keys(client, TEST_KEY_PATTERNS)
            client.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811 - the imported fixture
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def sign_in(page: Page, stack: Stack, username: str) -> None:
    """Through the console's sign-in page, the provider's page, and back."""
    page.goto(stack.page_url("/"))
    page.click("#signin-oidc")
    expect(page.locator("h1")).to_have_text("Sign in to the fake provider")
    page.click(f"#as-{username}")


def session_cookie(page: Page) -> dict[str, Any]:
    return dict(next(c for c in page.context.cookies() if c["name"] == "tasuki_console"))


def hidden_fields(html: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html))


def code_for(http: httpx.Client, username: str) -> tuple[str, dict[str, str]]:
    """Start a sign-in at the console and pick ``username`` at the provider; the code the provider sends back
    (not delivered to the console) and the authorization request's fields."""
    authorize = http.get("/console/signin/oidc", follow_redirects=True)
    fields = hidden_fields(authorize.text)
    back = http.post(str(authorize.url.copy_with(path="/login", query=None)), data={**fields, "username": username},
                     follow_redirects=False)
    assert back.status_code == 302, back.text
    location = httpx.URL(back.headers["location"])
    return location.params["code"], fields


def test_a_viewer_sees_the_tasks_but_has_no_cancel_and_a_forged_cancel_is_403(stack: Stack, page: Page) -> None:
    sign_in(page, stack, "vera")
    expect(page.locator("h1")).to_have_text("Fleet")
    expect(page.locator("#who")).to_have_text("Vera · viewer")
    expect(page.locator("#break-glass")).to_have_count(0)
    cookie = session_cookie(page)
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["secure"]) == (True, "Lax", False)  # http://127.0.0.1
    page.goto(stack.page_url("/tasks"))
    expect(page.locator("table.tasks tbody tr")).to_have_count(2)
    task = stack.tasks[0]
    page.goto(stack.page_url(f"/tasks/{task.uuid}"))
    expect(page.locator("#issue-title")).to_be_visible()
    expect(page.locator("#cancel")).to_have_count(0)
    # The forgery carries everything a form would: the session cookie and the session's own CSRF token.
    _, payload = URLSafeTimedSerializer("unknown").loads_unsafe(cookie["value"])
    answer = page.request.post(stack.page_url(f"/tasks/{task.uuid}/cancel"), form={"csrf": payload["csrf"]},
                               max_redirects=0)
    assert answer.status == 403
    assert answer.text() == "Refused: this needs the operator role; Vera is viewer."
    assert read_state(stack.store.running_path(task.uuid)).get("cancel_requested") is not True
    signin = stack.audit("signin")
    assert {"actor": "oidc:vera@other.org", "outcome": "ok"} in [{k: e[k] for k in ("actor", "outcome")}
                                                                 for e in signin]


def test_an_operator_whose_groups_come_from_userinfo_cancels_a_task(stack: Stack, page: Page) -> None:
    sign_in(page, stack, "otto")
    expect(page.locator("#who")).to_have_text("Otto · operator")
    task = stack.tasks[1]
    page.goto(stack.page_url(f"/tasks/{task.uuid}"))
    page.click("#cancel")
    expect(page.locator("#cancel")).to_have_text("Cancel requested")
    assert read_state(stack.store.running_path(task.uuid))["cancel_requested"] is True
    cancels = stack.audit("task.cancel")
    assert [(e["actor"], e["target"]) for e in cancels] == [("oidc:otto@other.org", task.uuid)]
    page.click("form.signout button")
    expect(page.locator("#signin-oidc")).to_be_visible()
    assert stack.audit("signout")[-1]["actor"] == "oidc:otto@other.org"
    assert not [c for c in page.context.cookies() if c["name"] == "tasuki_console"]


def test_an_admin_reaches_the_audit_page_an_operator_does_not(stack: Stack, page: Page) -> None:
    sign_in(page, stack, "ada")
    expect(page.locator("#who")).to_have_text("Ada · admin")
    answer = page.goto(stack.page_url("/audit"))
    assert answer is not None
    assert answer.status == 200
    expect(page.locator("main")).to_contain_text("signin")
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        code, fields = code_for(http, "otto")
        http.get("/console/oidc/callback", params={"code": code, "state": fields["state"]})
        refused = http.get("/console/audit")
        assert (refused.status_code, "needs the admin role" in refused.text) == (403, True)


def test_people_outside_the_admitted_groups_and_domains_are_refused_and_a_verified_domain_is_a_viewer(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack, "mallory")
    expect(page.locator(".error")).to_have_text(
        "Sign-in refused: Mallory is not in an admitted group or e-mail domain.")
    assert not [c for c in page.context.cookies() if c["name"] == "tasuki_console"]
    page.goto(stack.page_url("/tasks"))
    expect(page.locator("#signin-oidc")).to_be_visible()  # sent back to sign in
    sign_in(page, stack, "eve")  # example.com, but the provider never verified the address
    expect(page.locator(".error")).to_contain_text("Eve is not in an admitted group or e-mail domain")
    refused = {e["actor"]: e["reason"] for e in stack.audit("signin.refused")}
    assert refused["oidc:mallory@elsewhere.net"] == "not in an admitted group or e-mail domain"
    assert "oidc:sub-eve" in refused  # an unverified address is not who she is
    sign_in(page, stack, "dom")
    expect(page.locator("#who")).to_have_text("Dom · viewer")


def test_a_tampered_session_cookie_is_refused(stack: Stack, page: Page) -> None:
    sign_in(page, stack, "vera")
    expect(page.locator("h1")).to_have_text("Fleet")
    cookie = session_cookie(page)
    _, payload = URLSafeTimedSerializer("unknown").loads_unsafe(cookie["value"])
    assert payload["role"] == 1
    _, stamp, signature = cookie["value"].rsplit(".", 2)
    # vera made an admin, the timestamp and signature kept: they no longer match the payload.
    forged = f"{URLSafeSerializer('any').dump_payload({**payload, 'role': 3}).decode()}.{stamp}.{signature}"
    page.context.add_cookies([{**cookie, "value": forged}])  # type: ignore[list-item]
    page.goto(stack.page_url("/tasks"))
    expect(page.locator("#signin-oidc")).to_be_visible()
    with httpx.Client(base_url=stack.url, timeout=10, cookies={"tasuki_console": forged}) as http:
        assert http.post(f"/console/tasks/{stack.tasks[0].uuid}/cancel").status_code == 401
        assert http.get("/console/tasks", follow_redirects=False).headers["location"] == "/console/signin"


def test_the_console_sends_an_s256_challenge_and_the_provider_refuses_a_code_without_its_verifier(
    stack: Stack,
) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        code, fields = code_for(http, "vera")
        assert (fields["code_challenge_method"], len(fields["code_challenge"])) == ("S256", 43)
        assert fields["nonce"]
        assert fields["state"]
        assert "openid" in fields["scope"].split()
        # Someone who intercepted the code, without the verifier the console kept: refused by the provider.
        assert stack.provider.exchange(code, "a-guessed-verifier-" + "x" * 30, stack.callback) == 400
        assert stack.provider.exchange(code, "", stack.callback) == 400
        # The code is spent: the console cannot redeem it either, and says so in one line.
        spent = http.get("/console/oidc/callback", params={"code": code, "state": fields["state"]})
        assert spent.status_code == 403
        assert "Sign-in refused: the provider refused the code (invalid_grant" in spent.text
        # A fresh code delivered to the console: it sends the verifier whose S256 is the challenge it sent.
        code, fields = code_for(http, "vera")
        done = http.get("/console/oidc/callback", params={"code": code, "state": fields["state"]},
                        follow_redirects=False)
        assert (done.status_code, done.headers["location"]) == (303, "/console/")
    sent = stack.provider.token_requests[-1]
    assert s256(sent["form"]["code_verifier"]) == fields["code_challenge"]
    assert sent["basic"] is True  # client_secret_basic, the secret from TASUKI_OIDC_CLIENT_SECRET


def test_an_id_token_not_signed_by_the_providers_published_key_is_refused(stack: Stack, page: Page) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    stack.provider.forged_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    try:
        sign_in(page, stack, "ada")
        expect(page.locator(".error")).to_contain_text("Sign-in refused: the ID token is not valid")
    finally:
        stack.provider.forged_key = None
    assert not [c for c in page.context.cookies() if c["name"] == "tasuki_console"]


def test_a_callback_with_another_browsers_state_is_refused(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        code, fields = code_for(http, "ada")
    with httpx.Client(base_url=stack.url, timeout=10) as other:  # no sign-in cookie of its own
        answer = other.get("/console/oidc/callback", params={"code": code, "state": fields["state"]})
        assert answer.status_code == 403
        assert "the sign-in expired or began in another browser" in answer.text


def test_the_shared_token_is_refused_while_break_glass_is_off(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        assert 'name="token"' not in http.get("/console/signin").text
        answer = http.post("/console/signin", data={"token": "a-shared-token-that-must-not-work"},
                           follow_redirects=False)
        assert (answer.status_code, "tasuki_console" in answer.headers.get("set-cookie", "")) == (403, False)
        assert "auth.break_glass: false" in answer.text

