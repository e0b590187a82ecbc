"""`tasuki outcomes` as an operator runs it: the real command on a real outcome store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contexts.names import OUTCOMES_FILE
from contexts.outcomes import PullOutcome
from contexts.outcomes_sqlite import SQLiteOutcomeStore
from tests.helpers.cli_process import ok, one_line_error

T0 = datetime(2026, 3, 2, 9, tzinfo=UTC)  # a Monday
PRICING = '{"gpt-4o": {"input": 2.5, "output": 10.0}}'


def _opened(store: SQLiteOutcomeStore, n: int, repo: str, model: str, opened: datetime) -> str:
    pull = f"github/acme/{repo}/pull_request/{n}"
    store.opened(PullOutcome(pull, f"github/acme/{repo}/issue/{n}", f"github/acme/{repo}", n, f"https://x/{n}",
                             f"tasuki/{n}", model, f"u{n}", opened - timedelta(hours=1), opened))
    return pull


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("outcomes") / "contexts"
    base.mkdir()
    store = SQLiteOutcomeStore(base)
    for n, hours in ((1, 3), (2, 5)):  # api: two merged, 3 h and 5 h after their first task started
        pull = _opened(store, n, "api", "gpt-4o", T0)
        store.add_task(pull, f"u{n}", followup=False, tokens=1000, cost_usd=0.5)
        store.ended(pull, merged=True, at=T0 + timedelta(hours=hours - 1))
    pull = _opened(store, 3, "api", "gpt-4o", T0 + timedelta(days=7))
    store.add_task(pull, "u3", followup=False, tokens=1000, cost_usd=0.5)
    store.add_task(pull, "f3", followup=True, tokens=1000, cost_usd=0.5)
    store.ended(pull, merged=False, at=T0 + timedelta(days=8))
    _opened(store, 4, "web", "llama3", T0 + timedelta(days=7))  # still open
    store.close()
    return base


def tasuki(base: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    config = base.parent / "empty-config.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base), **extra})
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=60, check=False)


def report(base: Path, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(tasuki(base, "outcomes", *args, "--json")))
    return data


def test_totals_as_json(base: Path) -> None:
    total = report(base)["total"]
    assert (total["opened"], total["merged"], total["closed_unmerged"], total["still_open"]) == (4, 2, 1, 1)
    assert total["merge_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert total["cost_usd"] == pytest.approx(2.0)
    assert total["cost_per_merged_usd"] == pytest.approx(1.0)  # every request's spend / the merged ones
    assert total["median_time_to_merge_s"] == 4 * 3600
    assert total["followups_per_pr"] == 0.25


def test_grouped_and_selected(base: Path) -> None:
    by_repo = {row["key"]: row for row in report(base, "--by", "repo")["rows"]}
    assert (by_repo["github/acme/api"]["opened"], by_repo["github/acme/web"]["opened"]) == (3, 1)
    assert [(r["key"], r["opened"]) for r in report(base, "--by", "week")["rows"]] == [("2026-03-02", 2),
                                                                                       ("2026-03-09", 2)]
    assert {r["key"] for r in report(base, "--by", "model")["rows"]} == {"gpt-4o", "llama3"}
    assert report(base, "--repo", "github/acme/web")["total"]["opened"] == 1
    assert report(base, "--from", "2026-03-09")["total"]["opened"] == 2
    assert report(base, "--to", "2026-03-02")["total"]["merged"] == 2


def test_table(base: Path) -> None:
    text = ok(tasuki(base, "outcomes", "--by", "repo", "--repo", "github/acme/api", TASUKI__PRICING=PRICING))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["REPO", "OPENED", "MERGED"]
    assert lines[1].split()[:5] == ["github/acme/api", "3", "2", "1", "0"]
    assert "67 %" in lines[1]
    assert "$1.0000" in lines[1]  # 2 USD over its four tasks, two merged
    assert "4h 00m 00s" in lines[1]
    assert lines[2].startswith("total")
    # gpt-4o, the default model, has a built-in price; a local model has none.
    assert "no prices configured" in ok(tasuki(base, "outcomes", TASUKI__LLM__PROVIDER="ollama"))


def test_bad_input_is_one_line(base: Path) -> None:
    assert "--from '2026-13-01' is not a date" in one_line_error(tasuki(base, "outcomes", "--from", "2026-13-01"), 2)
    assert "is after --to" in one_line_error(tasuki(base, "outcomes", "--from", "2026-03-09", "--to", "2026-03-01"), 2)
    assert "not source/owner/name" in one_line_error(tasuki(base, "outcomes", "--repo", "acme/api"), 2)
    assert "invalid choice" in one_line_error(tasuki(base, "outcomes", "--by", "user"), 2)


def test_nothing_recorded_yet_creates_nothing(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    base.mkdir()
    assert ok(tasuki(base, "outcomes")).strip() == "No pull/merge request opened by a task in this selection."
    assert report(base)["rows"] == []
    assert not (base / OUTCOMES_FILE).exists()
