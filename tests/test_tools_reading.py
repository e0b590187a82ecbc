"""read_file's numbered windows and edit_file's replace_all and nearest-match errors, on real files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent.tools import ToolResult, Workspace, run_tool
from agent.tools.lines import MAX_LINE_CHARS, split_lines
from agent.tools.nearest import closest_span

CLICK_CORE = Path(__file__).parent / "fixtures" / "click" / "core.py.txt"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


def call(repo: Path, name: str, arguments: dict[str, Any], view_chars: int | None = None) -> ToolResult:
    return run_tool(Workspace(repo), name, arguments, bash_timeout_s=5, max_output_chars=1_000_000,
                    view_chars=view_chars)


def numbered_lines(output: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^ *(\d+)\t", output, re.MULTILINE)]


# --- read_file ---------------------------------------------------------------------------------------


def test_a_long_file_is_reachable_window_by_window_following_the_footer(repo: Path) -> None:
    (repo / "core.py").write_text(CLICK_CORE.read_text())
    total = len(CLICK_CORE.read_text().splitlines())
    seen: list[int] = []
    offset = 1
    while True:
        result = call(repo, "read_file", {"path": "core.py", "offset": offset}, view_chars=20_000)
        assert result.status == "success"
        assert len(result.output) <= 20_000  # the window fits what the model is shown: nothing cut from its middle
        seen += numbered_lines(result.output)
        footer = result.output.rsplit("\n", 1)[-1]
        assert footer.startswith(f"[lines {offset}-{seen[-1]} of {total}")
        more = re.search(r"more: offset=(\d+)", footer)
        if more is None:
            assert footer.endswith("end of file]")
            break
        offset = int(more.group(1))
    assert seen == list(range(1, total + 1))


def test_offset_and_limit_show_exactly_those_lines_with_their_numbers(repo: Path) -> None:
    (repo / "core.py").write_text(CLICK_CORE.read_text())
    lines = CLICK_CORE.read_text().splitlines()
    output = call(repo, "read_file", {"path": "core.py", "offset": 1296, "limit": 3}).output
    assert output == "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in (1296, 1297, 1298)) + (
        f"\n[lines 1296-1298 of {len(lines)}; more: offset=1299]"
    )


def test_a_short_file_is_shown_whole_and_an_empty_one_says_so(repo: Path) -> None:
    (repo / "a.txt").write_text("one\ntwo")  # no newline at the end: still two lines
    (repo / "empty.txt").write_text("")
    (repo / "crlf.txt").write_bytes(b"x\r\ny\r\n")
    assert call(repo, "read_file", {"path": "a.txt"}).output == "     1\tone\n     2\ttwo\n[the whole file: 2 lines]"
    assert call(repo, "read_file", {"path": "empty.txt"}).output == "[empty file: 0 lines]"
    assert call(repo, "read_file", {"path": "crlf.txt"}).output == "     1\tx\n     2\ty\n[the whole file: 2 lines]"


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"offset": 0}, "offset and limit must be positive"),
        ({"limit": -1}, "offset and limit must be positive"),
        ({"offset": 4}, "offset 4 is past the end of a.txt, which has 3 lines"),
        ({"offset": "2"}, "offset must be an integer, got string"),
        ({"limit": True}, "limit must be an integer, got boolean"),
    ],
)
def test_bad_windows_are_one_line_errors(repo: Path, arguments: dict[str, Any], words: str) -> None:
    (repo / "a.txt").write_text("1\n2\n3\n")
    result = call(repo, "read_file", {"path": "a.txt", **arguments})
    assert result.status == "error"
    assert words in (result.error or "")
    assert "\n" not in (result.error or "")


def test_a_huge_line_is_cut_and_the_window_still_shows_its_neighbours(repo: Path) -> None:
    (repo / "min.js").write_text("first\n" + "x" * 50_000 + "\nlast\n")
    output = call(repo, "read_file", {"path": "min.js"}, view_chars=20_000).output
    assert numbered_lines(output) == [1, 2, 3]
    assert f"[line cut: {50_000 - MAX_LINE_CHARS} more characters]" in output
    assert len(output) < 3 * MAX_LINE_CHARS


def test_the_window_stops_at_a_line_boundary_within_the_view(repo: Path) -> None:
    (repo / "a.txt").write_text("".join(f"line {n:04}\n" for n in range(1, 1001)))
    output = call(repo, "read_file", {"path": "a.txt"}, view_chars=1000).output
    shown = numbered_lines(output)
    assert shown == list(range(1, len(shown) + 1))
    assert 30 < len(shown) < 100
    assert output.endswith(f"[lines 1-{shown[-1]} of 1000; more: offset={shown[-1] + 1}]")


def test_read_file_still_refuses_a_symlink_out_of_the_checkout(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("outside secret\n")
    (repo / "link.txt").symlink_to(tmp_path / "secret.txt")
    result = call(repo, "read_file", {"path": "link.txt", "offset": 1, "limit": 5})
    assert result.status == "error"
    assert "resolves outside the repository" in (result.error or "")
    assert "outside secret" not in result.output


# --- edit_file ---------------------------------------------------------------------------------------


def test_replace_all_replaces_every_occurrence_and_shows_the_first(repo: Path) -> None:
    (repo / "m.py").write_text("x = old()\ny = old()\nz = old()\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "old", "new_string": "new", "replace_all": True})
    assert result.status == "success"
    assert result.output.startswith("replaced 3 occurrences in m.py; the first, now:\n     1\tx = new()")
    assert (repo / "m.py").read_text() == "x = new()\ny = new()\nz = new()\n"


def test_several_occurrences_without_replace_all_say_on_which_lines(repo: Path) -> None:
    (repo / "m.py").write_text("a\nold\nb\nold\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "old", "new_string": "new"})
    assert result.status == "error"
    assert "occurs 2 times in m.py (at lines 2, 4)" in (result.error or "")
    assert "replace_all" in (result.error or "")
    assert (repo / "m.py").read_text() == "a\nold\nb\nold\n"


def test_a_missing_old_string_shows_the_closest_lines_of_a_real_file(repo: Path) -> None:
    (repo / "core.py").write_text(CLICK_CORE.read_text())
    lines = CLICK_CORE.read_text().splitlines()
    first = lines.index("    def get_help_option(self, ctx: Context) -> t.Optional[\"Option\"]:") + 1
    misremembered = "def get_help_option(self, ctx: Context) -> t.Optional[Option]:\n" + "\n".join(
        lines[first : first + 3]
    )
    result = call(repo, "edit_file", {"path": "core.py", "old_string": misremembered, "new_string": "pass"})
    assert result.status == "error"
    assert f"The closest lines ({first}-{first + 3}," in (result.error or "")
    assert f"{first:>6}\t{lines[first - 1]}" in (result.error or "")
    assert (repo / "core.py").read_text() == CLICK_CORE.read_text()


def test_indentation_alone_is_named_as_the_difference(repo: Path) -> None:
    (repo / "m.py").write_text("class A:\n    def f(self):\n        return 1\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "def f(self):\n    return 1", "new_string": "x"})
    assert "(2-3, the same text but for indentation or whitespace)" in (result.error or "")


def test_line_number_prefixes_copied_from_read_file_are_named(repo: Path) -> None:
    (repo / "m.py").write_text("a = 1\nb = 2\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "     1\ta = 1\n     2\tb = 2", "new_string": "x"})
    assert "starts with read_file's line numbers" in (result.error or "")


def test_nothing_close_says_so_instead_of_pointing_at_unrelated_lines(repo: Path) -> None:
    (repo / "m.py").write_text("alpha\nbeta\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "zzzz qqqq 12345", "new_string": "x"})
    assert "no lines are close to it" in (result.error or "")


def test_an_old_string_typed_with_newlines_edits_a_crlf_file_keeping_its_endings(repo: Path) -> None:
    (repo / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = call(repo, "edit_file", {"path": "w.txt", "old_string": "one\ntwo", "new_string": "1\n2"})
    assert result.status == "success"
    assert (repo / "w.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


def test_replace_all_must_be_a_boolean(repo: Path) -> None:
    (repo / "m.py").write_text("a a\n")
    result = call(repo, "edit_file", {"path": "m.py", "old_string": "a", "new_string": "b", "replace_all": "yes"})
    assert "replace_all must be a boolean, got string" in (result.error or "")
    assert (repo / "m.py").read_text() == "a a\n"


def test_closest_span_finds_a_misspelt_line_among_thousands() -> None:
    lines = split_lines(CLICK_CORE.read_text())
    target = lines.index("    def make_context(") + 1
    span = closest_span(lines, "    def make_contxt(\n        self,")
    assert span is not None
    assert (span.first, span.last) == (target, target + 1)
