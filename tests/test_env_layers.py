"""Restores by layers (SPEC §17, docs/environments.md "Layers"): the snapshot's directories seen through overlayfs in
real bubblewrap sandboxes, nothing copied, the snapshot never changed, the agent without any capability.

The tasks' tests are in tests/test_environment_tasks.py and tests/test_environment_resume.py (both restores);
these are the mechanism's own: what the agent's writes do, what it can see and hold, and the fallback to copies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from contexts import ContextStore
from sandbox import layers
from sandbox.host import HOST_ENV
from sandbox.jail import HOME, Bubblewrap
from sandbox.services import ServiceJail
from sandbox.settings import SandboxSettings
from sandbox.snapshot_files import SnapshotError
from sandbox.snapshots import SnapshotStore
from tests.helpers.ci import bubblewrap_here
from worker import environment as environment_module
from worker.environment import TaskEnvironment
from worker.settings_models import Settings


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture
def sandbox() -> Bubblewrap:
    return Bubblewrap(SandboxSettings(network="none"))


@pytest.fixture
def laid(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A snapshot's ``.venv`` (a file, a directory, a script), and a task's home and checkout with it laid."""
    lower = tmp_path / "snapshot" / "checkout"
    (lower / ".venv" / "lib").mkdir(parents=True)
    (lower / ".venv" / "lib" / "module.py").write_text("VALUE = 42\n")
    (lower / ".venv" / "lib" / "old.py").write_text("old\n")
    (lower / ".venv" / "run").write_text("#!/bin/sh\necho ran from the snapshot\n")
    (lower / ".venv" / "run").chmod(0o755)
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    assert layers.lay(home, checkout, lower, [".venv"]) == (".venv",)
    yield lower, home, checkout
    layers.drop(home)


AGENT_ENV = {"PATH": "/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8"}


def run(sandbox: Bubblewrap, checkout: Path, home: Path, script: str) -> subprocess.CompletedProcess[str]:
    argv, cwd = sandbox.command(["bash", "-c", script], checkout, home, AGENT_ENV)
    return subprocess.run(argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, timeout=60, check=False)


def test_the_agents_writes_land_in_its_own_layer_and_never_in_the_snapshot(
    sandbox: Bubblewrap, laid: tuple[Path, Path, Path]
) -> None:
    lower, home, checkout = laid
    first = run(sandbox, checkout, home, ".venv/run && echo 'VALUE = 24' > .venv/lib/module.py && rm .venv/lib/old.py"
                " && mkdir .venv/new && echo installed > .venv/new/pkg.py && ls .venv/lib")
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["ran", "from", "the", "snapshot", "module.py"]
    # The next command of the task sees what the last one did (the layer lasts for the task) ...
    second = run(sandbox, checkout, home, "cat .venv/lib/module.py .venv/new/pkg.py; test -e .venv/lib/old.py; echo $?")
    assert second.stdout.split("\n")[:3] == ["VALUE = 24", "installed", "1"], second.stderr
    # ... the snapshot is as it was, and the checkout on the host holds an empty mount point only.
    assert (lower / ".venv" / "lib" / "module.py").read_text() == "VALUE = 42\n"
    assert (lower / ".venv" / "lib" / "old.py").exists()
    assert not (lower / ".venv" / "new").exists()
    assert list((checkout / ".venv").iterdir()) == []
    # A new task (its layers laid again) starts from the snapshot.
    layers.lay(home, checkout, lower, [".venv"])
    third = run(sandbox, checkout, home, "cat .venv/lib/module.py; ls .venv")
    assert third.stdout.split() == ["VALUE", "=", "42", "lib", "run"], third.stderr


def test_the_agent_holds_no_capability_and_cannot_see_or_undo_its_layers(
    sandbox: Bubblewrap, laid: tuple[Path, Path, Path]
) -> None:
    _, home, checkout = laid
    script = (
        "grep -E '^Cap(Eff|Prm|Inh|Bnd|Amb)' /proc/self/status; grep NoNewPrivs /proc/self/status;"
        f" ls -A {layers.INSIDE} | wc -l; touch {layers.INSIDE}/x 2>/dev/null && echo wrote-layers;"
        " umount .venv 2>/dev/null && echo unmounted; mount -t tmpfs t /tmp 2>/dev/null && echo mounted;"
        " python3 -c 'import pty, os; os.openpty(); print(\"pty ok\")'"
    )
    done = run(sandbox, checkout, home, script)
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines[:5]] == ["0000000000000000"] * 5, done.stdout
    assert lines[5].split() == ["NoNewPrivs:", "1"]
    assert lines[6:] == ["0", "pty ok"], done.stdout + done.stderr


