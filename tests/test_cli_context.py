"""`tasuki context list|show` and `tasuki stats` as an operator runs them: real processes on a real store."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contexts import CompressionPolicy, Context, ContextStore
from contexts.retention import gzip_context
from tests.helpers.cli_process import ok, one_line_error

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # what a tool output might leak; masked on disk
RUN_TIMEOUT_S = 60


class Clock:
    """A clock the test moves by hand, so durations and creation days are exact."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@dataclass(frozen=True)
class Store:
    base: Path
    completed: str  # github/notfolder/coding_agent issue #27, compressed once, 2024-01-15
    failed: str  # gitlab/acme/api issue #5 of user2, gzipped, 2024-02-10
    timeout: str  # github/acme/web merge_request #9 of user3, 2024-01-20
    running: str  # local/me/tool issue #1, still held, 2024-03-01


def _store(base: Path, clock: Clock) -> ContextStore:
    return ContextStore(base, fsync="never", clock=clock)


def _create(store: ContextStore, source: str, owner: str, repo: str, kind: str, number: int, user: str) -> Context:
    key = {"task_source": source, "owner": owner, "repo": repo, "task_type": kind, "task_id": number}
    return store.create(key, {"provider": "openai", "model": "gpt-4o"}, user=user, heartbeat=False)


def _completed_context(base: Path) -> str:
    clock = Clock(datetime(2024, 1, 15, 10, 30, tzinfo=UTC))
    ctx = _create(_store(base, clock), "github", "notfolder", "coding_agent", "issue", 27, "notfolder")
    ctx.append_message("system", "You are a coding agent.\nFollow the rules.")
    ctx.append_message("user", "Fix the login bug " + "in detail " * 30)
    for step in range(5):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a.py"}'}}
        ctx.append_message("assistant", None, tool_calls=[call])
        ctx.append_message("tool", f"line {step} of a.py " * 20, tool_call_id=f"c{step}", tool_name="read_file")
    ctx.append_message("assistant", "Token seen: " + TOKEN)
    ctx.append_message("tool", "\x1b[31mred\x1b[0m output", tool_name="bash")
    ctx.append_message("user", "Commit the changes")
    ctx.append_message("tool", "Success", tool_name="github_create_commit")
    ctx.append_message("assistant", '{"done": true, "comment": "Completed"}')
    summary = ctx.compress(
        lambda _prev, _span: "Fixed authentication bug by reading a.py.\nThen more.", CompressionPolicy(keep_recent=5)
    )
    assert summary is not None
    ctx.append_tool("read_file", {"path": "a.py"}, "success", 234, result="...")
    ctx.append_tool("github_create_branch", {"branch": "fix-bug"}, "error", 123, error="Branch already exists")
    ctx.update_state(status="processing", add={"llm_call_count": 45, "tool_call_count": 12, "total_tokens_used": 45678})
    clock.advance(minutes=15, seconds=23)
    ctx.finish("completed")
    return ctx.uuid


def _other_contexts(base: Path) -> tuple[str, str, str]:
    clock = Clock(datetime(2024, 2, 10, 9, 0, tzinfo=UTC))
    failed = _create(_store(base, clock), "gitlab", "acme", "api", "issue", 5, "user2")
    failed.append_message("user", "Add an endpoint")
    failed.update_state(add={"total_tokens_used": 1000})
    clock.advance(minutes=2)
    failed.finish("failed", error="LLM provider unavailable\nafter 5 retries")
    gzip_context(failed.path)

    clock = Clock(datetime(2024, 1, 20, 8, 0, tzinfo=UTC))
    timeout = _create(_store(base, clock), "github", "acme", "web", "merge_request", 9, "user3")
    clock.advance(hours=4)
    timeout.finish("timeout", error="time limit")

    clock = Clock(datetime(2024, 3, 1, 12, 0, tzinfo=UTC))
    running = _create(_store(base, clock), "local", "me", "tool", "issue", 1, "notfolder")
    running.append_message("user", "Refactor the parser")
    running.update_state(status="processing")
    running.detach()  # leaves the lock, as a worker that is still running would
    return failed.uuid, timeout.uuid, running.uuid


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    base = tmp_path_factory.mktemp("store") / "contexts"
    completed = _completed_context(base)
    failed, timeout, running = _other_contexts(base)
    return Store(base, completed, failed, timeout, running)


