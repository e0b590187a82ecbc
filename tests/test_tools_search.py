"""search and glob over a real git checkout: .gitignore as git reads it, caps, and a checkout written by an attacker."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.tools import ToolResult, Workspace, run_tool
from agent.tools.search import MAX_FILES, MAX_MATCH_CHARS, MAX_MATCHES
from agent.tools.tree import MAX_DEPTH, MAX_IGNORE_PATTERNS, expand_braces, shown_path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


def call(repo: Path, name: str, arguments: dict[str, Any], view_chars: int | None = None) -> ToolResult:
    return run_tool(Workspace(repo), name, arguments, bash_timeout_s=5, max_output_chars=1_000_000,
                    view_chars=view_chars)


def git_listing(repo: Path) -> list[str]:
    """What git itself lists as the checkout's files (tracked or not, not ignored): the reference."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(out.splitlines())


IGNORING = {
    ".gitignore": "build/\n*.log\n!keep.log\n/top.txt\ndocs/**/*.tmp\n",
    "src/.gitignore": "generated_*\n!generated_keep.py\n",
    "src/app.py": "def handler(event):\n    return event\n",
    "src/generated_x.py": "def handler(): pass\n",
    "src/generated_keep.py": "def handler(): pass\n",
    "src/nested/top.txt": "handler\n",
    "top.txt": "handler\n",
    "build/out.py": "def handler(): pass\n",
    "lib/build/inner.py": "handler\n",
    "debug.log": "handler\n",
    "keep.log": "handler\n",
    "docs/a/b.tmp": "handler\n",
    "docs/readme.md": "handler\n",
    "private.txt": "handler\n",
}


# --- what is searched --------------------------------------------------------------------------------


def test_glob_lists_exactly_what_git_lists(repo: Path) -> None:
    write(repo, IGNORING)
    (repo / ".git" / "info" / "exclude").write_text("private.txt\n")
    listed = call(repo, "glob", {"pattern": "*"}).output.splitlines()
    assert listed == git_listing(repo)
    assert "src/generated_keep.py" in listed
    assert "private.txt" not in listed


def test_search_reports_path_line_text_sorted_and_honours_gitignore(repo: Path) -> None:
    write(repo, IGNORING)
    result = call(repo, "search", {"pattern": r"def handler\(\w*"})
    assert result.status == "success"
    assert result.output.splitlines() == [
        "src/app.py:1: def handler(event):",
        "src/generated_keep.py:1: def handler(): pass",
    ]


def test_a_directory_named_in_path_is_searched_even_when_ignored(repo: Path) -> None:
    write(repo, IGNORING)
    assert call(repo, "search", {"pattern": "handler", "path": "build"}).output == "build/out.py:1: def handler(): pass"


def test_literal_ignore_case_glob_and_path_filters(repo: Path) -> None:
    write(repo, {"a.py": "x = f(1) + [2]\n", "b.ts": "X = F(1) + [2]\n", "sub/c.py": "x = f(1) + [2]\n"})
    assert call(repo, "search", {"pattern": "f(1) + [2]", "literal": True}).output.splitlines() == [
        "a.py:1: x = f(1) + [2]", "sub/c.py:1: x = f(1) + [2]"]
    found = call(repo, "search", {"pattern": "F(1)", "literal": True, "ignore_case": True, "glob": "*.{ts,tsx}"})
    assert found.output == "b.ts:1: X = F(1) + [2]"
    assert call(repo, "search", {"pattern": r"^x = f", "path": "sub"}).output == "sub/c.py:1: x = f(1) + [2]"
    assert call(repo, "search", {"pattern": r"^X", "ignore_case": True, "glob": "sub/*.py"}).output == (
        "sub/c.py:1: x = f(1) + [2]")
    assert call(repo, "search", {"pattern": "nowhere"}).output == "no matches for 'nowhere'"


def test_line_anchors_work_per_line_in_crlf_files(repo: Path) -> None:
    (repo / "w.txt").write_bytes(b"alpha end\r\nbeta\r\n")
    assert call(repo, "search", {"pattern": "end$"}).output == "w.txt:1: alpha end"
    assert call(repo, "search", {"pattern": r"\Abeta"}).output == "w.txt:2: beta"


