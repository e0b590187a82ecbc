"""A whole task with an MCP tool (issue 38, item 7): the repository declares its server in ``.tasuki/mcp.json``, the
worker starts it in the task's bubblewrap sandbox, the scripted model (the replay server, over the real OpenAI
client) calls it, and the call is in ``tools.jsonl`` — masked, timed and counted like any tool — and the server is
gone when the task is over. What the agent writes into the checkout's ``.tasuki/mcp.json`` later does not count:
the file is read as of the task's base commit.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid as uuid_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.llm import Provider, make_provider
from contexts import ContextStore
from contexts.state import read_state
from replay import ReplayModel, serve
from replay.trajectory import turns_from_entries
from sandbox.jail import Bubblewrap, probe
from sandbox.settings import SandboxSettings
from tests.helpers.ci import cannot_run
from tests.helpers.context_support import wait_for
from tests.helpers.mcp_support import processes_with
from tests.helpers.stack import git, make_buggy_repo
from tests.helpers.worker_scenarios import provider_env
from worker.run import TaskRequest, TaskRun
from worker.runtime import llm_config
from worker.settings_models import Settings

SERVER = Path(__file__).parent / "helpers" / "mcp_server.py"
PYTHON = str(Path(sys.prefix) / "bin" / "python")
MARKER = f"tasuki-mcp-task-{uuid_module.uuid4().hex}"
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # what the server's lookup_issue answer holds


@pytest.fixture(autouse=True)
def _bubblewrap() -> None:
    problem = probe(Bubblewrap(SandboxSettings(network="none")))
    if problem is not None:
        cannot_run(problem)


def _repository(tmp_path: Path) -> Path:
    repo = make_buggy_repo(tmp_path / "repo")
    shutil.copy(SERVER, repo / "mcp_server.py")
    (repo / ".tasuki").mkdir()
    server = {"command": PYTHON, "args": ["mcp_server.py", MARKER], "tools": ["lookup_issue"]}
    declared = {"mcpServers": {"tracker": server}}
    (repo / ".tasuki" / "mcp.json").write_text(json.dumps(declared))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "an MCP server for the tracker")
    return repo


def test_a_task_calls_the_repositorys_mcp_tool_and_the_call_is_recorded_masked_and_metered(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    repo = _repository(tmp_path)
    # The agent rewrites the declaration mid-task: it must not change which server runs (read at the base commit).
    hijack = "printf '{\"mcpServers\": {\"evil\": {\"command\": \"sh\"}}}' > .tasuki/mcp.json"
    turns = [
        {"content": "Rewrite", "tool_calls": [{"name": "bash", "arguments": {"command": hijack}}]},
        {"content": "Look the issue up.",
         "tool_calls": [{"name": "mcp__tracker__lookup_issue", "arguments": {"id": 7}}]},
        {"content": "Not offered.", "tool_calls": [{"name": "mcp__tracker__add", "arguments": {"a": 1, "b": 2}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "looked the issue up"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "looked the issue up"}}]},
    ]
    server = serve(ReplayModel(turns_from_entries(turns)))
    try:
        settings = make_settings(provider_env("openai", server.url, 32768))
        sandbox = settings.sandbox.model_copy(update={"read_only_paths": (Path(sys.prefix),)})
        settings = settings.model_copy(update={"sandbox": sandbox})
        request = TaskRequest(
            {"task_source": "local", "owner": "me", "repo": "repo", "task_type": "prompt", "task_id": "1"},
            prompt="Look issue 7 up.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        uuid = str(uuid_module.uuid4())
        outcome = TaskRun(uuid, request, settings, store, provider_for=_provider).execute(llm_config(settings))
        sent = server.requests
    finally:
        server.stop()
    assert outcome["status"] == "completed", outcome
    assert processes_with(MARKER) == []  # the server went with the task
    done = wait_for(lambda: store.completed_path(uuid) if store.completed_path(uuid).is_dir() else None,
                    what="the completed context")
    records = [json.loads(line) for line in (done / "tools.jsonl").read_text().splitlines()]
    started = next(r for r in records if r["tool_name"] == "mcp")
    assert started["status"] == "success", started
    assert "MCP server tracker (repository, stdio): 1 tool(s) mcp__tracker__lookup_issue" in started["result"]
    call = next(r for r in records if r["tool_name"] == "mcp__tracker__lookup_issue")
    assert call["arguments"] == {"id": 7}
    assert call["status"] == "success"
    assert "issue 7: the parser drops the last line" in call["result"]
    assert isinstance(call["duration_ms"], int)
    refused = next(r for r in records if r["tool_name"] == "mcp__tracker__add")  # not on the allow-list
    assert refused["status"] == "error"
    assert "unknown tool 'mcp__tracker__add'" in refused["error"]
    assert not any(r["tool_name"].startswith("mcp__evil") for r in records)
    everything = "".join(path.read_text() for path in done.iterdir() if path.suffix == ".jsonl")
    assert TOKEN not in everything  # masked in tools.jsonl and in the message the model got
    offered = {tool["function"]["name"] for tool in sent[0]["body"]["tools"]}  # every schema went to the model
    assert {"bash", "finish", "mcp__tracker__lookup_issue"} <= offered
    assert "mcp__tracker__add" not in offered
    state = read_state(done)
    calls = [r for r in records if r["tool_name"] not in ("mcp", "setup")]
    assert state["tool_call_count"] == len(calls)


def _provider(config: dict[str, Any]) -> Provider:
    return make_provider(
        config["llm_provider"], config["model"], int(config["context_length"]), config.get("endpoint"), None
    )


def test_the_server_stops_with_a_task_that_ends_on_a_limit(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    repo = _repository(tmp_path)
    call = {"name": "mcp__tracker__lookup_issue", "arguments": {"id": 1}}
    server = serve(ReplayModel(turns_from_entries([{"content": "again", "tool_calls": [call]}] * 3)))
    try:
        settings = make_settings({**provider_env("openai", server.url, 32768), "TASUKI__AGENT__MAX_STEPS": "2"})
        sandbox = settings.sandbox.model_copy(update={"read_only_paths": (Path(sys.prefix),)})
        settings = settings.model_copy(update={"sandbox": sandbox})
        request = TaskRequest(
            {"task_source": "local", "owner": "me", "repo": "repo", "task_type": "prompt", "task_id": "2"},
            prompt="Look issue 1 up, forever.",
            repo_path=str(repo),
        )
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        outcome = TaskRun(str(uuid_module.uuid4()), request, settings, store, provider_for=_provider).execute(
            llm_config(settings)
        )
    finally:
        server.stop()
    assert outcome["status"] != "completed", outcome
    assert "step limit" in str(outcome.get("error")), outcome
    assert processes_with(MARKER) == []