def test_a_symlink_on_the_way_to_a_layer_is_refused(
    sandbox: Bubblewrap, laid: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _lower, home, checkout = laid
    nested = tmp_path / "nested"
    (nested / "lower" / "web" / "node_modules").mkdir(parents=True)
    (checkout / "web").symlink_to("/usr")
    with pytest.raises(SnapshotError, match="passes through a symlink"):
        layers.lay(home, checkout, nested / "lower", ["web/node_modules"])
    # One the task's commands make between two calls: the helper refuses to mount through it.
    (checkout / "web").unlink()
    (checkout / "web").mkdir()
    layers.lay(home, checkout, nested / "lower", ["web/node_modules"])
    moved = run(sandbox, checkout, home, "mv web web2 && ln -s /usr web && echo moved")
    assert moved.stdout.strip() == "moved", moved.stderr
    refused = run(sandbox, checkout, home, "echo should-not-run")
    assert refused.returncode == 125
    assert "passes through a symlink" in refused.stderr
    assert "should-not-run" not in refused.stdout


def test_a_service_sees_the_layers_read_only(
    tmp_path: Path, laid: tuple[Path, Path, Path]
) -> None:
    _, home, checkout = laid
    sandbox = Bubblewrap(SandboxSettings(network="none"))
    assert run(sandbox, checkout, home, "echo changed > .venv/lib/module.py").returncode == 0
    jail = ServiceJail(SandboxSettings(), checkout, home)
    script = "cat .venv/lib/module.py; echo x > .venv/lib/module.py 2>/dev/null || echo read-only"
    argv, cwd = jail.command(script, "db")
    env = jail.launch_env("db")
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split("\n")[:2] == ["changed", "read-only"], done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="switches to an unprivileged user (runs as root in CI)")
def test_an_unprivileged_worker_can_layer_too(tmp_path: Path) -> None:
    """The compose image's worker runs as its own user, not root: the probe's real layered command, run by bwrap as
    an unprivileged user (its files that user's), passes."""
    scratch = Path(tempfile.mkdtemp(prefix="tasuki-nobody-"))  # in /tmp: a path that user can reach
    sandbox = Bubblewrap(SandboxSettings(), path=["/usr/bin", "/bin"])
    switch = 'chown -R nobody:nogroup "$0" && exec setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"'

    def as_nobody(
        argv: Sequence[str], checkout: Path, home: Path, env: Mapping[str, str]
    ) -> tuple[list[str], Path]:
        wrapped, cwd = sandbox.command(argv, checkout, home, env)
        return ["sh", "-c", switch, str(scratch), *wrapped], cwd

    try:
        assert layers.layers_probe(scratch, as_nobody) is None
        assert sorted(p.name for p in scratch.iterdir()) == []  # the probe's files went with it
    finally:
        shutil.rmtree(scratch)