def test_glob_patterns_sort_by_path_and_say_when_cut(repo: Path) -> None:
    write(repo, {"src/b.ts": "", "src/deep/a.ts": "", "a.ts": "", "src/c.tsx": "", "docs/x.md": ""})
    assert call(repo, "glob", {"pattern": "*.ts"}).output.splitlines() == ["a.ts", "src/b.ts", "src/deep/a.ts"]
    assert call(repo, "glob", {"pattern": "src/**/*.ts"}).output.splitlines() == ["src/b.ts", "src/deep/a.ts"]
    assert call(repo, "glob", {"pattern": "*.{ts,tsx}", "path": "src"}).output.splitlines() == [
        "src/b.ts", "src/c.tsx", "src/deep/a.ts"]
    assert call(repo, "glob", {"pattern": "*.rs"}).output == "no files match '*.rs'"
    for n in range(MAX_FILES + 20):
        (repo / "docs" / f"n{n:04}.md").write_text("")
    output = call(repo, "glob", {"pattern": "*.md"}).output.splitlines()
    assert len(output) == MAX_FILES + 1
    assert output[-1] == f"[glob: the first {MAX_FILES} of {MAX_FILES + 21} files; narrow the pattern or give a path]"


def test_matches_are_capped_with_a_note_counting_all_of_them(repo: Path) -> None:
    for n in range(5):
        (repo / f"f{n}.py").write_text("hit\n" * 50)
    lines = call(repo, "search", {"pattern": "hit"}).output.splitlines()
    assert len(lines) == MAX_MATCHES + 1
    assert lines[-1] == (
        f"[search: the first {MAX_MATCHES} of 250 matching lines (5 files); narrow it with path or glob]")


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"pattern": "(?=look)ahead"}, "bad regular expression '(?=look)ahead'"),
        ({"pattern": "unclosed("}, "or set literal=true"),
        ({"pattern": ""}, "pattern is empty"),
        ({"pattern": "x", "path": "../outside"}, "'..' is not allowed"),
        ({"pattern": "x", "path": ".git"}, "paths under .git are not for the file tools"),
        ({"pattern": "x", "path": "missing"}, "no such file or directory: missing"),
        ({"pattern": "x", "literal": "yes"}, "literal must be a boolean, got string"),
    ],
)
def test_bad_searches_are_one_line_errors(repo: Path, arguments: dict[str, Any], words: str) -> None:
    result = call(repo, "search", arguments)
    assert result.status == "error"
    assert words in (result.error or "")
    assert "\n" not in (result.error or "")


def test_brace_expansion_is_bounded() -> None:
    assert expand_braces("a.{x,{y,z}}") == ["a.x", "a.y", "a.z"]
    assert expand_braces("{a,b}/{c,d}") == ["a/c", "a/d", "b/c", "b/d"]
    assert expand_braces("no{braces}") == ["no{braces}"]
    with pytest.raises(Exception, match="more than 64 alternatives"):
        expand_braces("{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}")


# --- a checkout written by an attacker ---------------------------------------------------------------


