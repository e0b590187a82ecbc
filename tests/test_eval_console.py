"""The console's eval pages (issue 39): the runs list, a run's report with its comparison, and a line per task that
links to the task's context page; hostile row names are escaped; an unknown run or a name that is a path is a 404."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from console.app import create_console
from contexts import ContextStore
from evals.rundir import RunDir, TaskKey
from worker.settings_models import Settings

TOKEN = "eval-console-token"
UUID_A = "aaaaaaaa-1111-4111-8111-111111111111"


@pytest.fixture
def http(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true",
                              "TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var")})
    run = RunDir(tmp_path / "var" / "evals" / "nightly")
    run.start({"name": "nightly", "set_hash": "h", "rows": ["r1", "<b>r2</b>"], "profiles": ["big", "small"],
               "attempts": 1, "created_at": "2026-12-06T10:00:00+00:00"})
    common = {"status": "completed", "grade": None, "branch": None, "steps": 3, "tool_calls": 2, "tokens": 1200,
              "cost_usd": 0.02, "wall_s": 12.5, "error": None}
    run.submitted(TaskKey("r1", "big", 1), UUID_A)
    run.record({**TaskKey("r1", "big", 1).to_json(), **common, "uuid": UUID_A, "resolved": True, "reason": None})
    run.record({**TaskKey("r1", "small", 1).to_json(), **common, "uuid": None, "resolved": False,
                "reason": "environment error", "error": "no clone of acme/calc"})
    run.record({**TaskKey("<b>r2</b>", "big", 1).to_json(), **common, "uuid": "bbbbbbbb-2222-4222-8222-222222222222",
                "resolved": False, "reason": "no change"})
    app = create_console(settings, ContextStore(tmp_path / "contexts"))
    with TestClient(app, base_url="http://testserver") as client:
        assert client.post("/signin", data={"token": TOKEN}, follow_redirects=False).status_code == 303
        yield client


def test_the_runs_page_lists_each_run_with_its_figures(http: TestClient) -> None:
    page = http.get("/evals")
    assert page.status_code == 200
    assert '<a href="/evals/nightly">nightly</a>' in page.text
    assert "3/4" in page.text  # tasks finished
    assert "big 1/2, small 0/1" in page.text


def test_a_run_page_shows_the_report_and_links_each_task_to_its_context(http: TestClient) -> None:
    page = http.get("/evals/nightly").text
    assert f'<a href="/tasks/{UUID_A}"><code>aaaaaaaa</code></a>' in page
    assert "&lt;b&gt;r2&lt;/b&gt;" in page
    assert "<b>r2</b>" not in page
    assert "no clone of acme/calc" in page  # the task that never started says why
    assert 'id="eval-comparison">big vs small over 1 rows: wins 1, losses 0, both 0, neither 0; ' \
           "exact McNemar p = 1</p>" in page
    assert "environment error 1" in page
    assert "50.0%" in page  # big: 1 of 2


def test_an_unknown_run_or_a_path_is_a_404_page(http: TestClient) -> None:
    assert http.get("/evals/nope").status_code == 404
    assert http.get("/evals/..%2F..%2Fetc").status_code == 404


def test_the_eval_pages_need_a_session(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    settings = make_settings({"TASUKI__CONSOLE__TOKEN": TOKEN, "TASUKI__AUTH__BREAK_GLASS": "true",
                              "TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var")})
    with TestClient(create_console(settings, ContextStore(tmp_path / "c"))) as client:
        assert client.get("/evals", follow_redirects=False).status_code == 303
