"""One damaged context never stops the list, the statistics or the viewer: it is skipped and reported.

And the viewer never follows a context file that is a symbolic link out of the store.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contexts import ContextStore, CorruptRecordError
from contexts.queries import compute_stats, read_contexts, show_context
from tests.helpers.context_support import CONFIG, TASK_KEY

REPO_ROOT = Path(__file__).resolve().parents[1]


def finished(store: ContextStore, user: str) -> Path:
    context = store.create(TASK_KEY, CONFIG, user=user, heartbeat=False)
    context.append_message("user", "Fix the bug")
    context.finish("completed")
    return store.completed_path(context.uuid)


def edit_state(directory: Path, text_edit: Callable[[str], str]) -> None:
    path = directory / "state.json"
    path.write_text(text_edit(path.read_text()))


def null_status(directory: Path) -> None:
    edit_state(directory, lambda text: json.dumps({**json.loads(text), "status": None}))


def infinite_count(directory: Path) -> None:
    edit_state(
        directory, lambda text: json.dumps(json.loads(text)).replace('"llm_call_count": 0', '"llm_call_count": 1e999')
    )


def null_attempt(directory: Path) -> None:
    edit_state(directory, lambda text: json.dumps({**json.loads(text), "attempt": None}))


def truncated_archive(directory: Path) -> None:
    messages = directory / "messages.jsonl"
    (directory / "messages.jsonl.gz").write_bytes(gzip.compress(messages.read_bytes())[:20])
    messages.unlink()


def not_an_object(directory: Path) -> None:
    (directory / "metadata.json").write_text("[1, 2, 3]")


DAMAGES = [null_status, infinite_count, null_attempt, truncated_archive, not_an_object]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_completed_context_is_skipped_and_reported_by_list_and_stats(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    good = finished(store, "good")
    bad = finished(store, "bad")
    damage(bad)

    listing = read_contexts(store)
    stats = compute_stats(store)

    assert [item.uuid for item in listing.items] == [good.name]
    assert [damaged.uuid for damaged in listing.damaged] == [bad.name]
    assert stats.total == 1
    assert [item["uuid"] for item in stats.damaged] == [bad.name]


def test_a_truncated_archive_is_a_clear_error_in_the_viewer(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    bad = finished(store, "bad")
    truncated_archive(bad)

    with pytest.raises(CorruptRecordError, match="damaged gzip archive"):
        show_context(store, bad.name)


def test_the_viewer_refuses_a_messages_file_that_links_out_of_the_store(tmp_path: Path) -> None:
    secret = tmp_path / "outside.jsonl"
    secret.write_text(json.dumps({"seq": 1, "role": "user", "content": "a secret from outside"}) + "\n")
    store = ContextStore(tmp_path / "contexts", fsync="never")
    directory = finished(store, "linked")
    (directory / "messages.jsonl").unlink()
    (directory / "messages.jsonl").symlink_to(secret)

    with pytest.raises(CorruptRecordError, match="symbolic link"):
        show_context(store, directory.name)
    listing = read_contexts(store)
    assert listing.items == []
    assert "symbolic link" in listing.damaged[0].reason


def tasuki(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = base.parent / "config.yaml"
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASUKI")}
    env.update({"PYTHONPATH": str(REPO_ROOT), "TASUKI_CONFIG": str(config), "TASUKI__CONTEXTS__BASE_DIR": str(base)})
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        cwd=base.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_list_and_stats_commands_exit_0_and_name_each_damaged_context_in_one_line(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    good = finished(store, "good")
    damaged = {}
    for damage in DAMAGES:
        directory = finished(store, damage.__name__)
        damage(directory)
        damaged[directory.name] = damage.__name__

    # The damage happened behind the index's back (after each context's last write): the commands read the index,
    # so they learn of it from a reindex, which reads every directory and names each damaged one too.
    for args in (["context", "reindex"], ["context", "list"], ["stats"]):
        done = tasuki(store.base_dir, *args)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        warnings = done.stderr.strip().splitlines()
        assert len(warnings) == len(damaged)
        assert all(line.startswith("tasuki: warning: skipped damaged context ") for line in warnings)
        assert {line.split()[5].rstrip(":") for line in warnings} == set(damaged)
    assert good.name in tasuki(store.base_dir, "context", "list").stdout


def test_show_of_a_damaged_context_is_one_line_and_nonzero(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "contexts", fsync="never")
    bad = finished(store, "bad")
    truncated_archive(bad)

    done = tasuki(store.base_dir, "context", "show", bad.name)

    assert done.returncode != 0
    assert done.stderr.startswith("tasuki: error: ")
    assert len(done.stderr.strip().splitlines()) == 1
