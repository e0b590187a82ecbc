"""The console's rules that need no browser (SPEC §15): sessions expire, sign-in is rate-limited, the cookie is
Secure behind HTTPS, Cancel needs its CSRF token, the fleet says "no broker", the timeline reads records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from console.app import create_console
from console.fleet import RecentEndings
from console.server import broker_client
from console.timeline import TokenTally, entries, token_chart
from contexts import ContextStore
from contexts.context import Context
from contexts.state import read_state
from tests.helpers.console_contexts import running_task
from worker.settings_models import Settings

TOKEN = "unit-console-token"


@dataclass
class Console:
    http: TestClient
    store: ContextStore
    task: Context
    clock: list[float]
    cancelled: list[str]


@pytest.fixture
def console(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[Console]:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true",
                              "TASUKI__CONSOLE__SESSION_LIFETIME_S": "600",
                              "TASUKI__CONSOLE__SIGNIN_ATTEMPTS_PER_MINUTE": "3"})
    store = ContextStore(tmp_path / "contexts")
    task = running_task(store)
    clock = [1_800_000_000.0]
    cancelled: list[str] = []

    def cancel(uuid: str) -> str:
        cancelled.append(uuid)
        return "cancel requested"

    dead_broker = broker_client("redis://127.0.0.1:1/0")
    app = create_console(settings, store, client=dead_broker, cancel=cancel,
                         clock=lambda: clock[0])
    with TestClient(app, base_url="http://testserver") as http:
        yield Console(http, store, task, clock, cancelled)
    task.release()


def sign_in(http: TestClient, token: str = TOKEN) -> int:
    return http.post("/signin", data={"token": token}, follow_redirects=False).status_code


def test_a_session_ends_after_its_lifetime(console: Console) -> None:
    assert sign_in(console.http) == 303
    assert console.http.get("/", follow_redirects=False).status_code == 200
    console.clock[0] += 601
    answer = console.http.get("/", follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (303, "/signin")


def test_sign_in_attempts_over_the_limit_are_refused_even_with_the_right_token(console: Console) -> None:
    assert [sign_in(console.http, "wrong") for _ in range(3)] == [401, 401, 401]
    assert sign_in(console.http) == 429
    console.clock[0] += 61
    assert sign_in(console.http) == 303


def test_the_session_cookie_is_secure_only_behind_https(console: Console) -> None:
    plain = console.http.post("/signin", data={"token": TOKEN}, follow_redirects=False).headers["set-cookie"]
    tls = console.http.post("https://testserver/signin", data={"token": TOKEN},
                            follow_redirects=False).headers["set-cookie"]
    assert {"httponly", "samesite=lax", "max-age=600"} <= {part.strip() for part in plain.lower().split(";")}
    assert "secure" not in plain.lower()
    assert "secure" in tls.lower()


def test_cancel_without_the_sessions_csrf_token_is_refused(console: Console) -> None:
    assert sign_in(console.http) == 303
    uuid = console.task.uuid
    assert console.http.post(f"/tasks/{uuid}/cancel", data={}).status_code == 403
    assert console.http.post(f"/tasks/{uuid}/cancel", data={"csrf": "guessed"}).status_code == 403
    assert console.cancelled == []
    page = console.http.get(f"/tasks/{uuid}").text
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    answer = console.http.post(f"/tasks/{uuid}/cancel", data={"csrf": csrf}, follow_redirects=False)
    assert (answer.status_code, console.cancelled) == (303, [uuid])
    assert read_state(console.store.running_path(uuid)).get("cancel_requested") is not True  # the canceller's job


def test_the_fleet_without_redis_says_no_broker_and_still_lists_running_tasks(console: Console) -> None:
    assert sign_in(console.http) == 303
    fragment = console.http.get("/fleet/live").text
    assert 'id="no-broker"' in fragment
    assert console.task.uuid in fragment


def test_the_task_page_lists_the_hosts_its_egress_allow_list_refused(console: Console) -> None:
    refused = {"host": "<b>evil.example</b>", "port": 443, "count": 2, "first_at": "2027-01-15T08:00:00.000000Z",
               "last_at": "2027-01-15T08:00:01.000000Z"}
    console.task.update_state(egress_refused=[refused])
    assert sign_in(console.http) == 303
    page = console.http.get(f"/tasks/{console.task.uuid}").text
    assert 'id="egress-refused"' in page
    assert "<code>&lt;b&gt;evil.example&lt;/b&gt;:443</code> &times;2, last at 2027-01-15T08:00:01.000000Z" in page


def test_a_path_that_is_not_a_context_uuid_is_a_404_page(console: Console, tmp_path: Path) -> None:
    assert sign_in(console.http) == 303
    outside = tmp_path / "outside" / "11111111-1111-4111-8111-111111111111"
    outside.mkdir(parents=True)
    (console.store.base_dir / "completed" / outside.name).symlink_to(outside)
    for path in ("/tasks/..%2F..%2Fetc", "/tasks/11111111-1111-4111-8111-111111111111",
                 "/tasks/22222222-2222-4222-8222-222222222222", "/tasks/11111111-1111-4111-8111-111111111111/events"):
        assert console.http.get(path).status_code == 404, path


def test_tool_runs_carry_their_exit_code_and_the_chart_estimates_unreported_prompts() -> None:
    messages = [
        {"seq": 1, "role": "user", "content": "fix it", "token_count": 100},
        {"seq": 2, "role": "assistant", "content": "", "token_count": 20, "tool_calls": [
            {"id": "c1", "function": {"name": "bash", "arguments": '{"command": "make"}'}}]},
        {"seq": 3, "role": "tool", "content": "cut", "token_count": 30, "tool_call_id": "c1", "tool_name": "bash"},
        {"seq": 4, "role": "assistant", "content": "done", "token_count": 5,
         "usage": {"kind": "agent", "model": "m", "prompt_tokens": 400, "completion_tokens": 5, "cached_tokens": 0,
                   "cost_usd": None}},
    ]
    tools = [{"seq": 1, "tool_name": "bash", "arguments": {"command": "make"}, "status": "success",
              "duration_ms": 12, "result": "boom\nexit code: 2", "tool_call_id": "c1"}]
    timeline = entries(messages, tools, [{"summary_id": 1, "start_seq": 1, "end_seq": 2, "summary": "s"}])
    assert [e.kind for e in timeline] == ["message", "message", "compression", "message", "message"]
    run = timeline[3].run
    assert run is not None
    assert (run.exit_code, run.duration_ms, run.output) == (2, 12, "boom\nexit code: 2")
    chart = token_chart(messages, [], {"context_length": 1000, "compression_threshold": 0.7})
    assert (chart.prompt_tokens, chart.window, chart.threshold, chart.estimated) == ([100, 400], 1000, 700, True)


def test_the_points_a_live_page_adds_are_those_the_page_would_be_drawn_with() -> None:
    messages: list[dict[str, object]] = [{"seq": 1, "role": "system", "content": "s", "token_count": 50}]
    for n in range(2, 12, 2):
        usage = {"prompt_tokens": 100 * n} if n % 4 else None  # some calls report their prompt, some do not
        messages += [{"seq": n, "role": "assistant", "content": "", "token_count": 10, "usage": usage},
                     {"seq": n + 1, "role": "tool", "content": "out", "token_count": 40 * n}]
    config = {"context_length": 4000, "compression_threshold": 0.75}
    drawn = token_chart(messages, [], config)
    live = TokenTally(config)
    live.add_messages(messages[:5])  # what the page showed when it was loaded

    added = live.add_messages(messages[5:7]) + live.add_messages(messages[7:])  # what the stream sent since

    assert drawn.prompt_tokens[:2] + added == drawn.prompt_tokens
    assert len(added) == 3
    assert live.chart() == drawn


def test_the_fleets_endings_of_the_day_are_recounted_once_their_count_is_older_than_its_ttl(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts")
    endings = RecentEndings(ttl_s=30)
    now = datetime.now(UTC)
    running_task(store, 1).finish("completed")
    assert endings(store.index, now) == {"completed": 1}
    running_task(store, 2).finish("failed")
    assert endings(store.index, now + timedelta(seconds=29)) == {"completed": 1}
    assert endings(store.index, now + timedelta(seconds=30)) == {"completed": 1, "failed": 1}


def test_an_empty_console_token_lets_nobody_in(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": "", "TASUKI__AUTH__BREAK_GLASS": "true"})
    assert settings.console_token() is None
    store = ContextStore(tmp_path / "contexts")
    forced = settings.model_copy(update={"console": settings.console.model_copy(update={"token": SecretStr("")})})
    assert forced.console_token() is None
    with TestClient(create_console(forced, store)) as http:
        assert sign_in(http, "") == 403


def test_without_a_provider_or_break_glass_the_shared_token_signs_nobody_in_and_the_page_says_what_to_configure(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN})
    with TestClient(create_console(settings, ContextStore(tmp_path / "contexts"))) as http:
        page = http.get("/signin").text
        assert "Sign-in is not configured: set auth.oidc.issuer and auth.oidc.client_id" in page
        assert 'name="token"' not in page
        refused = http.post("/signin", data={"token": TOKEN}, follow_redirects=False)
        assert (refused.status_code, "tasuki_console" in refused.headers.get("set-cookie", "")) == (403, False)
        assert refused.text.startswith("Sign-in is not configured")
        assert "\n" not in refused.text.strip()
        assert http.get("/signin/oidc").status_code == 404


def test_every_answer_carries_the_security_headers_and_only_static_files_may_be_cached(console: Console) -> None:
    answers = {
        "sign-in page": console.http.get("/signin"),
        "redirect to sign-in": console.http.get("/tasks", follow_redirects=False),
        "refused stream": console.http.get(f"/tasks/{console.task.uuid}/events"),
        "static file": console.http.get("/static/console.js"),
    }
    for what, answer in answers.items():
        assert answer.headers["content-security-policy"].startswith("default-src 'none'"), what
        assert answer.headers["x-content-type-options"] == "nosniff", what
        assert answer.headers["x-frame-options"] == "DENY", what
        assert ("cache-control" not in answer.headers) == (what == "static file"), what


def test_heartbeat_ages_on_the_fleet_page_are_judged_by_redis_clock_not_this_hosts(
    tmp_path: Path, redis_client: object
) -> None:
    """Heartbeats are stamped with Redis's time (SPEC §4): a console on a host two minutes ahead must not show a
    fresh heartbeat as two minutes old."""
    import redis as redis_module

    from console.fleet import read_fleet
    from worker.names import HEARTBEATS_KEY

    assert isinstance(redis_client, redis_module.Redis)
    store = ContextStore(tmp_path / "contexts", fsync="never")
    ctx = running_task(store, 1)
    seconds, micros = redis_client.time()
    redis_client.zadd(HEARTBEATS_KEY, {ctx.uuid: seconds + micros / 1e6})
    try:
        ahead = datetime.now(UTC) + timedelta(minutes=2)
        fleet = read_fleet(store, store.index, redis_client, ahead)
    finally:
        redis_client.zrem(HEARTBEATS_KEY, ctx.uuid)
    [row] = [r for r in fleet.running if r.uuid == ctx.uuid]
    assert row.heartbeat_age_s is not None
    assert row.heartbeat_age_s < 60  # by this host's clock it would be 120 s


def test_the_session_cookie_is_secure_when_the_public_url_is_https(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true",
                              "TASUKI__CONSOLE__PUBLIC_URL": "https://tasuki.example.com/console"})
    with TestClient(create_console(settings, ContextStore(tmp_path / "contexts"))) as http:
        cookie = http.post("/signin", data={"token": TOKEN}, follow_redirects=False).headers["set-cookie"]
    assert {"secure", "httponly", "samesite=lax"} <= {part.strip() for part in cookie.lower().split(";")}


def test_a_provider_that_cannot_be_reached_is_one_line_on_the_sign_in_page(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings({"TASUKI__AUTH__OIDC__ISSUER": "http://127.0.0.1:1/realms/x",
                              "TASUKI__AUTH__OIDC__CLIENT_ID": "tasuki"})
    with TestClient(create_console(settings, ContextStore(tmp_path / "contexts"))) as http:
        assert 'id="signin-oidc"' in http.get("/signin").text
        answer = http.get("/signin/oidc", follow_redirects=False)
    assert answer.status_code == 502
    assert "the provider at http://127.0.0.1:1/realms/x cannot be reached: ConnectError" in answer.text


def test_a_break_glass_session_ends_when_break_glass_is_turned_off_or_its_token_changes(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    store = ContextStore(tmp_path / "contexts")
    env = {"TASUKI_CONSOLE_SESSION_SECRET": "one-secret-for-every-console-below", "TASUKI__CONSOLE__TOKEN": TOKEN,
           "TASUKI__AUTH__BREAK_GLASS": "true"}
    with TestClient(create_console(make_settings(env), store)) as http:
        assert sign_in(http) == 303
        cookie = http.cookies["tasuki_console"]
    for changed in ({"TASUKI__AUTH__BREAK_GLASS": "false"}, {"TASUKI__CONSOLE__TOKEN": "a-new-token"}, {}):
        with TestClient(create_console(make_settings({**env, **changed}), store),
                        cookies={"tasuki_console": cookie}) as http:
            answer = http.get("/tasks", follow_redirects=False)
            assert answer.status_code == (200 if not changed else 303), changed
