"""The new reading tools end to end: a real worker runs a task in which the replay model searches click's 3,047-line
core.py, reads a window of it by offset, misremembers an edit, is shown the closest lines, and fixes a typo."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contexts.names import TOOLS_FILE
from replay import ReplayServer
from tests.helpers.model_server import model_server
from tests.helpers.stack import Stack, git, local_request
from tests.helpers.worker_scenarios import context_records, finish_turn

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "fixtures" / "click"
CORE = "src/click/core.py"
TYPO = "callback odering by iter_params_for_processing()"
FIXED = "callback ordering by iter_params_for_processing()"


def turn(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"name": name, "arguments": arguments}]}


TURNS = [
    turn("search", pattern=r"def get_help_option\(", path="src", glob="*.py"),
    turn("read_file", path=CORE, offset=1296, limit=25),
    # Misremembered: the comment says "odering", not "ordering"; the error shows the closest line.
    turn("edit_file", path=CORE, old_string="        # callback ordering by iter_params", new_string="x"),
    turn("edit_file", path=CORE, old_string=TYPO, new_string=FIXED),
    finish_turn("Fix a typo in get_help_option's comment."),
    finish_turn("Fix a typo in get_help_option's comment."),  # for a finish gate that answers the first one
]


def make_click_repo(path: Path) -> Path:
    """A git repository holding click 8.1.8's core.py (and its licence) where click keeps it."""
    (path / "src" / "click").mkdir(parents=True)
    shutil.copy(FIXTURE / "core.py.txt", path / CORE)
    shutil.copy(FIXTURE / "LICENSE.txt", path / "LICENSE.txt")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "click 8.1.8's core")
    return path


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with model_server(TURNS) as replay:
        yield replay


def test_search_then_a_window_then_an_edit_on_a_real_three_thousand_line_file(
    tmp_path: Path, redis_url: str, redis_client: object, server: ReplayServer
) -> None:
    repo = make_click_repo(tmp_path / "repo")
    stack = Stack(tmp_path, redis_url, server.url)
    try:
        stack.start_worker("w1")
        uuid = stack.send(local_request(repo, prompt="Fix the typo in get_help_option's comment."))
        assert stack.wait_finished(uuid)["status"] == "completed"
    finally:
        stack.stop()

    original = (FIXTURE / "core.py.txt").read_text()
    assert git(repo, "show", f"tasuki/1-{uuid[:8]}:{CORE}") == original.replace(TYPO, FIXED)
    results = [r["result"] for r in context_records(stack.contexts_dir / "completed" / uuid, TOOLS_FILE)]
    searched, window, missed, edited = results[:4]
    assert searched == f'{CORE}:1296:     def get_help_option(self, ctx: Context) -> t.Optional["Option"]:'
    lines = original.split("\n")
    assert window == "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(1296, 1321)) + (
        "\n[lines 1296-1320 of 3047; more: offset=1321]")
    typo_line = lines.index("        # callback odering by iter_params_for_processing(), which relies on") + 1
    assert f"The closest lines ({typo_line}-{typo_line}," in missed
    assert f"{typo_line:>6}\t        # callback odering by" in missed
    assert edited.startswith(f"replaced 1 occurrence in {CORE}; now:")
    # What the model was sent: the window and the closest lines, not the file's first and last 10,000 characters.
    sent = " ".join(str(m.get("content")) for r in server.requests for m in r["body"].get("messages", []))
    assert "[lines 1296-1320 of 3047; more: offset=1321]" in sent
    assert "def make_context(" not in sent  # line 910: never read
