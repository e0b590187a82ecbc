"""Models chosen per task, end to end (issue 37): the task API's ``model`` and a GitHub label ``coding agent:NAME``
choose the profile a real worker runs with (the replay model hears the profile's model; metadata.json, the usage
totals, ``tasuki context show`` and ``tasuki usage --by model`` name it), an unknown name is refused in one line, and
the default cost cap stops a priced task that no limit was configured for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from contexts.prices import BUILT_IN
from replay import ReplayServer
from tests.helpers.deliveries import github_delivery, load_payload
from tests.helpers.fake_forge import FakeForge
from tests.helpers.intake_server import IntakeServer, intake_server
from tests.helpers.model_server import model_server
from tests.helpers.stack import FIXED_CALC, Stack, fix_calc_trajectory, make_buggy_repo
from worker.settings import load_settings

pytestmark = pytest.mark.integration

FORGE_TOKEN = "profiles-forge-token-7c2e1b"
SECRET = "profiles-webhook-secret"
API_TOKEN = "profiles-api-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
PRICEY_INPUT = 1000.0  # USD per million tokens: three steps of the calc task (about 1,300 tokens each) pass 3 USD


@dataclass
class Fleet:
    root: Path
    stack: Stack
    forge: FakeForge
    intake: IntakeServer
    model: ReplayServer

    def metadata(self, uuid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.stack.contexts_dir / "completed" / uuid / "metadata.json").read_text())
        return data

    def state(self, uuid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.stack.contexts_dir / "completed" / uuid / "state.json").read_text())
        return data

    def tasuki(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
        result = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                                env={**env, **self.stack.env()}, cwd=Path(__file__).resolve().parents[1],
                                timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("profiles")
    with model_server(fix_calc_trajectory()) as model, FakeForge(root / "forge", FORGE_TOKEN).serve() as forge:
        forge.add_repo("Codertocat", "Hello-World", make_buggy_repo(root / "github-source"))
        endpoint = f"{model.url}/v1"
        profiles = {
            "cheap": {"provider": "openai", "model": "gpt-5-mini", "base_url": endpoint, "context_length": 32768},
            "big": {"provider": "openai", "model": "claude-sonnet-4-5", "base_url": endpoint, "context_length": 32768},
            "pricey": {"provider": "openai", "model": "pricey-model", "base_url": endpoint, "context_length": 32768},
        }
        stack = Stack(root, redis_url, model.url, env_overrides={
            "TASUKI__LLM__MODELS": json.dumps(profiles),
            "TASUKI__PRICING": json.dumps({"pricey-model": {"input": PRICEY_INPUT, "cached_input": PRICEY_INPUT,
                                                            "output": PRICEY_INPUT}}),
            "TASUKI__GITHUB__API_URL": forge.github_api_url,
            "TASUKI__API__ALLOWED_REPO_ROOTS": json.dumps([str(root / "repos")]),
            "GITHUB_TOKEN": FORGE_TOKEN,
        })
        try:
            stack.start_worker("profiles")
            env = {**stack.env(), "GITHUB_WEBHOOK_SECRET": SECRET, "TASUKI_API_TOKEN": API_TOKEN,
                   "TASUKI__AUTH__BREAK_GLASS": "true"}  # the legacy token (personal ones: test_api_tokens.py)
            with intake_server(load_settings(env=env)) as intake:
                yield Fleet(root, stack, forge, intake, model)
        finally:
            stack.stop()


def submit(fleet: Fleet, body: dict[str, Any]) -> httpx.Response:
    with fleet.intake.client(headers=AUTH) as client:
        return client.post("/api/tasks", json=body)


def served(fleet: Fleet, model: str, kind: str = "agent") -> list[dict[str, Any]]:
    """The usage of every answer the replay model gave to requests for ``model``."""
    return [r["usage"] for r in fleet.model.requests
            if r.get("usage") and r.get("kind") == kind and (r.get("body") or {}).get("model") == model]


def test_a_task_submitted_with_a_model_runs_with_that_profile_and_says_so(fleet: Fleet) -> None:
    repo = make_buggy_repo(fleet.root / "repos" / "calc")
    response = submit(fleet, {"repo_path": str(repo), "prompt": "Make the tests pass.", "model": "cheap"})
    assert response.status_code == 202, response.text
    uuid = response.json()["task_id"]
    assert fleet.stack.wait_finished(uuid)["status"] == "completed"

    config = fleet.metadata(uuid)["config"]
    assert (config["profile"], config["model"], config["context_length"]) == ("cheap", "gpt-5-mini", 32768)
    answers = served(fleet, "gpt-5-mini")
    assert len(answers) == 5  # every step of the calc task went to the profile's model
    state = fleet.stack.wait_until(
        lambda: (s := fleet.state(uuid))["usage"]["by_call"].get("agent gpt-5-mini", {}).get("calls") == 5 and s)
    bucket = state["usage"]["by_call"]["agent gpt-5-mini"]
    assert bucket["profile"] == "cheap"
    price = BUILT_IN["gpt-5-mini"]  # no pricing configured: the built-in table prices it
    expected = sum((u["prompt_tokens"] - u["cached_tokens"]) * price.input + u["cached_tokens"] * price.cached_input
                   + u["completion_tokens"] * price.output for u in answers) / 1e6
    assert bucket["cost_usd"] == pytest.approx(expected)
    assert bucket["tokens"] == sum(u["prompt_tokens"] + u["completion_tokens"] for u in answers)

    assert "Model: cheap (openai gpt-5-mini)" in fleet.tasuki("context", "show", uuid)
    rows = json.loads(fleet.tasuki("usage", "--by", "model", "--json"))["rows"]
    assert any(row["key"] == "cheap: gpt-5-mini" and row["cost_usd"] for row in rows), rows


def test_an_unknown_model_is_refused_with_one_line_and_nothing_is_queued(fleet: Fleet) -> None:
    repo = make_buggy_repo(fleet.root / "repos" / "unknown")
    before = len(fleet.model.requests)
    response = submit(fleet, {"repo_path": str(repo), "prompt": "Make the tests pass.", "model": "gpt-9"})
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem == {"loc": ["model"],
                       "msg": "no model profile 'gpt-9': the configured ones are big, cheap, openai, pricey"}
    assert fleet.intake.queued() == []
    assert len(fleet.model.requests) == before


def test_a_github_label_naming_a_profile_runs_the_task_with_it(fleet: Fleet) -> None:
    fleet.forge.add_item("Codertocat", "Hello-World", 1, "Spelling error in the README file", "Fix add().",
                         labels=["coding agent:big"])
    payload = load_payload("github/issues.labeled.json")
    payload["label"]["name"] = "coding agent:big"
    response = httpx.post(fleet.intake.url + "/webhooks/github", timeout=10,
                          content=(delivery := github_delivery("issues", payload, SECRET))[0], headers=delivery[1])
    assert response.status_code == 202, response.text
    uuid = response.json()["task_id"]
    assert fleet.stack.wait_finished(uuid)["status"] == "completed"

    config = fleet.metadata(uuid)["config"]
    assert (config["profile"], config["model"]) == ("big", "claude-sonnet-4-5")
    assert len(served(fleet, "claude-sonnet-4-5")) == 5
    branch = f"tasuki/1-{uuid[:8]}"
    assert fleet.forge.branch_file("Codertocat", "Hello-World", branch, "calc.py") == FIXED_CALC
    item = fleet.forge.item("Codertocat", "Hello-World", 1)
    fleet.stack.wait_until(lambda: item.comments and item.comments[-1].body.startswith("**Tasuki"),
                           what="the summary comment")
    assert item.labels == ["coding agent done"]  # the label that chose the model went with the trigger


def test_a_label_naming_an_unknown_profile_starts_nothing_and_the_issue_hears_why(fleet: Fleet) -> None:
    item = fleet.forge.add_item("Codertocat", "Hello-World", 2, "Another", "", labels=["coding agent:gpt-9"])
    payload = load_payload("github/issues.labeled.json")
    payload["label"]["name"] = "coding agent:gpt-9"
    payload["issue"]["number"] = 2
    delivery = github_delivery("issues", payload, SECRET)
    response = httpx.post(fleet.intake.url + "/webhooks/github", content=delivery[0], headers=delivery[1], timeout=10)
    assert response.status_code == 200
    why = "no model profile 'gpt-9': the configured ones are big, cheap, openai, pricey"
    assert response.json() == {"status": "ignored", "reason": why}
    fleet.stack.wait_until(lambda: item.comments, 30, "the reply on the issue")
    assert [c.body for c in item.comments] == [f"Tasuki did not start this task: {why}."]
    assert item.labels == ["coding agent:gpt-9"]  # no task took it up


def test_the_default_cost_cap_stops_a_task_whose_model_has_a_price(fleet: Fleet) -> None:
    repo = make_buggy_repo(fleet.root / "repos" / "pricey")
    response = submit(fleet, {"repo_path": str(repo), "prompt": "Make the tests pass.", "model": "pricey"})
    assert response.status_code == 202, response.text
    uuid = response.json()["task_id"]
    stopped = fleet.stack.wait_finished(uuid)

    state = fleet.state(uuid)
    assert stopped["status"] == "failed", state
    assert state["reason"] == "budget"
    answers = served(fleet, "pricey-model")
    spent = [sum(u["prompt_tokens"] + u["completion_tokens"] for u in answers[:n]) * PRICEY_INPUT / 1e6
             for n in range(1, len(answers) + 1)]
    assert spent[-1] >= 3.0 > ([0.0, *spent][-2])  # it stopped at the first step that reached the cap, not later
    assert state["llm_call_count"] == len(answers) < len(fix_calc_trajectory())
    assert state["error"] == f"budget: the task cost ${spent[-1]:.4f}, limits.task_cost is $3.0000"
