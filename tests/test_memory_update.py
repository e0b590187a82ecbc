"""Episodes from real context directories, 004's guarded incremental updates, and the first prompt's block."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.llm import make_provider
from agent.prompts import task_message
from contexts import ContextStore
from memory import Memory
from memory.episodes import episode_from_context, failed_commands, files_changed
from memory.prompt import HEADING, memory_block
from memory.recall import Hit
from memory.sqlite import SQLiteMemoryStore
from memory.update import judge
from tests.helpers.memory_support import NOW, episode
from tests.helpers.model_server import model_server
from worker.remembering import merge_repository, next_merge, record_episode, update_memories
from worker.settings_models import Settings

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
KEY = {"task_source": "github", "owner": "acme", "repo": "web", "task_type": "issue", "task_id": "12"}


def finished_context(base: Path) -> Path:
    store = ContextStore(base, fsync="never")
    ctx = store.create(KEY, {"model": "m", "context_length": 8000}, user="u", heartbeat=False,
                       extra_metadata={"request": {"task_key": KEY, "prompt": "Fix login"}})
    ctx.append_message("system", "You are a coding agent.")
    ctx.append_message("user", task_message(f"Fix the login ImportError; token {TOKEN}") + "\n\n" + HEADING + "\nold")
    ctx.append_tool("bash", {"command": "pytest -q"}, "success", 10, result="E ImportError: helper\nexit code: 1")
    ctx.append_tool("bash", {"command": "ls"}, "success", 10, result="a.py\nexit code: 0")
    ctx.append_tool("edit_file", {"path": "auth/login.py"}, "success", 5, result="ok")
    ctx.append_tool("write_file", {"path": "bad.py"}, "error", 5, error="outside the checkout")
    return ctx.finish("completed", result={"summary": "Fixed the import in auth/login.py", "branch": "tasuki/12-x"})


def test_an_episode_holds_the_fields_of_spec_13_masked(tmp_path: Path) -> None:
    path = finished_context(tmp_path / "contexts")
    e = episode_from_context(path, NOW)
    assert e.uuid == path.name
    assert (e.repository, e.thread, e.status) == ("github:acme/web", "github:acme/web#issue/12", "completed")
    assert e.task == "Fix the login ImportError; token [GITHUB_TOKEN]"  # without the memory block after </task>
    assert e.final_summary == "Fixed the import in auth/login.py"
    assert e.result == {"branch": "tasuki/12-x"}
    assert e.files_changed == ("auth/login.py",)
    assert e.failed_commands == ({"command": "pytest -q", "error": "E ImportError: helper\nexit code: 1"},)
    assert e.ended_at.tzinfo is not None


def test_failed_commands_and_files_changed_read_tool_records() -> None:
    records = [
        {"tool_name": "bash", "arguments": {"command": "make"}, "status": "error", "error": "timed out", "result": ""},
        {"tool_name": "bash", "arguments": {"command": "ok"}, "status": "success", "result": "exit code: 0"},
        {"tool_name": "edit_file", "arguments": {"path": "a.py"}, "status": "success"},
        {"tool_name": "edit_file", "arguments": {"path": "a.py"}, "status": "success"},
    ]
    assert failed_commands(records) == ({"command": "make", "error": "timed out"},)
    assert files_changed(records) == ("a.py",)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("", "answered nothing"),
        ("   \n", "answered nothing"),
        ("x" * 4000, "more than the bound"),
        ("MATERIAL " * 40, "repeats the material"),
    ],
)
def test_junk_answers_are_refused_with_a_reason(answer: str, reason: str) -> None:
    verdict = judge(answer, "MATERIAL " * 40, max_tokens=500)
    assert not verdict.accepted
    assert verdict.reason is not None
    assert reason in verdict.reason


def test_a_condensed_answer_is_accepted() -> None:
    verdict = judge("- tests: run pytest -q (u1)", "Task u1: a long story about " + "many things " * 50, 500)
    assert verdict.accepted
    assert verdict.text == "- tests: run pytest -q (u1)"


def settings_for(tmp_path: Path, **memory: object) -> Settings:
    return Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}, "memory": memory})


def test_record_episode_then_update_thread_and_repository_memory_through_the_replay_model(tmp_path: Path) -> None:
    s = settings_for(tmp_path, embedding_model="tasuki-replay-embed")
    path = finished_context(tmp_path / "contexts")
    recorded = record_episode(s, path.name, {"task_key": KEY}, "completed", path)
    assert recorded is not None
    assert recorded.next == "update"  # an embedding model is configured: the update_memory job embeds
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    with model_server([]) as server:
        s = s.model_copy(update={"llm": s.llm.model_copy(update={
            "openai": s.llm.openai.model_copy(update={"base_url": server.openai_base_url})})})
        provider = make_provider("openai", "m", 8000, server.openai_base_url, None)
        chat = lambda m: provider.chat(m, None).content  # noqa: E731
        outcome = update_memories(s, store, path.name, chat, NOW)
        batch = next_merge(s, store, "github:acme/web", {"github:acme/web#issue/12": path.name}, NOW)
        merged = merge_repository(s, store, "github:acme/web", batch.threads, chat, NOW)
        kinds = [r["kind"] for r in server.requests]
    assert outcome == {"uuid": path.name, "embedded": True, "thread": "first episode, as written",
                       "merge": ["github:acme/web", "github:acme/web#issue/12"]}
    assert (merged, batch.newest) == ("updated", path.name)
    # The embedding, then ONE model call: the repository merge (a thread's first episode needs no model).
    assert kinds == [None, "memory"]
    thread = store.memory("thread", "github:acme/web#issue/12")
    repo = store.memory("repository", "github:acme/web")
    assert thread is not None
    assert repo is not None
    assert "ImportError" in thread.text
    assert path.name in repo.text
    assert thread.sources == (path.name,)
    assert repo.sources == (path.name,)
    assert store.status().vectors == 1
    store.close()


def test_a_junk_answer_leaves_memory_unchanged_and_logs_why(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    e = episode("u1", task="Fix the login ImportError " * 5, thread="github:acme/web#issue/1", final_summary="fixed")
    store.add_episode(e)
    before = Memory("thread", e.thread, "- kept", NOW)
    store.put_memory(before, e.repository)
    with capture_logs() as logs:
        outcome = update_memories(s, store, "u1", lambda m: "", NOW)
        merged = merge_repository(s, store, e.repository, [before], lambda m: "", NOW)
    assert outcome["thread"] == "the model answered nothing"
    assert merged == "the model answered nothing"
    assert store.memory("thread", e.thread) == before
    assert store.memory("repository", e.repository) is None
    assert {entry["event"] for entry in logs} >= {"memory: thread memory left unchanged",
                                                   "memory: repository memory left unchanged"}
    store.close()


def test_record_episode_never_raises_on_a_damaged_store(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    (tmp_path / "memory.db").write_bytes(b"junk" * 500)
    path = finished_context(tmp_path / "contexts")
    with capture_logs() as logs:
        assert record_episode(s, path.name, {"task_key": KEY}, "completed", path) is None
    assert [e["event"] for e in logs] == ["memory: episode not recorded"]
    assert (tmp_path / "memory.db").read_bytes() == b"junk" * 500


def test_memory_block_keeps_priority_order_within_the_budget(tmp_path: Path) -> None:
    hit = Hit(episode("ep1", task="Fix login"), 1, None, 1.0, 0.0, 1.0, 0.5, 1.0, 0.9)
    repo = Memory("repository", "r", "- run pytest -q", NOW)
    thread = Memory("thread", "t", "- login fixed on branch x", NOW)
    text, use = memory_block([("AGENTS.md", "Use tabs.")], repo, thread, [hit], 2000)
    assert text.index("AGENTS.md") < text.index("run pytest") < text.index("login fixed") < text.index("ep1")
    assert "> Use tabs." in text
    assert "cannot change" in text
    assert (use.instruction_files, use.repository_memory, use.thread_memory, use.episodes) == (
        ["AGENTS.md"], True, True, ["ep1"])
    small, use = memory_block([("AGENTS.md", "word " * 2000)], repo, thread, [hit], 200)
    assert use.instruction_files == ["AGENTS.md"]
    assert not use.repository_memory
    assert "cut to fit" in small
    assert len(small) // 4 <= 200
    assert memory_block([], None, None, [], 100) [0] == ""


def test_episode_ended_at_comes_from_the_context(tmp_path: Path) -> None:
    path = finished_context(tmp_path / "contexts")
    e = episode_from_context(path, datetime(2000, 1, 1, tzinfo=UTC))
    assert e.ended_at.year >= 2024


def test_an_episode_with_nothing_learned_asks_no_model(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    store.add_episode(episode("u1", task="cancelled before it ran", status="cancelled"))
    asked: list[object] = []
    outcome = update_memories(settings_for(tmp_path), store, "u1", lambda m: asked.append(m) or "x", NOW)
    assert outcome["thread"] == "nothing to learn"
    assert outcome["merge"] is None
    assert asked == []
    store.close()


def running_context(base: Path) -> object:
    store = ContextStore(base, fsync="never")
    return store.create(KEY, {"model": "m", "context_length": 8000}, user="u", heartbeat=False)


def test_a_damaged_store_gives_a_first_prompt_without_memory_and_says_so_once(tmp_path: Path) -> None:
    from worker.remembering import first_prompt_memory

    (tmp_path / "memory.db").write_bytes(b"junk" * 500)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "AGENTS.md").write_text("Run make test.")
    ctx = running_context(tmp_path / "contexts")
    with capture_logs() as logs:
        text = first_prompt_memory(settings_for(tmp_path), ctx, checkout, {"task_key": KEY}, "Fix login", 8000)
    ctx.step_done()  # the first prompt's step writes what memory staged
    assert "Run make test." not in text  # the owner's instructions are no memory: a system message of their own
    note = ctx.read_state()["memory"]["note"]
    assert note.startswith("memory unavailable, the task goes on without it")
    assert "damaged" in note
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["memory"]
    ctx.detach()


def test_an_embedding_endpoint_that_refuses_leaves_bm25_recall_and_the_status_names_it(tmp_path: Path) -> None:
    import socket

    from worker.remembering import first_prompt_memory

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    settings = settings_for(tmp_path, embedding_model="tasuki-replay-embed")
    settings = settings.model_copy(update={"llm": settings.llm.model_copy(update={
        "openai": settings.llm.openai.model_copy(update={"base_url": dead})})})
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    store.add_episode(episode("old1", "github:acme/web", task="Fix login ImportError in auth/login.py",
                              final_summary="fixed the import"))
    store.close()
    ctx = running_context(tmp_path / "contexts")
    text = first_prompt_memory(settings, ctx, tmp_path, {"task_key": KEY}, "login ImportError", 8000)
    ctx.step_done()  # the first prompt's step writes what memory staged
    memory = ctx.read_state()["memory"]
    assert memory["episodes"] == ["old1"]  # BM25 still found it
    assert "old1" in text
    assert memory["note"].startswith("embedding failed, BM25 only")
    store = SQLiteMemoryStore(tmp_path / "memory.db")
    assert store.status().last_error is not None
    assert "embedding failed" in store.status().last_error
    store.close()
    ctx.detach()
