"""The worker's process-wide objects (worker.runtime)."""

from __future__ import annotations

import shutil
from pathlib import Path

from worker.runtime import context_store
from worker.settings_models import Settings


def settings_for(tmp_path: Path) -> Settings:
    return Settings.model_validate({"contexts": {"base_dir": str(tmp_path / "contexts")}})


def test_the_task_holders_store_is_kept_from_task_to_task_and_made_again_when_its_root_went(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    kept = context_store(settings)
    assert context_store(settings) is kept  # its SQLite index is opened and reconciled once per process

    shutil.rmtree(tmp_path / "contexts")
    again = context_store(settings)

    assert again is not kept
    assert (tmp_path / "contexts" / "running").is_dir()


def test_other_callers_get_a_new_store_that_reconciles_its_index_on_first_use(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    assert context_store(settings, index=False) is not context_store(settings, index=False)
    assert context_store(settings, index=False).on_heartbeat is None
