"""How a task's environment is reported (SPEC §17): the progress comment's line, /metrics, the console's task page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import fakeredis
from starlette.testclient import TestClient

from console.app import create_console
from console.server import broker_client
from contexts import ContextStore
from tests.helpers.console_contexts import running_task
from webhooks.metrics import Metrics
from worker.bookkeeping import count_environment
from worker.environment import EnvironmentReport
from worker.forges.reporter import progress_body
from worker.settings_models import LabelSettings, Settings

TOKEN = "unit-console-token"
BUILT = EnvironmentReport(
    "built",
    ".tasuki/setup.sh",
    "0123456789abcdef0123456789abcdef",
    94.2,
    0,
    log_tail="Successfully installed tinypkg-1.0 <script>",
    created=(".venv/",),
)


def test_the_progress_comment_says_how_the_environment_came() -> None:
    restored = EnvironmentReport("restored", ".tasuki/setup.sh", "k" * 32, 1.83, 0)
    failed = EnvironmentReport("failed", ".tasuki/setup.sh", "k" * 32, 12.0, 3, log_tail="boom")
    timed_out = EnvironmentReport("failed", ".tasuki/setup.sh", "k" * 32, 1800.4, None, timed_out=True)
    state = {"status": "processing", "attempt": 1}
    lines = [
        progress_body("u", {**state, "environment": r.state()}, LabelSettings())
        for r in (restored, BUILT, failed, timed_out)
    ]
    assert "| Environment | restored in 1.8 s |" in lines[0]
    assert "| Environment | built in 94 s |" in lines[1]
    assert "| Environment | setup failed: exit code 3 after 12 s |" in lines[2]
    assert "| Environment | setup failed: timed out after 1800 s |" in lines[3]
    assert "Environment" not in progress_body("u", state, LabelSettings())


def test_metrics_count_builds_restores_and_failures_with_their_durations(
    make_settings: Callable[..., Settings],
) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    for outcome, seconds in (("built", 94.0), ("restored", 1.8), ("restored", 0.4), ("failed", 3.0), ("kept", 0.0)):
        count_environment(client, outcome, seconds)
    text = Metrics(make_settings(), client).render().decode()
    assert "tasuki_environment_builds_total 1.0" in text
    assert "tasuki_environment_restores_total 2.0" in text
    assert "tasuki_environment_failures_total 1.0" in text
    assert 'tasuki_environment_seconds_bucket{le="1.0",outcome="restored"} 1.0' in text
    assert 'tasuki_environment_seconds_bucket{le="5.0",outcome="restored"} 2.0' in text
    assert 'tasuki_environment_seconds_bucket{le="60.0",outcome="built"} 0.0' in text
    assert 'tasuki_environment_seconds_count{outcome="built"} 1.0' in text
    assert 'tasuki_environment_seconds_sum{outcome="restored"} 2.2' in text


def test_the_console_task_page_shows_the_setup_record(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true"})
    store = ContextStore(tmp_path / "contexts")
    task = running_task(store)
    task.append_tool(
        "setup",
        {"source": BUILT.source, "key": BUILT.key},
        "success",
        94200,
        result={"log_tail": BUILT.log_tail, "created": [".venv/"], "snapshot": ""},
    )
    task.update_state(environment=BUILT.state())
    app = create_console(
        settings,
        store,
        client=broker_client("redis://127.0.0.1:1/0"),
        cancel=lambda uuid: "",
        clock=lambda: 1_800_000_000.0,
    )
    try:
        with TestClient(app, base_url="http://testserver") as http:
            assert http.post("/signin", data={"token": TOKEN}, follow_redirects=False).status_code == 303
            page = http.get(f"/tasks/{task.uuid}").text
    finally:
        task.release()
    assert '<li id="environment-line">built in 94 s</li>' in page
    assert "<code>.tasuki/setup.sh</code>" in page
    assert "<code>.venv/</code>" in page
    assert "Successfully installed tinypkg-1.0 &lt;script&gt;" in page  # the log's tail, escaped
