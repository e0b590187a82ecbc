"""The console end to end in a real browser (SPEC §15): Debian's chromium driven by Playwright against the
intake's app (console enabled) on a real uvicorn server, real Redis, contexts written through the real store.

One browser for the whole module; each test gets a fresh page (a new browser context).
Screenshots of the three pages go to ``$TASUKI_SCREENSHOTS`` when it is set (``docs/`` for the README).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import redis

from contexts import ContextStore
from contexts.clock import utc_now
from contexts.context import Context
from contexts.outcomes import PullOutcome
from contexts.outcomes_sqlite import SQLiteOutcomeStore
from contexts.state import read_state
from tests.conftest import TEST_KEY_PATTERNS, delete_keys
from tests.helpers.ci import cannot_run
from tests.helpers.console_contexts import (
    HOSTILE_TITLE,
    RAW_SECRET,
    finished_task,
    repository_with_branch,
    running_task,
    step,
)
from tests.helpers.intake_server import intake_server
from worker.names import ALERTS_KEY, CANCEL_PREFIX, HEARTBEATS_KEY
from worker.settings import load_settings

pytest.importorskip("playwright")
from playwright.sync_api import Browser, Page, expect, sync_playwright

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "console-test-token-0123456789"
# As python-svc.md's "Known to work": without the background-networking flags chromium keeps dialling out.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One browser for the module: Debian's chromium by its path (Playwright's download does not work here).

    Module-scoped, not pytest-playwright's session-long one: Playwright's driver and its event loop would stay
    in this process for the rest of the session, and later tests that fork (the index's writers) hang in it.
    """
    if not CHROMIUM.exists():
        cannot_run(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Stack:
    url: str
    store: ContextStore
    live: Context  # running, held by the test: steps are appended from here
    to_cancel: Context
    finished: str
    redis: redis.Redis

    def page_url(self, path: str) -> str:
        return f"{self.url}/console{path}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("console")
    (root / "config.yaml").write_text("")
    settings = load_settings(config_path=root / "config.yaml", env={
        "TASUKI__CONTEXTS__BASE_DIR": str(root / "contexts"),
        "TASUKI__CONTEXTS__WORKSPACES_DIR": str(root / "workspaces"),
        "TASUKI__BROKER__URL": redis_url,
        "TASUKI__CONSOLE__ENABLED": "true",
        "TASUKI__CONSOLE__TOKEN": TOKEN,
        "TASUKI__AUTH__BREAK_GLASS": "true",
        "TASUKI__CONSOLE__SIGNIN_ATTEMPTS_PER_MINUTE": "100",
    })
    store = ContextStore(root / "contexts")
    live = running_task(store, 1)
    to_cancel = running_task(store, 3, user="carol")
    finished = finished_task(store, repository_with_branch(root, "tasuki/2-feedface"), "tasuki/2-feedface")
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.zadd(HEARTBEATS_KEY, {live.uuid: time.time() - 4, to_cancel.uuid: time.time() - 12})
    client.hset(ALERTS_KEY, mapping={"alert_disk": "1.0", "alert_running": "0.0"})
    try:
        with intake_server(settings, client) as server:
            yield Stack(server.url, store, live, to_cancel, finished, client)
    finally:
        for ctx in (live, to_cancel):
            ctx.release()
        delete_keys(client, TEST_KEY_PATTERNS)
        client.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    yield page
    context.close()


def sign_in(page: Page, stack: Stack) -> None:
    page.goto(stack.page_url("/signin"))
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Fleet")
    expect(page.locator("#break-glass")).to_contain_text("break-glass token")  # every page says so
    expect(page.locator("#who")).to_have_text("break-glass · admin")


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    target = os.environ.get("TASUKI_SCREENSHOTS")
    if target:
        shutil.copy(shot, Path(target) / name)


def test_every_page_and_stream_refuses_without_a_session(stack: Stack, page: Page) -> None:
    pages = ["/", "/tasks", f"/tasks/{stack.live.uuid}", f"/tasks/{stack.finished}"]
    streams = ["/fleet/live", f"/tasks/{stack.live.uuid}/events"]
    for cookies in ({}, {"tasuki_console": "forged.value.here"}):
        with httpx.Client(base_url=stack.url, timeout=10, cookies=cookies) as http:
            for path in pages:
                answer = http.get(f"/console{path}")
                assert (answer.status_code, answer.headers.get("location")) == (303, "/console/signin"), path
            for path in streams:
                assert http.get(f"/console{path}").status_code == 401, path
            assert http.post(f"/console/tasks/{stack.to_cancel.uuid}/cancel").status_code == 401
    page.goto(stack.page_url(f"/tasks/{stack.live.uuid}"))
    expect(page.locator("#token")).to_have_attribute("type", "password")
    assert page.locator("input").count() == 1
    assert read_state(stack.store.running_path(stack.to_cancel.uuid)).get("cancel_requested") is not True


def test_sign_in_opens_the_fleet_with_running_tasks_queues_and_alerts(stack: Stack, page: Page, tmp_path: Path) -> None:
    page.goto(stack.page_url("/signin"))
    page.fill("#token", "not the token")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("not the console token")
    sign_in(page, stack)
    cookie = next(c for c in page.context.cookies() if c["name"] == "tasuki_console")
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["expires"] > time.time()) == (True, "Lax", True)
    running = page.locator("table.running tbody tr")
    expect(running).to_have_count(2)
    expect(running.first).to_contain_text("octo/hello")
    expect(running.first).to_contain_text("1,800 / 8,192")
    expect(page.locator(".figures")).to_contain_text("queued on tasks")
    expect(page.locator(".alerts")).to_contain_text("disk: warning")
    screenshot(page, "console-fleet.png", tmp_path)
    stack.redis.hset(ALERTS_KEY, "alert_running", "2.0")  # the page updates itself (htmx under the CSP)
    expect(page.locator(".alerts")).to_contain_text("running: critical", timeout=10_000)
    page.click("nav >> text=Tasks")
    expect(page.locator("table.tasks tbody tr")).to_have_count(3)
    page.select_option("select[name=status]", "completed")
    page.click("form.filters button")
    expect(page.locator("table.tasks tbody tr")).to_have_count(1)
    expect(page.locator("table.tasks tbody tr")).to_contain_text(stack.finished[:8])
    page.goto(stack.page_url("/tasks"))
    screenshot(page, "console-tasks.png", tmp_path)


