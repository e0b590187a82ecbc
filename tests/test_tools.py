"""The agent's tools: confinement to the checkout, edits, bash in its own process group, output caps."""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.tools import TOOL_SCHEMAS, OutputCapture, ToolError, ToolResult, Workspace, cap_output, run_tool, shell
from agent.tools.dispatch import TOOLS, changes_checkout, check_arguments
from agent.tools.files import count_occurrences
from agent.tools.protocol import ToolOptions, ToolOutcome

MAX_CHARS = 400


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("outside secret\n")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (path / "README.md").write_text("hello\n")
    return path


@pytest.fixture
def workspace(repo: Path) -> Workspace:
    return Workspace(repo)


def call(workspace: Workspace, name: str, arguments: object, **overrides: Any) -> ToolResult:
    options: dict[str, Any] = {"bash_timeout_s": 30, "max_output_chars": MAX_CHARS, **overrides}
    return run_tool(workspace, name, arguments, **options)


def bash(workspace: Workspace, command: str, **overrides: Any) -> ToolResult:
    return call(workspace, "bash", {"command": command}, **overrides)


def process_is_gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet (PID 1 in a container may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The state follows the parenthesised command name, which may itself contain spaces.
            return handle.read().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except FileNotFoundError:
        return True


def wait_until_gone(pid: int, deadline_s: float = 10.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process_is_gone(pid):
            return True
        time.sleep(0.02)
    return process_is_gone(pid)


# --- confinement -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "a/../../outside/secret.txt", "..", "a/..", "/etc/passwd", "a\x00b", ""]
)
def test_paths_with_dotdot_absolute_nul_or_empty_are_refused(workspace: Workspace, path: str) -> None:
    with pytest.raises(ToolError):
        workspace.resolve(path)
    result = call(workspace, "read_file", {"path": path})
    assert result.status == "error"
    assert result.output.startswith("error: ")
    assert result.error is not None
    assert "\n" not in result.error


def test_relative_paths_resolve_inside_the_checkout(workspace: Workspace, repo: Path) -> None:
    assert workspace.resolve("README.md") == repo.resolve() / "README.md"
    assert workspace.resolve("./src//new.py") == repo.resolve() / "src" / "new.py"
    assert workspace.resolve(".") == repo.resolve()


def test_symlink_to_etc_is_refused_for_reading(workspace: Workspace, repo: Path) -> None:
    (repo / "etc").symlink_to("/etc")
    (repo / "passwd").symlink_to("/etc/passwd")
    for path in ("passwd", "etc/passwd", "etc/hostname"):
        result = call(workspace, "read_file", {"path": path})
        assert result.status == "error"
        assert "outside the repository" in result.output
        assert "root:" not in result.output


def test_symlinked_directory_escaping_the_checkout_is_refused(workspace: Workspace, repo: Path, outside: Path) -> None:
    (repo / "docs").mkdir()
    (repo / "docs" / "shared").symlink_to(outside)
    result = call(workspace, "read_file", {"path": "docs/shared/secret.txt"})
    assert result.status == "error"
    assert "outside secret" not in result.output
    written = call(workspace, "write_file", {"path": "docs/shared/new/planted.txt", "content": "x"})
    assert written.status == "error"
    assert not (outside / "new").exists()


def test_writing_through_a_symlink_that_points_outside_is_refused(
    workspace: Workspace, repo: Path, outside: Path
) -> None:
    (repo / "link.txt").symlink_to(outside / "secret.txt")
    (repo / "dangling.txt").symlink_to(outside / "created-by-agent.txt")
    for path in ("link.txt", "dangling.txt"):
        result = call(workspace, "write_file", {"path": path, "content": "overwritten"})
        assert result.status == "error", path
    edited = call(workspace, "edit_file", {"path": "link.txt", "old_string": "outside", "new_string": "x"})
    assert edited.status == "error"
    assert (outside / "secret.txt").read_text() == "outside secret\n"
    assert not (outside / "created-by-agent.txt").exists()


def test_symlink_inside_the_checkout_is_followed(workspace: Workspace, repo: Path) -> None:
    (repo / "alias.md").symlink_to("README.md")
    result = call(workspace, "write_file", {"path": "alias.md", "content": "via alias\n"})
    assert result.status == "success"
    assert (repo / "README.md").read_text() == "via alias\n"
    assert (repo / "alias.md").is_symlink()


def test_symlink_loop_is_an_error_not_an_exception(workspace: Workspace, repo: Path) -> None:
    (repo / "loop").symlink_to("loop")
    assert call(workspace, "read_file", {"path": "loop"}).status == "error"
    assert call(workspace, "write_file", {"path": "loop", "content": "x"}).status == "error"


@pytest.fixture(scope="module")
def tricky_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout full of symlinks, some pointing out of it."""
    base = tmp_path_factory.mktemp("property")
    (base / "outside").mkdir()
    root = base / "root"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "sub" / "file").write_text("x")
    (root / "out").symlink_to(base / "outside")
    (root / "etc").symlink_to("/etc")
    (root / "up").symlink_to("..")
    (root / "sub" / "back").symlink_to("../..")
    (root / "in").symlink_to("sub")
    (root / "dangling").symlink_to(base / "outside" / "missing")
    (root / "loop").symlink_to("loop")
    return root


_SEGMENTS = st.sampled_from(
    ["sub", "deep", "file", "out", "etc", "up", "back", "in", "dangling", "loop", ".", "..", "", "x", "passwd"]
)


_ANY_CHARACTER = st.characters(exclude_categories=())  # surrogates included: JSON can carry them


@settings(max_examples=400)
@given(path=st.one_of(st.lists(_SEGMENTS, max_size=6).map("/".join), st.text(_ANY_CHARACTER, max_size=40)))
def test_any_accepted_path_resolves_inside_the_root(tricky_root: Path, path: str) -> None:
    workspace = Workspace(tricky_root)
    try:
        resolved = workspace.resolve(path)
    except ToolError:
        return
    real_root = Path(os.path.realpath(tricky_root))
    assert Path(os.path.realpath(resolved)).is_relative_to(real_root)
    assert resolved.is_relative_to(real_root)


# --- files -------------------------------------------------------------------------------------------


def test_write_file_creates_parents_with_repository_modes(workspace: Workspace, repo: Path) -> None:
    result = call(workspace, "write_file", {"path": "src/pkg/mod.py", "content": "x = 1\n"})
    assert result.status == "success"
    assert result.output == "wrote 6 bytes to src/pkg/mod.py"
    assert (repo / "src" / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert stat.S_IMODE((repo / "src" / "pkg" / "mod.py").stat().st_mode) == 0o644
    assert [p.name for p in (repo / "src" / "pkg").iterdir()] == ["mod.py"]  # no temporary file left


def test_write_file_keeps_an_executable_script_executable(workspace: Workspace, repo: Path) -> None:
    script = repo / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert call(workspace, "write_file", {"path": "run.sh", "content": "#!/bin/sh\necho\n"}).status == "success"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_write_file_refuses_a_directory_and_a_file_in_the_way(workspace: Workspace, repo: Path) -> None:
    (repo / "dir").mkdir()
    assert call(workspace, "write_file", {"path": "dir", "content": "x"}).status == "error"
    result = call(workspace, "write_file", {"path": "README.md/child", "content": "x"})
    assert result.status == "error"
    assert (repo / "README.md").read_text() == "hello\n"


def test_read_file_returns_text_and_refuses_missing_directories_and_binaries(workspace: Workspace, repo: Path) -> None:
    assert call(workspace, "read_file", {"path": "README.md"}).output == "     1\thello\n[the whole file: 1 line]"
    (repo / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert call(workspace, "read_file", {"path": "latin1.txt"}).output.startswith("     1\tcaf\ufffd\n")
    (repo / "blob.bin").write_bytes(b"\x7fELF\x00\x01")
    (repo / "dir").mkdir()
    for path, words in (("missing.txt", "no such file"), ("dir", "directory"), ("blob.bin", "binary")):
        result = call(workspace, "read_file", {"path": path})
        assert result.status == "error"
        assert words in (result.error or "")


def test_read_file_refuses_a_fifo_instead_of_blocking(workspace: Workspace, repo: Path) -> None:
    os.mkfifo(repo / "pipe")
    result = call(workspace, "read_file", {"path": "pipe"})
    assert result.status == "error"
    assert "not a regular file" in (result.error or "")




def test_edit_file_replaces_exactly_one_occurrence(workspace: Workspace, repo: Path) -> None:
    (repo / "a.py").write_bytes(b"def f():\r\n    return 1\r\n")
    result = call(workspace, "edit_file", {"path": "a.py", "old_string": "return 1", "new_string": "return 2"})
    assert result.status == "success"
    assert result.output == "replaced 1 occurrence in a.py; now:\n     1\tdef f():\n     2\t    return 2"
    assert (repo / "a.py").read_bytes() == b"def f():\r\n    return 2\r\n"  # line endings untouched


def test_edit_file_with_no_occurrence_is_an_error(workspace: Workspace, repo: Path) -> None:
    result = call(workspace, "edit_file", {"path": "README.md", "old_string": "absent", "new_string": "x"})
    assert result.status == "error"
    assert "not found" in (result.error or "")
    assert (repo / "README.md").read_text() == "hello\n"


def test_edit_file_with_several_occurrences_says_how_many(workspace: Workspace, repo: Path) -> None:
    (repo / "b.txt").write_text("x = 1\nx = 1\nx = 1\n")
    result = call(workspace, "edit_file", {"path": "b.txt", "old_string": "x = 1", "new_string": "x = 2"})
    assert result.status == "error"
    assert "3 times" in (result.error or "")
    assert (repo / "b.txt").read_text() == "x = 1\nx = 1\nx = 1\n"


def test_overlapping_matches_count_as_several() -> None:
    assert count_occurrences("aaa", "aa") == 2
    assert count_occurrences("abcabc", "abc") == 2
    assert count_occurrences("abc", "abc") == 1
    assert count_occurrences("abc", "d") == 0


def test_edit_file_refuses_an_empty_old_string_and_non_utf8_files(workspace: Workspace, repo: Path) -> None:
    empty = call(workspace, "edit_file", {"path": "README.md", "old_string": "", "new_string": "x"})
    assert empty.status == "error"
    (repo / "latin1.txt").write_bytes(b"caf\xe9\n")
    latin = call(workspace, "edit_file", {"path": "latin1.txt", "old_string": "caf", "new_string": "tea"})
    assert latin.status == "error"
    assert (repo / "latin1.txt").read_bytes() == b"caf\xe9\n"


# --- bash --------------------------------------------------------------------------------------------


def test_bash_runs_in_the_checkout_and_reports_the_exit_code(workspace: Workspace, repo: Path) -> None:
    ok = bash(workspace, "pwd; cat README.md")
    assert ok.status == "success"
    assert ok.output == f"{repo.resolve()}\nhello\nexit code: 0"
    failed = bash(workspace, "echo out; echo err >&2; exit 3")
    assert failed.output == "out\nerr\nexit code: 3"
    assert failed.error is None  # a failing command is a result for the model, not a tool failure


def test_bash_reads_empty_stdin(workspace: Workspace) -> None:
    assert bash(workspace, "cat; echo done").output == "done\nexit code: 0"


def test_bash_output_is_capped_keeping_head_and_tail(workspace: Workspace) -> None:
    result = bash(workspace, "echo START; yes middle | head -n 100000; echo END")
    assert result.output.startswith("START\n")
    assert result.output.endswith("END\nexit code: 0")
    omitted = re.search(r"\[\.\.\. (\d+) characters omitted \.\.\.\]", result.output)
    assert omitted is not None
    assert int(omitted.group(1)) == len("START\n") + 7 * 100000 + len("END\n") - MAX_CHARS
    assert len(result.output) < MAX_CHARS + 100


def test_bash_output_that_is_not_utf8_is_replaced(workspace: Workspace) -> None:
    assert bash(workspace, r"printf 'caf\351\n'").output == "caf\ufffd\nexit code: 0"


def test_bash_environment_has_no_secrets(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "OPENAI_API_KEY": "sk-fake-openai-key",
        "GITHUB_TOKEN": "ghp_fakefakefake",
        "GITLAB_TOKEN": "glpat-fakefake",
        "GITHUB_WEBHOOK_SECRET": "fake-webhook-secret",
        "TASUKI_API_TOKEN": "fake-api-token",
        "DB_PASSWORD": "fake-password",
        "UNRELATED_PARENT_VARIABLE": "inherited",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    caller_env = {"EXTRA_SETTING": "given", "SNEAKY_TOKEN": "passed-by-caller"}
    result = bash(workspace, "env", env=caller_env, max_output_chars=100_000)
    assert result.status == "success"
    for name, value in [*secrets.items(), ("SNEAKY_TOKEN", "passed-by-caller")]:
        assert name not in result.output
        assert value not in result.output
    lines = set(result.output.splitlines())
    assert {"TERM=dumb", "PYTHONDONTWRITEBYTECODE=1", "EXTRA_SETTING=given"} <= lines
    home = next(line.split("=", 1)[1] for line in lines if line.startswith("HOME="))
    assert not Path(home).exists()  # a scratch home, removed after the command


@pytest.fixture(params=["pidfd", "polling"])
def exit_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once with pidfd exit notification and once with the portable polling fallback."""
    if request.param == "polling":
        monkeypatch.setattr(shell, "_open_pidfd", lambda pid: None)
    return str(request.param)


@pytest.mark.usefixtures("exit_watch")
def test_bash_timeout_kills_the_whole_process_group(workspace: Workspace) -> None:
    result = call(workspace, "bash", {"command": "sleep 1000 & echo $!; sleep 1000", "timeout_s": 1})
    assert result.status == "error"
    assert result.error == "command timed out after 1 s"
    grandchild = int(result.output.splitlines()[0])
    assert wait_until_gone(grandchild)


@pytest.mark.usefixtures("exit_watch")
def test_background_processes_do_not_outlive_the_command(workspace: Workspace) -> None:
    result = bash(workspace, "sleep 1000 & echo $!")
    assert result.status == "success"
    assert wait_until_gone(int(result.output.splitlines()[0]))


def test_model_timeout_is_clamped_to_the_configured_maximum(workspace: Workspace) -> None:
    result = call(workspace, "bash", {"command": "sleep 1000", "timeout_s": 10_000}, bash_timeout_s=1)
    assert result.error == "command timed out after 1 s"


def test_bash_refuses_a_non_positive_timeout(workspace: Workspace) -> None:
    result = call(workspace, "bash", {"command": "true", "timeout_s": 0})
    assert result.status == "error"
    assert "timeout_s" in (result.error or "")


# --- dispatch ----------------------------------------------------------------------------------------


def test_unknown_tool_is_an_error_naming_the_tools(workspace: Workspace) -> None:
    result = call(workspace, "rm_rf", {})
    assert result.status == "error"
    assert "unknown tool 'rm_rf'" in (result.error or "")
    assert "edit_file" in (result.error or "")


@pytest.mark.parametrize(
    ("name", "arguments", "words"),
    [
        ("bash", {}, "missing required argument(s) command"),
        ("bash", {"command": "true", "cwd": "/"}, "unknown argument(s) cwd"),
        ("bash", {"command": ["ls"]}, "command must be a string, got array"),
        ("bash", {"command": "true", "timeout_s": "5"}, "timeout_s must be an integer, got string"),
        ("bash", {"command": "true", "timeout_s": True}, "got boolean"),
        ("bash", {"command": "true", "timeout_s": 1.5}, "got number"),
        ("read_file", {"path": None}, "got null"),
        ("write_file", {"path": "a"}, "missing required argument(s) content"),
        ("edit_file", "not an object", "arguments must be a JSON object"),
        ("finish", {"summary": "  "}, "summary is empty"),
        ("write_file", {"path": "a.txt", "content": "\ud800"}, "argument content is not valid Unicode"),
        ("bash", {"command": "echo \udcff"}, "argument command is not valid Unicode"),
    ],
)
def test_bad_arguments_are_errors_not_exceptions(
    workspace: Workspace, name: str, arguments: object, words: str
) -> None:
    result = call(workspace, name, arguments)
    assert result.status == "error"
    assert words in (result.error or "")
    assert result.output == f"error: {result.error}"


class _Typed:
    """A tool whose schema uses every JSON type check_arguments knows, a union and an untyped argument."""

    name = "typed"
    description = "for the argument check"
    changes_checkout = False
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "flag": {"type": "boolean"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
            "maybe": {"type": ["string", "null"]}, "items": {"type": "array"}, "free": {},
        },
    }

    def run(self, workspace: Workspace, arguments: Mapping[str, Any], options: ToolOptions) -> ToolOutcome:
        return ToolOutcome("ran")


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"flag": 1}, "flag must be a boolean, got integer"),
        ({"flag": "true"}, "flag must be a boolean, got string"),
        ({"count": True}, "count must be an integer, got boolean"),
        ({"ratio": False}, "ratio must be a number, got boolean"),
        ({"maybe": 3}, "maybe must be a string or a null, got integer"),
        ({"items": {}}, "items must be an array, got object"),
    ],
)
def test_argument_types_follow_json_not_python(arguments: dict[str, Any], words: str) -> None:
    with pytest.raises(ToolError, match=re.escape(words)):
        check_arguments(_Typed(), arguments)