def _env(base: Path, **extra: str) -> dict[str, str]:
    """A configuration file of its own (empty: defaults), so no command notes that it runs on defaults."""
    config = base.parent / "empty-config.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASUKI", "COLUMNS"))}
    return {**env, "TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base), "COLUMNS": "80", **extra}


def _command() -> list[str]:
    """The installed console script, as an operator runs it; `python -m cli.main` without one."""
    script = Path(sys.executable).with_name("tasuki")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]


def _empty_dir(base: Path) -> Path:
    """A working directory without a config.yaml (and without a `contexts` directory to shadow the package)."""
    cwd = base.parent / "cwd"
    cwd.mkdir(exist_ok=True)
    return cwd


def tasuki(base: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `tasuki ARGS` against the store at `base`."""
    return subprocess.run(
        [*_command(), *args],
        capture_output=True,
        text=True,
        env=_env(base, **env),
        cwd=_empty_dir(base),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


# -- context show ----------------------------------------------------------------------------------


def test_show_prints_header_statistics_last_messages_and_summaries(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed))
    assert f"Task UUID: {store.completed}" in text
    assert "Status: completed" in text
    assert "Repository: github/notfolder/coding_agent" in text
    assert "Task: issue #27" in text
    assert "Started: 2024-01-15 10:30:00 UTC" in text
    assert "Completed: 2024-01-15 10:45:23 UTC" in text
    assert "Duration: 15m 23s" in text
    assert "Attempt: 1" in text
    assert "  LLM calls: 45\n  Tool calls: 12\n  Total tokens: 45,678\n  Compressions: 1" in text
    assert "Messages: 17 (showing last 10)" in text
    assert '  [17] assistant: {"done": true, "comment": "Completed"}' in text
    assert "  [16] tool: github_create_commit -> Success" in text
    assert "  [15] user: Commit the changes" in text
    assert "[7] " not in text  # older than the last ten
    assert "Summaries: 1\n  [1] seq 3-12: Fixed authentication bug by reading a.py.…" in text
    assert "Tool calls: 2" not in text  # only with --tools


def test_show_never_prints_secrets_or_terminal_escapes(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed, "--messages"))
    assert TOKEN not in text
    assert "Token seen: [GITHUB_TOKEN]" in text
    assert "\x1b" not in text
    assert "\\x1b[31mred" in text


def test_show_lines_fit_the_terminal_width(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed, "--tools", COLUMNS="60"))
    message_lines = [line for line in text.splitlines() if line.startswith("  [")]
    assert message_lines
    assert all(len(line) <= 60 for line in message_lines)
    assert any(line.endswith("…") for line in message_lines)


def test_show_messages_prints_every_message_in_full(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed, "--messages"))
    assert "Messages: 17\n" in text
    assert "  [1] system  2024-01-15 10:30:00 UTC  " in text
    assert "      You are a coding agent.\n      Follow the rules." in text
    assert '-> read_file({"path":"a.py"})' in text


def test_show_summaries_prints_full_summary_text_and_tokens(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed, "--summaries"))
    assert "  [1] seq 3-12  " in text
    assert "tokens (ratio " in text
    assert "      Fixed authentication bug by reading a.py.\n      Then more." in text


def test_show_tools_lists_tool_calls_with_status_duration_and_error(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.completed, "--tools"))
    assert "Tool calls: 2\n" in text
    assert '  [1] read_file success 234ms {"path":"a.py"}' in text
    assert '  [2] github_create_branch error 123ms {"branch":"fix-bug"}\n      error: Branch already exists' in text


def test_show_reads_gzipped_contexts(store: Store) -> None:
    assert (store.base / "completed" / store.failed / "messages.jsonl.gz").exists()
    text = ok(tasuki(store.base, "context", "show", store.failed))
    assert "Status: failed" in text
    assert "Error: LLM provider unavailable…" in text
    assert "Messages: 1\n  [1] user: Add an endpoint" in text


def test_show_running_context_shows_elapsed_time(store: Store) -> None:
    text = ok(tasuki(store.base, "context", "show", store.running.upper()))
    assert f"Task UUID: {store.running}" in text
    assert "Status: processing" in text
    assert "Completed: -" in text
    assert "so far" in text


def test_show_json_is_the_machine_readable_detail(store: Store) -> None:
    data = json.loads(ok(tasuki(store.base, "context", "show", store.completed, "--json")))
    assert data["context"]["uuid"] == store.completed
    assert data["context"]["duration_s"] == 923.0
    assert data["metadata"]["task_key"]["task_id"] == "27"
    assert data["state"]["status"] == "completed"
    assert [m["seq"] for m in data["messages"]] == list(range(8, 18))
    assert data["summaries"][0]["end_seq"] == 12
    assert TOKEN not in json.dumps(data)


# -- context list ----------------------------------------------------------------------------------


def test_list_shows_a_table_newest_first(store: Store) -> None:
    lines = ok(tasuki(store.base, "context", "list")).splitlines()
    assert lines[0].split() == ["UUID", "STATUS", "TASK", "USER", "CREATED", "(UTC)", "DURATION", "TOKENS"]
    assert [line.split()[0] for line in lines[1:]] == [store.running, store.failed, store.timeout, store.completed]
    completed = lines[4].split()
    assert completed[1:6] == ["completed", "github/notfolder/coding_agent#27", "notfolder", "2024-01-15", "10:30"]
    assert completed[6:] == ["15m", "23s", "45,678"]
    assert "gitlab/acme/api#5" in lines[2]


def test_list_filters_by_status_and_user(store: Store) -> None:
    assert [
        line.split()[0] for line in ok(tasuki(store.base, "context", "list", "--user", "notfolder")).splitlines()[1:]
    ] == [
        store.running,
        store.completed,
    ]
    data = json.loads(ok(tasuki(store.base, "context", "list", "--status", "failed", "--json")))
    assert [item["uuid"] for item in data] == [store.failed]
    assert data[0]["user"] == "user2"
    assert ok(tasuki(store.base, "context", "list", "--user", "nobody")) == "No contexts.\n"


def test_list_shows_one_page_and_says_on_stderr_how_many_match(store: Store) -> None:
    first = tasuki(store.base, "context", "list", "--limit", "2")
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == [store.running, store.failed]
    assert first.stderr == "tasuki: note: 2 of 4 contexts shown (--offset 0); --limit and --offset page\n"

    second = tasuki(store.base, "context", "list", "--limit", "2", "--offset", "2", "--json")
    assert [item["uuid"] for item in json.loads(second.stdout)] == [store.timeout, store.completed]


def test_reindex_rebuilds_the_index_from_every_context_directory(store: Store) -> None:
    assert ok(tasuki(store.base, "context", "reindex")) == f"indexed 4 contexts into {store.base / 'index.sqlite3'}\n"
    assert len(ok(tasuki(store.base, "context", "list")).splitlines()) == 5


# -- stats -----------------------------------------------------------------------------------------


def test_stats_prints_the_storage_report(store: Store) -> None:
    text = ok(tasuki(store.base, "stats"))
    assert text.startswith("Context Storage Statistics\n==========================\n")
    assert "Total contexts: 4\n  - Running: 1\n  - Completed: 3\n" in text
    assert "Disk usage:\n  - Running: " in text
    assert "Average per task:\n  - Messages: 5\n" in text  # (17 + 1 + 0 + 1) / 4
    assert "  - Tokens: 11,670\n" in text  # (45,678 + 1,000) / 4
    assert "  - Duration: 1h 25m 48s\n" in text  # (15m23s + 2m + 4h) / 3
    assert "  - Compressions: 0.2\n" in text
    assert "By user:\n  - notfolder: 2 tasks (50%)\n  - user2: 1 task (25%)\n  - user3: 1 task (25%)" in text
    assert "Tasks:" not in text


def test_stats_filters_report_and_list_the_matching_tasks(store: Store) -> None:
    text = ok(tasuki(store.base, "stats", "--from", "2024-01-01", "--to", "2024-01-31"))
    assert "Filter: from=2024-01-01, to=2024-01-31" in text
    assert "Total contexts: 2\n" in text
    assert "Disk usage (whole store):" in text
    tasks = text.split("Tasks: 2\n", 1)[1].splitlines()
    assert [line.split()[0] for line in tasks[1:]] == [store.timeout, store.completed]

    summary = ok(tasuki(store.base, "stats", "--status", "failed", "--user", "user2", "--summary"))
    assert "Total contexts: 1\n" in summary
    assert "  - user2: 1 task (100%)" in summary
    assert "Tasks:" not in summary


def test_stats_json(store: Store) -> None:
    data: dict[str, Any] = json.loads(ok(tasuki(store.base, "stats", "--user", "notfolder", "--json")))
    assert data["filters"] == {"user": "notfolder"}
    assert (data["total"], data["running"], data["completed"]) == (2, 1, 1)
    assert [item["uuid"] for item in data["contexts"]] == [store.running, store.completed]
    assert data["disk_completed_bytes"] > 0


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["context", "show", "00000000-0000-4000-8000-000000000000"], 1, "no context 00000000-0000-4000-8000"),
        (["context", "show", "not-a-uuid"], 2, "not a context UUID: 'not-a-uuid'"),
        (["context", "show", "../../etc"], 2, "not a context UUID: '../../etc'"),
        (["stats", "--from", "2024-13-01"], 2, "--from '2024-13-01' is not a date: month must be in 1..12"),
        (["stats", "--to", "yesterday"], 2, "--to 'yesterday' is not a date: expected YYYY-MM-DD"),
        (["stats", "--from", "2024-02-01", "--to", "2024-01-01"], 2, "--from 2024-02-01 is after --to 2024-01-01"),
        (["context", "list", "--status", "sleeping"], 2, "invalid choice: 'sleeping'"),
        (["context", "list", "--colour"], 2, "unrecognized arguments: --colour"),
        (["context", "list", "--limit", "ten"], 2, "argument --limit: 'ten' is not a count"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(store: Store, args: list[str], code: int, says: str) -> None:
    assert says in one_line_error(tasuki(store.base, *args), code)


def test_bad_config_value_is_one_line_naming_the_variable(store: Store) -> None:
    line = one_line_error(tasuki(store.base, "context", "list", TASUKI__CONTEXTS__FSYNC="sometimes"), 2)
    assert "contexts.fsync" in line
    assert "TASUKI__CONTEXTS__FSYNC" in line


def test_missing_store_is_reported_not_created(tmp_path: Path) -> None:
    line = one_line_error(tasuki(tmp_path / "nowhere", "stats"), 1)
    assert "no context store at" in line
    assert not (tmp_path / "nowhere").exists()


def test_damaged_state_file_is_one_line(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    ctx = _create(ContextStore(base, fsync="never"), "local", "me", "tool", "issue", 3, "me")
    path = ctx.finish("failed")
    (path / "state.json").write_text('{"status": "fai')
    line = one_line_error(tasuki(base, "context", "show", ctx.uuid), 2)
    assert f"{ctx.uuid}/state.json: not valid JSON" in line  # names the damaged file


def test_context_symlinked_out_of_the_root_is_refused(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    uuid = "11111111-1111-4111-8111-111111111111"
    (store.base / "completed" / uuid).symlink_to(outside)
    try:
        line = one_line_error(tasuki(store.base, "context", "show", uuid), 1)
        listed = tasuki(store.base, "context", "list")
    finally:
        (store.base / "completed" / uuid).unlink()
    assert f"no context {uuid}" in line  # the store never treats a symlinked directory as a context
    assert uuid not in listed.stdout


def test_version_from_the_module_and_the_console_script(tmp_path: Path) -> None:
    for command in ([sys.executable, "-m", "cli.main"], _command()):
        result = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, cwd=tmp_path, timeout=RUN_TIMEOUT_S, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("tasuki ")


# -- follow ----------------------------------------------------------------------------------------


def _lines(stream: Any) -> Iterator[str]:
    yield from iter(stream.readline, "")


def test_follow_prints_new_messages_and_state_changes_until_the_context_finishes(tmp_path: Path) -> None:
    base = tmp_path / "contexts"
    ctx = _create(ContextStore(base, fsync="never"), "local", "me", "tool", "issue", 2, "me")
    ctx.append_message("user", "first")
    proc = subprocess.Popen(
        [*_command(), "context", "show", ctx.uuid, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(base),
        cwd=_empty_dir(base),
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in _lines(proc.stdout):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0))
            if text in line:
                return

    try:
        wait_for("[1] user: first")
        ctx.append_message("assistant", "second")
        wait_for("[2] assistant: second")
        ctx.update_state(status="compressing", add={"llm_call_count": 1})
        wait_for("-- compressing  step   1")  # state changes are followed too
        ctx.finish("completed")
        wait_for("Status: completed")
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    assert proc.stderr.read() == ""


def test_interrupting_follow_exits_130_without_a_traceback(store: Store) -> None:
    proc = subprocess.Popen(
        [*_command(), "context", "show", store.running, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(store.base),
        cwd=_empty_dir(store.base),
    )
    try:
        assert proc.stdout is not None
        for line in _lines(proc.stdout):
            if line.startswith("Summaries:"):  # the view is out; the process is polling for new messages
                break
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert err == ""