def test_no_raw_secret_and_no_injected_markup_reaches_any_page(stack: Stack, page: Page) -> None:
    sign_in(page, stack)
    for path in ("/", "/tasks", f"/tasks/{stack.live.uuid}", f"/tasks/{stack.finished}"):
        answer = page.goto(stack.page_url(path))
        assert answer is not None
        assert "script-src 'self'" in answer.headers["content-security-policy"]
        assert RAW_SECRET not in page.content()
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img").count() == 0
        assert page.locator("a[href^='javascript']").count() == 0
    page.goto(stack.page_url(f"/tasks/{stack.live.uuid}"))
    expect(page.locator("#issue-title")).to_have_text(HOSTILE_TITLE)
    expect(page.locator("#timeline")).to_contain_text("[GITHUB_TOKEN]")


def test_fleet_page_shows_the_outcomes_panel_with_its_weekly_chart(stack: Stack, page: Page, tmp_path: Path) -> None:
    sign_in(page, stack)
    expect(page.locator("#no-outcomes")).to_be_visible()  # nothing recorded yet
    store = SQLiteOutcomeStore(stack.store.base_dir)
    now = utc_now()
    for n, (weeks_ago, merged) in enumerate([(0, True), (0, False), (2, True), (2, None)], start=1):
        opened = now - timedelta(weeks=weeks_ago, hours=2)
        pull = f"github/octo/hello/pull_request/{n}"
        store.opened(PullOutcome(pull, f"github/octo/hello/issue/{n}", "github/octo/hello", n, f"https://x/{n}",
                                 f"tasuki/{n}", "gpt-4o", f"u{n}", opened - timedelta(hours=1), opened))
        store.add_task(pull, f"u{n}", followup=False, tokens=1000, cost_usd=0.75)
        if merged is not None:
            store.ended(pull, merged=merged, at=opened + timedelta(hours=1))
    store.close()

    page.goto(stack.page_url("/"))
    panel = page.locator("#outcomes")
    expect(panel).to_contain_text("4opened")
    expect(panel).to_contain_text("2merged")
    expect(panel).to_contain_text("1closed unmerged")
    expect(page.locator("#merge-rate")).to_have_text("67 %")
    expect(page.locator("#cost-per-merged")).to_have_text("$1.50")  # 3 USD over two merged
    chart = page.locator("#outcomes-chart")
    expect(chart).to_have_attribute("data-weeks", "12")
    expect(chart).to_have_attribute("data-drawn", "true")  # drawn by the page's script under the CSP
    expect(page.locator("#outcomes-chart canvas")).to_be_visible()
    expect(page.locator("#outcomes-chart .u-legend")).to_contain_text("closed unmerged")
    screenshot(page, "console-outcomes.png", tmp_path)


def test_task_page_shows_the_token_chart_the_compression_and_the_branch_diff(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    sign_in(page, stack)
    page.goto(stack.page_url(f"/tasks/{stack.finished}"))
    expect(page.locator("#token-chart canvas")).to_be_visible()
    expect(page.locator(".entry.compression")).to_contain_text("replaced messages 3–")
    expect(page.locator("#diff")).to_contain_text("+    return 42  # fixed by the agent")
    expect(page.locator(".entry.tool").first).to_contain_text("exit code 1")
    screenshot(page, "console-task.png", tmp_path)


def test_a_running_task_page_appends_each_new_step_live_and_stops_when_it_ends(stack: Stack, page: Page) -> None:
    sign_in(page, stack)
    page.goto(stack.page_url(f"/tasks/{stack.live.uuid}"))
    entries = page.locator("#timeline > li")
    expect(entries).to_have_count(6)
    expect(page.locator("#token-chart")).to_have_attribute("data-steps", "2")
    step(stack.live, 3, prompt_tokens=2700, output="written while the page was open")
    expect(page.locator("#timeline")).to_contain_text("written while the page was open", timeout=10_000)
    expect(entries).to_have_count(8)
    expect(page.locator("#token-chart")).to_have_attribute("data-steps", "3", timeout=10_000)  # the chart follows
    expect(page.locator("#token-chart canvas")).to_be_visible()
    stack.live.finish("completed")
    expect(page.locator("#live")).to_contain_text("ended: completed", timeout=10_000)


def test_cancel_asks_a_running_task_to_stop(stack: Stack, page: Page) -> None:
    sign_in(page, stack)
    page.goto(stack.page_url(f"/tasks/{stack.to_cancel.uuid}"))
    page.click("#cancel")
    expect(page.locator("#cancel")).to_have_text("Cancel requested")
    expect(page.locator("#cancel")).to_be_disabled()
    assert read_state(stack.store.running_path(stack.to_cancel.uuid))["cancel_requested"] is True
    assert stack.redis.exists(CANCEL_PREFIX + stack.to_cancel.uuid)
