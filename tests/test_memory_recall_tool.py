"""The recall tool: a detail a summary dropped comes back; what the prompt still holds does not; episodes too."""

from __future__ import annotations

from pathlib import Path

from agent.tools import Workspace, run_tool
from contexts import CompressionPolicy, ContextStore
from memory.sqlite import SQLiteMemoryStore
from tests.helpers.memory_support import episode
from worker.remembering import task_recall
from worker.settings_models import Settings

KEY = {"task_source": "github", "owner": "acme", "repo": "web", "task_type": "issue", "task_id": "3"}
DETAIL = "E   AssertionError: parse_date('2024-02-30') returned 2024-03-01 in tests/test_dates.py:41"


def test_a_detail_the_summary_dropped_comes_back_and_the_prompt_is_not_repeated(tmp_path: Path) -> None:
    settings = Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}})
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    store.add_episode(episode("earlier-1", "github:acme/web", task="parse_date accepts February 30",
                              final_summary="parse_date now validates the day of month"))
    store.add_episode(episode("elsewhere", "github:other/web", task="parse_date accepts February 30"))
    store.close()
    ctx = ContextStore(tmp_path / "contexts", fsync="never").create(KEY, {"context_length": 8000}, heartbeat=False)
    ctx.append_message("system", "You are a coding agent.")
    ctx.append_message("user", "Fix parse_date.")
    ctx.append_message("tool", DETAIL, tool_name="bash")
    for n in range(12):
        ctx.append_message("assistant", f"step {n}: reading more files")
    ctx.append_message("assistant", "The newest step mentions parse_date too.")
    ctx.compress(lambda _prev, _span: "Looked at the date parser.", CompressionPolicy(keep_recent=5, min_messages=5))
    in_prompt = {str(m.get("content")) for m in ctx.build_prompt(8000, 500)}
    assert DETAIL not in in_prompt

    answer = task_recall(settings, ctx, {"task_key": KEY}, "AssertionError parse_date", in_prompt)

    assert DETAIL in answer
    assert "The newest step mentions" not in answer  # still in the prompt
    assert "task earlier-1" in answer
    assert "elsewhere" not in answer
    ctx.detach()


def test_the_recall_tool_without_memory_is_an_error_for_the_model(tmp_path: Path) -> None:
    result = run_tool(Workspace(tmp_path), "recall", {"query": "x"}, bash_timeout_s=5, max_output_chars=100)
    assert (result.status, result.error) == ("error", "memory is not available in this task")
    result = run_tool(Workspace(tmp_path), "recall", {"query": "x"}, bash_timeout_s=5, max_output_chars=4,
                      recall=lambda q: f"found {q}")
    assert (result.status, result.output) == ("success", "foun")
