"""What goes wrong around a task's environment (SPEC §17 "Bad input and faults"), through the worker: a worker
killed mid-setup, a setup that fills the disk, a snapshot too big, a declaration that does not parse.

Real bubblewrap, real git, real pip against a package index on loopback, real ``celery worker`` processes where a
worker dies. The setup secret's worker-level path is in tests/test_environment_tasks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.snapshots import BUILDING, SnapshotStore
from tests.helpers.ci import bubblewrap_here
from tests.helpers.package_index import PackageIndex, make_wheel, package_index
from tests.helpers.stack import git, local_request, make_buggy_repo
from tests.helpers.worker_scenarios import context_records, finish_turn, tool
from tests.test_environment_tasks import (
    IMPORT,
    bash_outputs,
    first_user_message,
    repo_with_setup,
    run_task,
    setup_record,
    venv_setup,
)
from tests.test_monitor_chaos import FINISH_TIMEOUT_S, chaos_stack, running_state
from worker.settings_models import Settings

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    with package_index() as served:
        served.add(make_wheel(tmp_path / "wheels", "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"}))
        yield served


def store_at(root: Path) -> SnapshotStore:
    return SnapshotStore(root, keep_per_repository=3, keep_days=30, max_bytes=10**12)


def leftovers(root: Path) -> list[str]:
    """The store's temporary directories (a publish under way, or a crash's)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith(BUILDING)) if root.is_dir() else []


# -- a worker killed while its setup runs ---------------------------------------------------------------


def test_a_worker_killed_during_the_setup_resumes_elsewhere_and_builds_cleanly(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    gate = tmp_path / "gate"  # bound read-only into the sandbox: the setup waits for the test to open it
    gate.mkdir()
    repo = repo_with_setup(
        tmp_path / "repo",
        'mkdir -p built && echo half > built/part\necho started > "$HOME/started"\n'
        f"until [ -e {gate}/open ]; do sleep 0.05; done\necho whole > built/whole\n",
    )
    snapshots = tmp_path / "environments"
    env = {
        "TASUKI__ENVIRONMENTS__SNAPSHOTS_DIR": str(snapshots),
        "TASUKI__SANDBOX__READ_ONLY_PATHS": json.dumps([str(gate)]),
    }
    entries = [{"content": "Look.", "tool_calls": [tool("bash", command="cat built/whole built/part")]}, finish_turn()]
    with chaos_stack(tmp_path, redis_url, entries, **env) as (stack, _):
        doomed = stack.start_worker("w1", queues="tasks")
        uuid = stack.send(local_request(repo, prompt="Look at the build.", task_id="1"))
        workspaces = tmp_path / "workspaces"
        stack.wait_until(lambda: list(workspaces.glob("*.home/started")), what="the setup running")
        state = running_state(stack, uuid)
        assert state is not None
        assert state["environment"]["outcome"] == "building"
        key = state["environment"]["key"]
        assert store_at(snapshots).find(key) is None  # nothing published while it builds
        stack.start_worker("w2", queues="tasks")
        doomed.kill()  # mid-setup: built/ holds half of what the setup makes
        (gate / "open").touch()
        final = stack.wait_finished(uuid, FINISH_TIMEOUT_S)
        assert final["status"] == "completed", final
        assert final["attempt"] == 2
        directory = stack.contexts_dir / "completed" / uuid
        (record,) = [r for r in context_records(directory, "tools.jsonl") if r["tool_name"] == "setup"]
        assert record["result"]["outcome"] == "built", record["result"]
        assert record["result"]["key"] == key
        assert record["result"]["snapshot"] == ""  # kept: the resumed build started from an empty home
        assert "built/" in record["result"]["created"]
        assert "whole\nhalf" in bash_outputs(directory)[0]

        snapshot = store_at(snapshots).find(key)
        assert snapshot is not None
        assert (snapshot.checkout / "built" / "whole").read_text() == "whole\n"
        assert leftovers(snapshots) == []

        # The next task gets the clean build: the copy the resumed build left on its warm copy, unchanged since that
        # build was kept as the key's snapshot.
        second = stack.send(local_request(repo, prompt="Look again.", task_id="2"))
        assert stack.wait_finished(second, FINISH_TIMEOUT_S)["status"] == "completed"
        (again,) = [
            r
            for r in context_records(stack.contexts_dir / "completed" / second, "tools.jsonl")
            if r["tool_name"] == "setup"
        ]
        assert again["result"]["outcome"] == "reused", again["result"]


def test_a_publish_cut_short_is_never_found_and_is_swept(tmp_path: Path) -> None:
    """What a worker killed mid-publish leaves (its temporary directory, named for the key): never found, never
    restored, swept once it is stale and nobody builds the key."""
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / "lib").write_text("lib\n")
    root = tmp_path / "environments"
    store = store_at(root)
    key = "a" * 32
    published = store.publish(key, "team/calc", home, checkout, [".venv"], [], now=1000.0)
    # A copy of a complete snapshot, as a publish killed before its rename leaves it (manifest and all).
    crashed = root / f"{BUILDING}{'b' * 32}-dead"
    subprocess.run(["cp", "-a", str(published.path), str(crashed)], check=True)
    os.utime(crashed, (1000.0, 1000.0))
    assert store.find("b" * 32) is None
    with store.building("b" * 32):  # a build of that key under way: its directory is not the sweep's
        assert crashed.name not in store.sweep(now=1000.0 + 7200)
    assert crashed.name in store.sweep(now=1000.0 + 7200)
    assert leftovers(root) == []
    assert store.find(key) is not None


