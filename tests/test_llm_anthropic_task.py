"""A whole task on a profile ``provider: anthropic``: TaskRun in this process, the fake Messages API over HTTP
(:mod:`replay.anthropic_api`), real git and the real sandbox. The fake refuses what the API refuses and computes
cache reads and writes from the breakpoints, so a task that completes here sent valid requests, and the usage it
recorded is what the breakpoints earned."""

from __future__ import annotations

import itertools
import json
import uuid as uuid_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contexts import ContextStore
from replay import ReplayModel
from replay.anthropic_api import serve_anthropic
from replay.trajectory import turns_from_entries
from tests.helpers.ci import bubblewrap_here
from tests.helpers.schemas import read_jsonl_lines, validate_context_dir
from tests.helpers.stack import fix_calc_trajectory, make_buggy_repo
from worker.run import TaskRequest, TaskRun
from worker.runtime import llm_config, provider_for
from worker.settings_models import Settings

pytestmark = pytest.mark.integration
MODEL = "claude-sonnet-4-5"


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


def run_on_claude(
    tmp_path: Path, make_settings: Callable[..., Settings], profile: dict[str, Any]
) -> tuple[dict[str, Any], Path, list[dict[str, Any]]]:
    """The calc fix as one task on the profile ``claude``; its outcome, context directory and the fake's log."""
    repo = make_buggy_repo(tmp_path / "repo")
    with serve_anthropic(ReplayModel(turns_from_entries(fix_calc_trajectory()))) as fake:
        models = {"claude": {"provider": "anthropic", "model": MODEL, "base_url": fake.url, **profile}}
        settings = make_settings({"TASUKI__LLM__MODELS": json.dumps(models), "TASUKI__LLM__DEFAULT": "claude"})
        uuid = str(uuid_module.uuid4())
        request = TaskRequest(
            {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt", "task_id": uuid[:8]},
            prompt="Fix the failing test.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        outcome = TaskRun(
            uuid, request, settings, store, provider_for=lambda config: provider_for(config, settings)
        ).execute(llm_config(settings))
        requests = fake.requests
    directory = store.completed_path(uuid)
    validate_context_dir(directory)
    return outcome, directory, requests


def test_a_task_on_an_anthropic_profile_completes_reading_each_step_from_the_cache(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    outcome, directory, requests = run_on_claude(tmp_path, make_settings, {"context_length": 200_000})

    assert outcome["status"] == "completed", outcome
    assert outcome["summary"] == "Fix add(): it subtracted."
    assert [(r["status"], r["kind"]) for r in requests] == [(200, "agent")] * 5
    config = json.loads((directory / "metadata.json").read_text())["config"]
    assert (config["profile"], config["llm_provider"], config["model"]) == ("claude", "anthropic", MODEL)
    prompts = [r["prompt_tokens"] for r in requests]
    reads = [r["usage"]["cache_read_input_tokens"] for r in requests]
    writes = [r["usage"]["cache_creation_input_tokens"] for r in requests]
    # Tasuki's system prompt and tools pass Sonnet's 1,024-token minimum: step 0 writes, every later step reads
    # all of the step before it and writes only its own new messages.
    assert reads == [0, *prompts[:-1]]
    assert writes == [prompts[0]] + [after - before for before, after in itertools.pairwise(prompts)]
    usage = json.loads((directory / "state.json").read_text())["usage"]
    assert (usage["prompt_tokens"], usage["cached_tokens"], usage["cache_write_tokens"]) == (
        sum(prompts),
        sum(reads),
        sum(writes),
    )
    replies = [r for r in read_jsonl_lines(directory / "messages.jsonl") if r["role"] == "assistant"]
    assert [r["usage"]["cached_tokens"] for r in replies] == reads


def test_a_task_with_extended_thinking_keeps_it_on_every_step(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    profile = {"context_length": 200_000, "thinking_tokens": 2048}
    outcome, directory, requests = run_on_claude(tmp_path, make_settings, profile)

    assert outcome["status"] == "completed", outcome
    assert all(r["status"] == 200 for r in requests)  # the fake refuses a turn whose signed thinking was dropped
    assert [r["body"].get("thinking") for r in requests] == [{"type": "enabled", "budget_tokens": 2048}] * 5
    replies = [r for r in read_jsonl_lines(directory / "messages.jsonl") if r["role"] == "assistant"]
    assert all(r["thinking"].startswith(f"Turn {n}:") for n, r in enumerate(replies))
    for n, body in enumerate(r["body"] for r in requests[1:]):
        # each step's newest assistant turn starts with the blocks its reply carried, as recorded
        assert body["messages"][-2]["content"][:1] == replies[n]["reasoning"]["items"]
    # the thinking settings stay the same, so every step still reads the one before it
    reads = [r["usage"]["cache_read_input_tokens"] for r in requests]
    assert reads == [0, *[r["prompt_tokens"] for r in requests[:-1]]]
