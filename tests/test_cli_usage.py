"""`tasuki usage`, `tasuki usage rebuild` and the spend in `tasuki stats`, as an operator runs them: the real
command on a real store (and real Redis for the rebuild)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from contexts import ContextStore
from contexts.clock import utc_now
from contexts.usage import Usage
from tests.helpers.cli_process import ok, one_line_error
from worker.metering import Meter
from worker.settings_models import Settings
from worker.spend import repo_spent, user_key

PRICING = '{"gpt-4o": {"input": 2.5, "cached_input": 1.25, "output": 10.0}}'
LOCAL = {"TASUKI__LLM__PROVIDER": "ollama"}  # no configured model has a price: "no prices configured"


def _context(base: Path, when: datetime, repo: str, user: str, calls: list[tuple[Usage, float | None]]) -> None:
    store = ContextStore(base, fsync="never", clock=lambda: when)
    key = {"task_source": "github", "owner": "acme", "repo": repo, "task_type": "issue", "task_id": "1"}
    ctx = store.create(key, {"provider": "openai", "model": "gpt-4o"}, user=user, heartbeat=False)
    for usage, cost in calls:
        ctx.update_state(usage=[(usage, cost)])
    ctx.finish("completed")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("usage") / "contexts"
    today = utc_now()
    _context(base, datetime(2024, 3, 1, 9, tzinfo=UTC), "api", "ann", [
        (Usage("agent", "gpt-4o", 1000, 100, 400), 0.004),
        (Usage("summary", "gpt-4o", 500, 50), 0.00175),
    ])
    _context(base, datetime(2024, 3, 2, 9, tzinfo=UTC), "web", "bob", [(Usage("agent", "llama3", 3000, 300), None)])
    _context(base, today, "api", "bob", [(Usage("agent", "gpt-4o", 2000, 200), 0.007)])
    return base


def tasuki(base: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    config = base.parent / "empty-config.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base), **extra})
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=60, check=False)


def report(base: Path, *args: str, **extra: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(tasuki(base, "usage", *args, "--json", **extra)))
    return data


def test_usage_by_repository_user_model_and_day_from_the_contexts(base: Path) -> None:
    by_repo = report(base, TASUKI__PRICING=PRICING)
    assert [(r["key"], r["tasks"], r["tokens"]) for r in by_repo["rows"]] == [
        ("github/acme/api", 2, 1650 + 2200), ("github/acme/web", 1, 3300)]
    assert by_repo["rows"][0]["cost_usd"] == pytest.approx(0.01275)
    assert by_repo["rows"][1]["cost_usd"] is None  # llama3 has no price
    by_model = report(base, "--by", "model")
    assert {r["key"]: r["tokens"] for r in by_model["rows"]} == {"gpt-4o": 3850, "llama3": 3300}
    march = report(base, "--by", "day", "--from", "2024-03-01", "--to", "2024-03-31")
    assert [(r["key"], r["tokens"]) for r in march["rows"]] == [("2024-03-01", 1650), ("2024-03-02", 3300)]
    bob = report(base, "--by", "user", "--user", "bob", "--repo", "github/acme/api")
    assert [(r["key"], r["tokens"]) for r in bob["rows"]] == [("bob", 2200)]


def test_the_report_holds_spend_recorded_after_a_task_ended_and_the_spend_of_running_tasks(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    _context(base, datetime(2024, 3, 1, 9, tzinfo=UTC), "api", "ann", [(Usage("agent", "gpt-4o", 1000, 100), None)])
    [ended] = (base / "completed").iterdir()
    settings = Settings.model_validate({"contexts": {"base_dir": str(base)}})
    Meter(settings, "github/acme/api").record_finished(ended, [Usage("memory", "gpt-4o", 500, 50)])  # a memory job
    key = {"task_source": "github", "owner": "acme", "repo": "web", "task_type": "issue", "task_id": "2"}
    running = ContextStore(base, fsync="never").create(key, {"model": "gpt-4o"}, user="bob", heartbeat=False)
    running.update_state(usage=[(Usage("agent", "gpt-4o", 200, 20), None)])

    by_user = report(base, "--by", "user")

    assert {r["key"]: r["tokens"] for r in by_user["rows"]} == {"ann": 1100 + 550, "bob": 220}
    running.detach()


def test_usage_says_no_prices_configured_and_refuses_a_malformed_day(base: Path) -> None:
    text = ok(tasuki(base, "usage", "--by", "repo", **LOCAL))
    assert "github/acme/api" in text
    assert "no prices configured" in text
    # gpt-4o, the default model, has a built-in price: the unpriced model's row says so.
    assert "no price for this model" in ok(tasuki(base, "usage", "--by", "repo"))
    assert "$0.0127" in ok(tasuki(base, "usage", TASUKI__PRICING=PRICING))  # the total
    assert "--from" in one_line_error(tasuki(base, "usage", "--from", "March"), 2)


def test_stats_shows_tokens_and_cost(base: Path) -> None:
    text = ok(tasuki(base, "stats", TASUKI__PRICING=PRICING))
    assert "Spend:\n  - Tokens: 7,150\n  - Cost: $0.0127\n" in text
    assert "  - Cost: no prices configured\n" in ok(tasuki(base, "stats", **LOCAL))


def test_usage_rebuild_puts_todays_counters_back_after_redis_lost_them(
    base: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    text = ok(tasuki(base, "usage", "rebuild", TASUKI__BROKER__URL=redis_url, TASUKI__PRICING=PRICING))
    assert "1 repositories, 1 users" in text
    now = utc_now()
    assert repo_spent(redis_client, "github/acme/api", now) == (2200, pytest.approx(0.007))
    assert repo_spent(redis_client, "github/acme/web", now) == (0, 0.0)  # nothing spent today
    assert redis_client.get(user_key(now.date().isoformat(), "bob")) == "1"
    assert redis_client.ttl(user_key(now.date().isoformat(), "bob")) > 0  # the rebuilt keys expire too


def test_context_show_gives_the_tasks_tokens_and_cost(base: Path) -> None:
    listed = json.loads(ok(tasuki(base, "context", "list", "--json")))
    uuid = next(item["uuid"] for item in listed if item["user"] == "ann")
    text = ok(tasuki(base, "context", "show", uuid, TASUKI__PRICING=PRICING))
    assert "  Total tokens: 1,650 (prompt 1,500, of which cached 400; completion 150)\n  Cost: $0.0057\n" in text
    assert "  Cost: no prices configured\n" in ok(tasuki(base, "context", "show", uuid, **LOCAL))