# -- a setup that fills the disk ------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def used(mount: Path) -> int:
    stat = os.statvfs(mount)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def test_a_setup_that_fills_the_disk_fails_the_setup_not_the_task(
    tmp_path: Path, make_settings: Callable[..., Settings], small_disk: Path
) -> None:
    repo = repo_with_setup(tmp_path / "repo", "echo filling\nhead -c 100M /dev/zero > huge.bin\necho never\n")
    outcome, directory, _ = run_task(
        make_settings,
        repo,
        ["echo working anyway; ls"],
        {
            "TASUKI__CONTEXTS__WORKSPACES_DIR": str(small_disk / "workspaces"),
            "TASUKI__ENVIRONMENTS__SNAPSHOTS_DIR": str(small_disk / "environments"),
        },
    )
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["result"]["outcome"] == "failed"
    told = first_user_message(directory)
    assert "No space left on device" in told
    assert "What it made was removed: it filled the disk." in told
    assert "working anyway" in bash_outputs(directory)[0]
    assert "huge.bin" not in bash_outputs(directory)[0]  # the agent started with room
    assert store_at(small_disk / "environments").find(record["result"]["key"]) is None
    assert leftovers(small_disk / "environments") == []
    assert used(small_disk) < MIB  # the task's checkout and home are gone with it


def test_an_environment_whose_snapshot_does_not_fit_is_used_and_not_kept(
    tmp_path: Path, make_settings: Callable[..., Settings], small_disk: Path
) -> None:
    # The setup's 40 MiB fit in the checkout (another disk); their copy does not fit in the snapshots' 64 MiB.
    repo = repo_with_setup(tmp_path / "repo", "mkdir -p data\nhead -c 40M /dev/zero > data/a\ncp data/a data/b\n")
    outcome, directory, _ = run_task(
        make_settings,
        repo,
        ["ls -s --block-size=M data"],
        {"TASUKI__ENVIRONMENTS__SNAPSHOTS_DIR": str(small_disk / "environments")},
    )
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["result"]["outcome"] == "built", record["result"]
    assert "not kept" in record["result"]["snapshot"]
    assert "No space left on device" in record["result"]["snapshot"]
    assert "40M a" in bash_outputs(directory)[0]  # the agent has its environment all the same
    assert "Note:" not in first_user_message(directory)
    assert store_at(small_disk / "environments").find(record["result"]["key"]) is None
    assert leftovers(small_disk / "environments") == []
    assert used(small_disk) < MIB


# -- a snapshot too big ---------------------------------------------------------------------------------


def test_a_snapshot_over_the_limit_is_not_kept_and_the_next_task_builds_again(
    tmp_path: Path, make_settings: Callable[..., Settings], index: PackageIndex
) -> None:
    repo = repo_with_setup(tmp_path / "repo", venv_setup(index.url))
    small = {"TASUKI__ENVIRONMENTS__MAX_SNAPSHOT_BYTES": str(MIB)}
    first, first_dir, _ = run_task(make_settings, repo, [IMPORT], small)
    assert first["status"] == "completed", first
    record = setup_record(first_dir)
    assert record["result"]["outcome"] == "built"
    assert "environments.max_snapshot_bytes (1.0 MiB)" in record["result"]["snapshot"]
    assert "tinypkg says 42" in bash_outputs(first_dir)[0]  # the task used its environment
    asked = len(index.requests)

    second, second_dir, _ = run_task(make_settings, repo, [IMPORT], small)
    assert second["status"] == "completed", second
    assert setup_record(second_dir)["result"]["outcome"] == "built"  # nothing to restore: built again
    assert len(index.requests) > asked


# -- a declaration that does not parse ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "text", "error"),
    [
        (".devcontainer/devcontainer.json", '{"postCreateCommand": "pip install -e .",\n', "devcontainer.json"),
        (
            ".github/workflows/copilot-setup-steps.yml",
            "jobs:\n  copilot-setup-steps:\n    steps: [\n      - run: echo hi\n",
            "copilot-setup-steps.yml",
        ),
    ],
)
def test_a_declaration_that_does_not_parse_is_one_line_to_the_agent(
    tmp_path: Path, make_settings: Callable[..., Settings], path: str, text: str, error: str
) -> None:
    repo = make_buggy_repo(tmp_path / "repo")
    (repo / path).parent.mkdir(parents=True)
    (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "declare")
    outcome, directory, requests = run_task(make_settings, repo, ["echo working"])
    assert outcome["status"] == "completed", outcome
    record = setup_record(directory)
    assert record["status"] == "error"
    assert record["result"]["outcome"] == "failed"
    line = record["error"]
    assert "\n" not in line
    assert error in line
    assert "Traceback" not in line
    told = first_user_message(directory)
    assert f"({line})" in told
    assert line in json.dumps(requests[0]["body"]["messages"])
    state = json.loads((directory / "state.json").read_text())
    assert state["environment"]["line"] == f"setup failed: {line}"