def test_arguments_of_every_json_type_are_accepted() -> None:
    good = {"flag": False, "count": 3, "ratio": 0.5, "maybe": None, "items": [1], "free": {"any": [None]}}
    assert check_arguments(_Typed(), good) == good
    assert check_arguments(_Typed(), {"ratio": 2, "maybe": "text"}) == {"ratio": 2, "maybe": "text"}


def test_finish_ends_the_task_with_its_summary(workspace: Workspace) -> None:
    result = call(workspace, "finish", {"summary": "Fixed the parser.\n"})
    assert result == ToolResult("success", "task finished", None, result.duration_ms, True, "Fixed the parser.")


def test_tool_schemas_are_the_contract() -> None:
    by_name = {schema["function"]["name"]: schema for schema in TOOL_SCHEMAS}
    expected = {
        "bash": ({"command", "timeout_s"}, ["command"]),
        "read_file": ({"path", "offset", "limit"}, ["path"]),
        "search": ({"pattern", "path", "glob", "literal", "ignore_case"}, ["pattern"]),
        "glob": ({"pattern", "path"}, ["pattern"]),
        "write_file": ({"path", "content"}, ["path", "content"]),
        "edit_file": ({"path", "old_string", "new_string", "replace_all"}, ["path", "old_string", "new_string"]),
        "recall": ({"query"}, ["query"]),
        "finish": ({"summary", "keep"}, ["summary"]),
    }
    assert set(by_name) == set(expected)
    for name, (properties, required) in expected.items():
        schema = by_name[name]
        assert schema["type"] == "function"
        assert schema["function"]["description"]
        parameters = schema["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(parameters)
        assert set(parameters["properties"]) == properties
        assert parameters["required"] == required
        assert parameters["additionalProperties"] is False


def test_each_tool_declares_whether_it_changes_the_checkout() -> None:
    declared = {name: tool.changes_checkout for name, tool in TOOLS.items()}
    assert declared == {
        "bash": True, "read_file": False, "search": False, "glob": False, "write_file": True, "edit_file": True,
        "recall": False, "finish": False,
    }
    assert all(changes_checkout(name) is changed for name, changed in declared.items())
    assert changes_checkout("no_such_tool") is False  # an unknown name runs nothing
    # A task's toolbox is asked, not the built-ins: a tool it adds speaks for itself.
    writer = type("Writer", (), {"name": "mcp_write", "changes_checkout": True})()
    assert changes_checkout("mcp_write", {"mcp_write": writer}) is True
    assert changes_checkout("bash", {"mcp_write": writer}) is False  # not in that toolbox


# --- output caps -------------------------------------------------------------------------------------


def test_cap_output_leaves_short_text_alone() -> None:
    assert cap_output("short", 10) == ("short", None)
    assert cap_output("x" * 10, 10) == ("x" * 10, None)


def test_cap_output_keeps_head_and_tail_and_reports_the_length() -> None:
    text, original = cap_output("0123456789abcdefghij", 6)
    assert original == 20
    assert text == "012\n[... 14 characters omitted ...]\nhij"


@given(text=st.text(max_size=300), max_chars=st.integers(min_value=0, max_value=120))
def test_streamed_capture_agrees_with_cap_output(text: str, max_chars: int) -> None:
    capture = OutputCapture(max_chars)
    data = text.encode()
    for start in range(0, len(data), 7):  # chunks that split multi-byte characters
        capture.feed(data[start : start + 7])
    assert capture.result() == cap_output(text, max_chars)