def test_where_layers_cannot_be_used_restores_copy_and_the_worker_says_why(
    tmp_path: Path, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe finds no setpriv (the helper's way to drop the capabilities): auto copies and says so; layers
    asked for by name fail the environment (the task goes on without it) with the same reason."""
    real_program = layers.program
    monkeypatch.setattr(layers, "program", lambda name: None if name == "setpriv" else real_program(name))
    environment_module._layers_probed.clear()
    try:
        from tests.test_environment_resume import TASK_KEY, checkout_for, repo

        remote = repo(tmp_path)
        for restore, outcome in (("auto", "built"), ("layers", "failed")):
            settings = make_settings({"TASUKI__ENVIRONMENTS__RESTORE": restore})
            store = ContextStore(settings.contexts.base_dir, fsync="never")
            ctx = store.create({**TASK_KEY, "task_id": restore}, {})
            checkout = checkout_for(settings, remote, ctx.uuid)
            with capture_logs() as logs:
                report = TaskEnvironment(settings, str(remote)).prepare(ctx, checkout)
            if restore == "auto":
                assert report.outcome == outcome
                checkout.release()
                ctx.release()
                shutil.rmtree(checkout.path.parent / ".idle")  # the next task's warm copy holds no environment
                continue
            assert report.outcome == outcome, report
            assert "setpriv not found" in str(report.error)
            assert "environments.restore is layers" in str(report.error)
        # auto, on the second task of the key: a restore, by copy, and the one line that says why
        settings = make_settings({"TASUKI__ENVIRONMENTS__RESTORE": "auto"})
        store = ContextStore(settings.contexts.base_dir, fsync="never")
        ctx = store.create({**TASK_KEY, "task_id": "again"}, {})
        shutil.rmtree(Path(settings.contexts.workspaces_dir) / ".idle", ignore_errors=True)
        checkout = checkout_for(settings, remote, ctx.uuid)
        environment_module._layers_probed.clear()
        with capture_logs() as logs:
            report = TaskEnvironment(settings, str(remote)).prepare(ctx, checkout)
        assert (report.outcome, report.layers) == ("restored", False)
        assert (checkout.path / ".venv" / "marker").read_text() == "built\n"  # copied
        warned = [e for e in logs if e["event"].startswith("environments are restored by copy")]
        assert len(warned) == 1
        assert "setpriv" in warned[0]["reason"]
        state = json.loads((ctx.path / "state.json").read_text())
        assert state["environment"]["outcome"] == "restored"
        # layers asked for: a first build there is still kept as the key's snapshot
        other = repo(tmp_path / "other")
        settings = make_settings({"TASUKI__ENVIRONMENTS__RESTORE": "layers"})
        ctx = ContextStore(settings.contexts.base_dir, fsync="never").create({**TASK_KEY, "task_id": "other"}, {})
        report = TaskEnvironment(settings, str(other)).prepare(ctx, checkout_for(settings, other, ctx.uuid))
        assert (report.outcome, report.snapshot) == ("built", "")
    finally:
        environment_module._layers_probed.clear()


def test_the_worker_says_once_how_its_environments_are_restored(tmp_path: Path) -> None:
    environment_module._layers_probed.clear()
    try:
        with capture_logs() as logs:
            for _ in range(2):
                assert environment_module.layers_unavailable(tmp_path / "workspaces", Bubblewrap(
                    SandboxSettings())) is None
        assert [(entry["event"], entry["log_level"]) for entry in logs] == [
            ("environments are restored by layers", "info")
        ]
    finally:
        environment_module._layers_probed.clear()


def test_the_homes_directories_are_layered_and_its_env_files_copied(sandbox: Bubblewrap, tmp_path: Path) -> None:
    """A setup's caches in the home (``~/.cargo``, ``~/go``: often larger than the checkout's environment) are layered
    like the checkout's directories; the home's files and ``.tasuki`` (the env files the worker reads) are copied."""
    built_home, built_checkout = tmp_path / "built-home", tmp_path / "built-checkout"
    (built_home / ".cargo" / "registry").mkdir(parents=True)
    (built_home / ".cargo" / "registry" / "crate.rs").write_text("pub fn one() {}\n")
    (built_home / ".tasuki").mkdir()
    (built_home / ".tasuki" / "env").write_text("CARGO_HOME=/tmp/home/.cargo\n")
    (built_home / ".profile").write_text("# a file: copied\n")
    (built_checkout / "target").mkdir(parents=True)
    (built_checkout / "target" / "build.o").write_text("object\n")
    store = SnapshotStore(tmp_path / "snapshots", keep_per_repository=3, keep_days=14, max_bytes=1 << 30)
    snapshot = store.publish("a" * 32, "owner/repo", built_home, built_checkout, ["target/"], [], now=1.0)
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()

    assert store.lay(snapshot, home, checkout) == ("target",)

    assert (home / ".tasuki" / "env").read_text() == "CARGO_HOME=/tmp/home/.cargo\n"  # copied: the worker reads it
    assert (home / ".profile").read_text() == "# a file: copied\n"
    assert list((home / ".cargo").iterdir()) == []  # layered: only a mount point on the host
    assert list((checkout / "target").iterdir()) == []
    cargo = f"{HOME}/.cargo"
    done = run(sandbox, checkout, home, f"cat {cargo}/registry/crate.rs target/build.o; echo new > {cargo}/added")
    assert done.stdout == "pub fn one() {}\nobject\n", done.stderr
    assert run(sandbox, checkout, home, f"cat {HOME}/.cargo/added").stdout == "new\n"  # it lasts for the task
    assert not (snapshot.home / ".cargo" / "added").exists()  # and never reaches the snapshot
    assert [layer.home for layer in layers.layers_of(home)] == [False, True]
