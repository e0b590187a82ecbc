"""The task's home and the env files (SPEC §17): what one bash call installs or declares, the next one has.

Real bubblewrap, real pip against a package index on loopback, real git for the checkout's home.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent.tools import Workspace, run_tool
from sandbox import envfiles
from sandbox.egress import egress_policy, egress_proxy
from sandbox.jail import Bubblewrap, NoSandbox, Sandbox, probe
from sandbox.settings import SandboxSettings
from tests.helpers.ci import cannot_run
from tests.helpers.package_index import INDEX_INTERNAL, make_wheel, package_index
from tests.helpers.stack import make_buggy_repo
from worker.checkout import Checkout
from worker.environment import maybe_sweep, snapshot_store
from worker.settings_models import Settings
from worker.workcopy import GitCache

BASE_PYTHON = Path(sys._base_executable)


@pytest.fixture(scope="module")
def bubblewrap() -> Bubblewrap:
    candidate = Bubblewrap(SandboxSettings(read_only_paths=(Path(sys.base_prefix),)))
    problem = probe(candidate)
    if problem is not None:
        cannot_run(problem)
    return candidate


def bash(sandbox: Sandbox, checkout: Path, home: Path, command: str) -> str:
    result = run_tool(
        Workspace(checkout),
        "bash",
        {"command": command},
        bash_timeout_s=120,
        max_output_chars=20000,
        sandbox=sandbox,
        limits=SandboxSettings().limits,
        home=home,
    )
    return result.output


def test_a_user_install_in_one_call_is_importable_in_the_next_and_tmp_stays_private(
    bubblewrap: Bubblewrap, tmp_path: Path
) -> None:
    checkout, home = tmp_path / "task", tmp_path / "task.home"
    checkout.mkdir()
    home.mkdir(mode=0o700)
    # The index is on the host's loopback: reached through the task's egress proxy, as sandbox.allowed_internal says.
    policy = egress_policy("full", (), (INDEX_INTERNAL,))
    with package_index() as index, egress_proxy(policy, lambda _: None) as egress:
        index.add(make_wheel(tmp_path / "wheels", "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"}))
        installed = bash(
            bubblewrap.with_egress(egress),
            checkout,
            home,
            f"PIP_BREAK_SYSTEM_PACKAGES=1 {BASE_PYTHON} -m pip install -q --user --no-cache-dir "
            f"--index-url {index.url} tinypkg && echo $HOME && touch /tmp/call-one",
        )
    assert "exit code: 0" in installed, installed
    assert "/tmp/home" in installed
    used = bash(
        bubblewrap, checkout, home, f"{BASE_PYTHON} -c 'import tinypkg; print(tinypkg.VALUE)'; ls /tmp/call-one"
    )
    assert "42" in used
    assert "No such file" in used  # the call's /tmp is its own
    assert list((home / ".local" / "lib").glob("python*/site-packages/tinypkg"))  # on the host, in the task's home


@pytest.mark.parametrize("backend", ["bubblewrap", "none"])
def test_env_files_apply_to_every_later_call_without_secrets_or_torn_lines(
    backend: str, bubblewrap: Bubblewrap, tmp_path: Path
) -> None:
    sandbox: Sandbox = bubblewrap if backend == "bubblewrap" else NoSandbox()
    checkout, home = tmp_path / "task", tmp_path / "task.home"
    checkout.mkdir()
    home.mkdir(mode=0o700)
    bash(
        sandbox,
        checkout,
        home,
        'mkdir -p "$HOME/bin" && printf "#!/bin/sh\\necho tool-ran\\n" > "$HOME/bin/mytool" '
        '&& chmod +x "$HOME/bin/mytool" && echo "$HOME/bin" >> "$TASUKI_PATH" '
        '&& echo GREETING=hello >> "$TASUKI_ENV" '
        '&& printf "NOTES<<EOF\\nline one\\nline two\\nEOF\\nNPM_TOKEN=s3cr3t-value\\nHALF<<END\\ntorn" '
        '>> "$TASUKI_ENV"',
    )
    with capture_logs() as logs:
        seen = bash(sandbox, checkout, home, 'mytool; echo "g=$GREETING"; echo "$NOTES"; echo "t=${NPM_TOKEN:-none}"')
    assert "tool-ran" in seen
    assert "g=hello" in seen
    assert "line one\nline two" in seen
    assert "t=none" in seen  # a secret-looking name is dropped, as from the worker's own environment
    assert {"event": "tool_env_secret_dropped", "variable": "NPM_TOKEN", "log_level": "warning"} in logs
    assert any(e["event"] == "env file line skipped" and "HALF<<END" in e["reason"] for e in logs)


def test_env_file_forms_and_what_is_skipped() -> None:
    text = "A=1\nB=x=y\n\nC<<EOF\nmulti\nline\nEOF\nnot a line\n1BAD=2\nHOME=/elsewhere\nA=2\r\nD=nul\x00\n"
    variables, skipped = envfiles.parse_env(text)
    assert variables == {"A": "2", "B": "x=y", "C": "multi\nline"}
    assert [reason.split(":", 1)[0] for reason in skipped] == ["env line 8", "env line 9", "env line 10", "env line 12"]
    path, path_skipped = envfiles.parse_path("/a\nrelative/dir\n/b\n\n/a\n")
    assert path == ("/a", "/b")  # the last line first; a repeated directory counts where it was written last
    assert len(path_skipped) == 1


def test_the_checkouts_home_is_private_kept_on_resume_and_deleted_on_release(tmp_path: Path) -> None:
    remote = make_buggy_repo(tmp_path / "remote")
    workspaces = tmp_path / "workspaces"
    cache = GitCache(tmp_path / "git-cache", workspaces)
    checkout = Checkout(workspaces / "task-1", str(remote), "tasuki/1", cache=cache)
    checkout.prepare(fresh=True)
    assert checkout.home == workspaces / "task-1.home"
    assert stat.S_IMODE(os.stat(checkout.home).st_mode) == 0o700
    (checkout.home / "kept").write_text("from attempt 1")
    again = Checkout(workspaces / "task-1", str(remote), "tasuki/1", cache=cache)
    again.prepare(steps=1)  # a resume on this host
    assert (again.home / "kept").read_text() == "from attempt 1"
    again.release()
    assert not again.home.exists()


def test_homes_whose_task_is_long_gone_are_swept_with_the_stale_checkouts(tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces"
    cache = GitCache(tmp_path / "git-cache", workspaces, keep_s=3600)
    for name in ("old.home", "recent.home", "old", ".aside-x.home-1"):
        (workspaces / name).mkdir(parents=True)
    now = os.stat(workspaces / "recent.home").st_mtime
    for name in ("old.home", "old", ".aside-x.home-1"):
        os.utime(workspaces / name, (now - 7200, now - 7200))
    cache.evict(now)
    assert sorted(p.name for p in workspaces.iterdir()) == ["old", "recent.home"]  # a stale checkout is not its job


def test_the_hourly_sweep_drops_snapshots_unused_for_keep_days_once_an_hour(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(
        {"TASUKI__ENVIRONMENTS__SNAPSHOTS_DIR": str(tmp_path / "snapshots"), "TASUKI__ENVIRONMENTS__KEEP_DAYS": "1"}
    )
    store = snapshot_store(settings)
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    (home / ".tasuki").mkdir(parents=True)
    (checkout / ".venv").mkdir(parents=True)
    (checkout / ".venv" / "cfg").write_text("x")
    now = time.time()
    store.publish("a" * 32, "owner/repo", home, checkout, [".venv/"], [], now=now - 3 * 86400)
    store.publish("b" * 32, "owner/repo", home, checkout, [".venv/"], [], now=now)
    assert [s.split("/")[-1] for s in maybe_sweep(settings, now)] == ["a" * 32]
    assert store.find("b" * 32) is not None
    store.publish("c" * 32, "owner/repo", home, checkout, [".venv/"], [], now=now - 3 * 86400)
    assert maybe_sweep(settings, now + 1800) == []  # not again within the hour, though c is unused for days
    assert [s.split("/")[-1] for s in maybe_sweep(settings, now + 3600)] == ["c" * 32]
