"""The worker's kept connection to the memory store (worker.stores.kept_memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.settings_models import Settings
from worker.stores import kept_memory


def settings_for(tmp_path: Path) -> Settings:
    return Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}})


def test_one_connection_serves_task_after_task(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with kept_memory(settings) as first:
        pass
    with kept_memory(settings) as second:
        assert second is first


def test_a_store_file_replaced_or_removed_meanwhile_gets_a_new_connection(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with kept_memory(settings) as first:
        pass
    database = settings.memory.database(settings.contexts)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)  # an operator starting memory afresh

    with kept_memory(settings) as second:
        assert second is not first
        assert second.status().episodes == 0
    assert database.is_file()  # the writes went to the file now there, not to the one removed


def test_a_connection_that_failed_is_not_kept(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with pytest.raises(RuntimeError), kept_memory(settings) as first:
        raise RuntimeError("a damaged page")
    with kept_memory(settings) as second:
        assert second is not first


def test_a_nested_use_gets_a_connection_of_its_own(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with kept_memory(settings) as outer, kept_memory(settings) as inner:
        assert inner is not outer
