"""A task's environment across attempts (SPEC §17): a resume here keeps its home, a resume elsewhere restores the
key the task began with (whatever the agent changed since), and without bubblewrap the setup runs every time."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from contexts import ContextStore
from sandbox.host import HOST_ENV
from sandbox.jail import HOME, make_sandbox
from tests.helpers.ci import bubblewrap_here
from tests.helpers.stack import git, make_buggy_repo
from worker.checkout import Checkout
from worker.environment import TaskEnvironment
from worker.settings_models import Settings
from worker.workcopy import IDLE_DIR, GitCache

SETUP = 'mkdir -p .venv "$HOME/.cache"; echo built > .venv/marker; echo cached > "$HOME/.cache/x"\n'
TASK_KEY = {"task_source": "local", "owner": "local", "repo": "repo", "task_type": "prompt", "task_id": "1"}


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


def repo(tmp_path: Path) -> Path:
    path = make_buggy_repo(tmp_path / "repo")
    (path / ".tasuki").mkdir()
    (path / ".tasuki" / "setup.sh").write_text(SETUP)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "setup")
    return path


def checkout_for(settings: Settings, remote: Path, name: str) -> Checkout:
    workspaces = Path(settings.contexts.workspaces_dir).absolute()
    cache = GitCache(Path(settings.contexts.git_cache_dir).absolute(), workspaces)
    checkout = Checkout(workspaces / name, str(remote), f"tasuki/{name}", cache=cache)
    checkout.prepare(fresh=True)
    return checkout


def inside(settings: Settings, checkout: Checkout, path: str) -> str:
    """The file at ``path`` of the checkout (or absolute: of the home, at HOME) as the task's commands see it (a restore
    by layers copies nothing)."""
    sandbox = make_sandbox(settings.sandbox, read_only=checkout.shared_paths)
    argv, cwd = sandbox.command(["cat", path], checkout.path, checkout.home, {"PATH": "/usr/bin:/bin"})
    return subprocess.run(argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.parametrize("restore", ["layers", "copy"])
def test_a_resume_keeps_its_home_here_and_restores_its_first_key_elsewhere(
    tmp_path: Path, make_settings: Callable[..., Settings], restore: str
) -> None:
    settings = make_settings({"TASUKI__ENVIRONMENTS__RESTORE": restore})
    remote = repo(tmp_path)
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    ctx = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, ctx.uuid)
    environment = TaskEnvironment(settings, str(remote))

    first = environment.prepare(ctx, checkout)
    assert first.outcome == "built", first.log_tail
    assert first.created == (".venv/",)
    assert ".venv" not in checkout.git("status", "--porcelain")  # excluded: never committed

    # The agent edits the setup (its key would change), then the worker dies; a resume on this host keeps all.
    (checkout.path / ".tasuki" / "setup.sh").write_text(SETUP + "echo changed\n")
    kept = environment.prepare(ctx, checkout)
    assert kept.outcome == "kept"
    assert kept.key == first.key

    # A resume on another host: a new home and a clean checkout, the key the task began with.
    checkout.release()
    shutil.rmtree(Path(settings.contexts.workspaces_dir) / IDLE_DIR)  # no warm copy there
    elsewhere = checkout_for(settings, remote, ctx.uuid)
    (elsewhere.path / ".tasuki" / "setup.sh").write_text(SETUP + "echo changed\n")
    restored = environment.prepare(ctx, elsewhere)
    assert restored.outcome == "restored"
    assert restored.key == first.key
    assert inside(settings, elsewhere, ".venv/marker") == "built\n"
    assert inside(settings, elsewhere, f"{HOME}/.cache/x") == "cached\n"
    assert restored.created == (".venv/",)
    again = environment.prepare(ctx, elsewhere)  # and a resume there keeps it, layers or copy
    assert (again.outcome, inside(settings, elsewhere, ".venv/marker")) == ("kept", "built\n")
    elsewhere.release()
    ctx.release()


def test_without_bubblewrap_the_setup_runs_for_every_task_and_says_why(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings({"TASUKI__SANDBOX__BACKEND": "none"})
    remote = repo(tmp_path)
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    outcomes = []
    for n in range(2):
        ctx = store.create({**TASK_KEY, "task_id": str(n)}, {})
        checkout = checkout_for(settings, remote, ctx.uuid)
        with capture_logs() as logs:
            outcomes.append(TaskEnvironment(settings, str(remote)).prepare(ctx, checkout))
        checkout.release()
        ctx.release()
    assert [o.outcome for o in outcomes] == ["built", "built"]
    assert "snapshots need sandbox.backend: bubblewrap" in outcomes[1].snapshot
    assert any("snapshots need sandbox.backend: bubblewrap" in e["event"] for e in logs)


def test_a_declaration_that_cannot_be_read_is_told_and_nothing_runs(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings()
    remote = make_buggy_repo(tmp_path / "repo")
    (remote / ".devcontainer").mkdir()
    (remote / ".devcontainer" / "devcontainer.json").write_text('{"postCreateCommand": "pip install -e .",,,}')
    git(remote, "add", "-A")
    git(remote, "commit", "-q", "-m", "a broken devcontainer")
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    ctx = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, ctx.uuid)
    report = TaskEnvironment(settings, str(remote)).prepare(ctx, checkout)
    assert report.outcome == "failed"
    assert ".devcontainer/devcontainer.json" in report.first_message()
    assert "was not set up" in report.first_message()
    assert ctx.read_state()["environment"]["line"].startswith("setup failed: .devcontainer/devcontainer.json")
    checkout.release()
    ctx.release()


@pytest.mark.parametrize("restore", ["layers", "copy"])
def test_a_restore_cut_short_is_restored_whole_at_the_resume_and_still_never_committed(
    tmp_path: Path, make_settings: Callable[..., Settings], restore: str
) -> None:
    """A worker killed mid-restore leaves part of the snapshot's files in the checkout and home, some of them torn,
    and no marker (it is written once the environment is whole). The resume on this host restores over them: the
    environment is whole again, and what the restore made is still excluded from the commit, although git saw it
    before the resume's restore began."""
    settings = make_settings({"TASUKI__ENVIRONMENTS__RESTORE": restore})
    remote = repo(tmp_path)
    store = ContextStore(settings.contexts.base_dir, fsync="never")
    environment = TaskEnvironment(settings, str(remote))
    first = store.create(TASK_KEY, {})
    checkout = checkout_for(settings, remote, first.uuid)
    built = environment.prepare(first, checkout)
    assert built.outcome == "built"
    checkout.release()
    first.release()

    ctx = store.create({**TASK_KEY, "task_id": "2"}, {})
    shutil.rmtree(Path(settings.contexts.workspaces_dir) / IDLE_DIR)  # not the warm copy that holds the build
    cut = checkout_for(settings, remote, ctx.uuid)
    # What the first attempt left: its key recorded as building, a torn file in the checkout, half the home.
    ctx.update_state(environment={"key": built.key, "source": ".tasuki/setup.sh", "outcome": "building"})
    (cut.path / ".venv").mkdir()
    (cut.path / ".venv" / "marker").write_text("bu")
    (cut.home / ".cache").mkdir(parents=True)

    resumed = environment.prepare(ctx, cut)
    assert resumed.outcome == "restored"
    assert resumed.key == built.key
    assert inside(settings, cut, ".venv/marker") == "built\n"
    assert inside(settings, cut, f"{HOME}/.cache/x") == "cached\n"
    assert resumed.created == (".venv/",)
    assert ".venv" not in cut.git("status", "--porcelain")  # excluded: never committed
    cut.release()
    ctx.release()