def test_a_hostile_git_config_steers_nothing_and_no_process_starts(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    hook = repo / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    with (repo / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {hook}\n\thooksPath = {repo}\n\tpager = {hook}\n"
                     f"[filter \"x\"]\n\tclean = {hook}\n\tsmudge = {hook}\n")
    write(repo, {".gitattributes": "* filter=x\n", "a.py": "needle\n"})

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a host-side process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(os, "fork", no_process)
    monkeypatch.setattr(os, "posix_spawn", no_process)
    assert call(repo, "search", {"pattern": "needle"}).output == "a.py:1: needle"
    assert "a.py" in call(repo, "glob", {"pattern": "*"}).output
    assert not marker.exists()


def test_symlinks_out_of_the_checkout_are_never_followed(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("TOKEN = 'outside secret'\n")
    (repo / "linked_dir").symlink_to(outside)
    (repo / "linked_file.py").symlink_to(outside / "secret.py")
    (repo / "loop").symlink_to(repo / "loop")
    (repo / ".gitignore").symlink_to(outside / "secret.py")  # a symlinked ignore file is not read (git agrees)
    (repo / "a.py").write_text("TOKEN = 'inside'\n")
    assert call(repo, "search", {"pattern": "TOKEN"}).output == "a.py:1: TOKEN = 'inside'"
    listed = call(repo, "glob", {"pattern": "*"}).output.splitlines()
    assert "linked_dir/secret.py" not in listed
    assert {"a.py", "linked_dir", "linked_file.py"} <= set(listed)
    refused = call(repo, "search", {"pattern": "TOKEN", "path": "linked_dir"})
    assert refused.status == "error"
    assert "outside secret" not in refused.output


def test_a_hostile_gitignore_cannot_stall_or_blind_the_walk(repo: Path) -> None:
    # Catastrophic for a backtracking engine on a long name (a star per 'a'); RE2 matches in linear time.
    stars = "*a" * 30 + "*b"
    long_name = "a" * 200
    (repo / ".gitignore").write_text(f"{stars}\n[z-a]\n\\\n" + "x\n" * 50_000 + "*.py\n")  # a bad range, 100 KiB
    (repo / long_name).write_text("needle\n")
    (repo / "kept.py").write_text("needle\n")  # *.py sits past the pattern cap: not applied
    os.mkfifo(repo / "sub.fifo")
    (repo / "sub").mkdir()
    os.mkfifo(repo / "sub" / ".gitignore")  # would block a reader that does not open non-blocking
    (repo / "sub" / "x.py").write_text("needle\n")
    assert call(repo, "search", {"pattern": "needle"}).output.splitlines() == [
        f"{long_name}:1: needle", "kept.py:1: needle", "sub/x.py:1: needle",
        f"[.gitignore: only its first {MAX_IGNORE_PATTERNS} patterns applied]"]


def test_file_names_cannot_forge_result_lines(repo: Path) -> None:
    (repo / "evil\nplanted.py:1: fake").write_text("needle\n")
    (repo / 'q"uote\\.py').write_text("needle\n")
    (repo / "bytes\udcff.py").write_text("needle\n")
    output = call(repo, "search", {"pattern": "needle"}).output
    assert output.splitlines() == [
        '"bytes\\377.py":1: needle', '"evil\\nplanted.py:1: fake":1: needle', '"q\\"uote\\\\.py":1: needle']
    assert shown_path("plain/ü.py") == "plain/ü.py"


def test_hostile_file_contents_stay_capped_and_on_one_line(repo: Path) -> None:
    (repo / "huge.txt").write_bytes(b"needle\n" * (11 * 1024 * 1024 // 7))  # over read_file's 10 MB
    (repo / "blob.bin").write_bytes(b"\x00needle\n")
    (repo / "long.js").write_text("needle" + "x" * 1_000_000 + "\n")
    (repo / "tricky.txt").write_text("needle\x0bfake.py:9: x\u2028y\x1b[2J\n")
    lines = call(repo, "search", {"pattern": "needle"}).output.splitlines()
    cut = 1_000_006 - MAX_MATCH_CHARS
    assert lines[0] == f"long.js:1: needle{'x' * (MAX_MATCH_CHARS - 6)}… [{cut} more characters]"
    assert lines[1] == "tricky.txt:1: needle\\x0bfake.py:9: x\\u2028y\\x1b[2J"
    assert lines[2] == "[search: 1 files over 10 MB not searched]"  # the binary file is skipped without a word
    assert len(lines) == 3


def test_output_is_cut_to_the_view_at_a_line_boundary(repo: Path) -> None:
    (repo / "a.txt").write_text("".join(f"needle {'y' * 200} {n}\n" for n in range(80)))
    output = call(repo, "search", {"pattern": "needle"}, view_chars=3000).output
    assert len(output) <= 3000
    assert output.splitlines()[-1].startswith("[output cut at")
    assert all(line.startswith("a.txt:") for line in output.splitlines()[:-1])


def test_deep_trees_are_walked_to_a_depth_and_say_where_they_stopped(repo: Path) -> None:
    deep = repo.joinpath(*["d"] * (MAX_DEPTH + 5))
    deep.mkdir(parents=True)
    (deep / "bottom.py").write_text("needle\n")
    (repo / "top.py").write_text("needle\n")
    output = call(repo, "search", {"pattern": "needle"}).output
    assert output.startswith("top.py:1: needle")
    assert f"[not entered (deeper than {MAX_DEPTH} directories): " in output


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@pytest.fixture
def swapping(tmp_path: Path) -> Iterator[Path]:
    """A checkout whose ``docs`` directory is swapped with a symlink to outside (renameat2), as fast as it goes."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "page.txt").write_text("inside needle\n")
    outside.mkdir()
    (outside / "page.txt").write_text("THE OUTSIDE SECRET needle\n")
    (repo / "link").symlink_to(outside)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            libc.renameat2(_AT_FDCWD, os.fsencode(repo / "docs"), _AT_FDCWD, os.fsencode(repo / "link"),
                           _RENAME_EXCHANGE)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        yield repo
    finally:
        stop.set()
        swapper.join(timeout=10)


def test_a_directory_swapped_for_a_symlink_mid_walk_never_leads_outside(swapping: Path) -> None:
    seen_inside = 0
    for attempt in range(300):
        for arguments in ({"pattern": "needle"}, {"pattern": "needle", "path": "docs"}):
            output = call(swapping, "search", arguments).output
            assert "OUTSIDE SECRET" not in output, attempt
            seen_inside += "inside needle" in output
        assert "OUTSIDE" not in call(swapping, "glob", {"pattern": "*"}).output
    assert seen_inside > 0  # the walk did run into docs while it was a directory
