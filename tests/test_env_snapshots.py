"""Environment snapshots (SPEC §17 "Snapshot and restore"): the key, a publish and restore of a real virtualenv,
the refusals, a crash mid-publish, the sweep, and two processes that need the same key building it once."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import filelock
import pytest

from sandbox.declarations import find_declaration, key_files
from sandbox.settings import EnvironmentsSettings
from sandbox.snapshot_files import fingerprint
from sandbox.snapshots import (
    DAY_S,
    STALE_BUILD_S,
    Snapshot,
    SnapshotError,
    SnapshotRefused,
    SnapshotStore,
    describe_image,
    environment_key,
    worker_image,
)
from tests.helpers.context_support import wait_for
from tests.helpers.environments import make_venv, next_clock_tick, time_restore, venv_runs
from tests.helpers.tmpfs import bind_mounted, mounted_tmpfs
from worker.environment import snapshot_store
from worker.settings_models import Settings

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000.0
KEY = "0123456789abcdef0123456789abcdef"
MIB = 1024 * 1024


def make_store(root: Path, **limits: int) -> SnapshotStore:
    settings = {"keep_per_repository": 3, "keep_days": 14, "max_bytes": 1 << 30, **limits}
    return SnapshotStore(root, **settings)


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    """A home and a checkout as a setup leaves them: a venv in each, env files, a tracked file not to keep."""
    home, checkout = tmp_path / "task/home", tmp_path / "task/checkout"
    home.mkdir(parents=True, mode=0o700)
    checkout.mkdir(parents=True)
    (home / ".tasuki").mkdir()
    (home / ".tasuki/env").write_text("DATABASE_URL=sqlite:///x\n")
    (home / ".tasuki/path").write_text("/tmp/home/.local/bin\n")
    (home / ".local/bin").mkdir(parents=True)
    tool = home / ".local/bin/tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    make_venv(checkout / ".venv")
    (checkout / "src").mkdir()
    (checkout / "src/app.py").write_text("tracked, not part of the environment\n")
    (checkout / "build/gen").mkdir(parents=True)
    (checkout / "build/gen/schema.py").write_text("generated\n")
    return home, checkout


def test_key_follows_the_repository_declaration_key_files_and_image_only(tmp_path: Path) -> None:
    settings = EnvironmentsSettings(key_files=("tools/*.txt",))
    (tmp_path / "tools").mkdir()
    (tmp_path / "uv.lock").write_text("version = 1\n")
    (tmp_path / "tools/versions.txt").write_text("ruff 0.5\n")
    (tmp_path / "app.py").write_text("print(1)\n")

    def key(repository: str = "owner/repo", image: str = "tasuki 1; python3 3.13") -> str:
        declaration = find_declaration(tmp_path, repository, settings)
        assert declaration is not None
        return environment_key(repository, declaration, key_files(tmp_path, settings), image)

    first = key()
    assert len(first) == 32
    assert first == key()
    (tmp_path / "app.py").write_text("print(2)\n")
    (tmp_path / "README.md").write_text("docs\n")
    assert key() == first
    changed = []
    (tmp_path / "uv.lock").write_text("version = 2\n")
    changed.append(key())
    (tmp_path / "tools/versions.txt").write_text("ruff 0.6\n")
    changed.append(key())
    (tmp_path / "package-lock.json").write_text("{}")  # a new toolchain: a new step and a new key file
    changed.append(key())
    (tmp_path / ".tasuki").mkdir()
    (tmp_path / ".tasuki/setup.sh").write_text("make deps\n")
    changed.append(key())
    (tmp_path / ".tasuki/setup.sh").write_text("make deps all\n")
    changed.append(key())
    changed.append(key(image="tasuki 2; python3 3.13"))
    changed.append(key(repository="owner/fork"))
    assert len({first, *changed}) == 1 + len(changed)


def test_worker_image_names_tasuki_and_the_toolchains_on_path(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, output in (("node", "v99.1.0"), ("go", "go version go9.9 linux/amd64")):
        program = fake / name
        program.write_text(f"#!/bin/sh\necho '{output}'\n")
        program.chmod(0o755)
    described = describe_image(str(fake))
    assert described.startswith("tasuki ")
    assert "node v99.1.0" in described
    assert "go go version go9.9" in described
    assert "python3" not in described
    assert "rustc" not in described
    assert worker_image() is worker_image()  # learnt once per process
    assert "python3 Python 3." in worker_image()


def test_a_hung_toolchain_does_not_hang_the_worker(tmp_path: Path) -> None:
    (tmp_path / "rustc").write_text("#!/bin/sh\nexec sleep 600\n")
    (tmp_path / "rustc").chmod(0o755)
    assert describe_image(str(tmp_path), timeout=0.2).endswith("rustc (no version)")


def test_publish_then_restore_gives_a_private_working_copy(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    store = make_store(tmp_path / "snapshots")
    assert store.find(KEY) is None
    snapshot = store.publish(KEY, "owner/repo", home, checkout, [".venv", "build/gen", "missing"], ["s3cr3t"], NOW)
    assert snapshot.paths == (".venv", "build/gen")
    assert store.find(KEY) == snapshot
    assert not (snapshot.checkout / "src").exists()
    assert not list((tmp_path / "snapshots").glob(".building-*"))
    for directory in (tmp_path / "snapshots", snapshot.path.parent, snapshot.path, snapshot.checkout):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((snapshot.path / "manifest.json").stat().st_mode) == 0o600

    new_home, new_checkout = tmp_path / "next/home", tmp_path / "next/checkout"
    new_home.mkdir(parents=True, mode=0o700)
    new_checkout.mkdir(parents=True)
    (new_checkout / "src").mkdir()
    store.restore(snapshot, new_home, new_checkout, now=NOW + 60)

    assert venv_runs(new_checkout / ".venv/bin/python") == f"{new_checkout / '.venv'} 42"
    assert (new_checkout / ".venv/bin/python").is_symlink()
    assert (new_home / ".tasuki/env").read_text() == "DATABASE_URL=sqlite:///x\n"
    assert os.access(new_home / ".local/bin/tool", os.X_OK)
    assert (new_checkout / "build/gen/schema.py").read_text() == "generated\n"
    assert stat.S_IMODE(new_home.stat().st_mode) == 0o700
    assert (snapshot.path / "last-used").stat().st_mtime == NOW + 60

    (new_checkout / ".venv/lib").chmod(0o755)
    (site,) = new_checkout.glob(".venv/lib/python3*/site-packages")
    (site / "kept_module.py").write_text("ANSWER = 'changed by the task'\n")
    (new_home / ".tasuki/env").write_text("")
    (snapshot_site,) = snapshot.checkout.glob(".venv/lib/python3*/site-packages")
    assert (snapshot_site / "kept_module.py").read_text() == "ANSWER = 42\n"
    assert (snapshot.home / ".tasuki/env").read_text() == "DATABASE_URL=sqlite:///x\n"


def test_a_venv_in_the_home_restores_at_another_path_and_runs(tmp_path: Path) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    checkout.mkdir()
    make_venv(home / "tools")
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", home, checkout, [], [], NOW)
    restored = tmp_path / "restored-home"
    store.restore(snapshot, restored, tmp_path / "restored-checkout")
    assert venv_runs(restored / "tools/bin/python") == f"{restored / 'tools'} 42"


@pytest.mark.parametrize("where", ["home/.npmrc", "checkout/.venv/lib/deep/config.ini"])
def test_a_secrets_value_in_a_file_refuses_the_snapshot_naming_both(
    tmp_path: Path, built: tuple[Path, Path], where: str
) -> None:
    home, checkout = built
    secret = "npm_" + "x" * 40
    relative = where.split("/", 1)[1]
    target = (home if where.startswith("home/") else checkout) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    # The value straddles the scan's chunks: a match cut in two must still be found.
    target.write_bytes(b"a" * ((1 << 20) - 7) + f"//registry/:_authToken={secret}\n".encode())
    store = make_store(tmp_path / "snapshots")
    with pytest.raises(SnapshotRefused) as refused:
        store.publish(KEY, "owner/repo", home, checkout, [".venv"], {"EMPTY": "", "NPM_TOKEN": secret}, NOW)
    assert str(refused.value) == f"contains the value of NPM_TOKEN in {where}: not kept"
    assert secret not in str(refused.value)
    assert store.find(KEY) is None
    assert sorted(path.name for path in (tmp_path / "snapshots").iterdir()) == []


def test_secret_values_without_names_and_empty_values(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    (home / ".pypirc").write_text("password = pypi-token-value\n")
    store = make_store(tmp_path / "snapshots")
    store.publish(KEY, "owner/repo", home, checkout, [], ["", "not-in-any-file"], NOW)
    with pytest.raises(SnapshotRefused, match=r"^contains the value of a setup secret in home/\.pypirc: not kept$"):
        store.publish("f" * 32, "owner/repo", home, checkout, [], ["pypi-token-value"], NOW)


def test_a_named_pipe_in_the_home_is_neither_waited_for_nor_scanned(tmp_path: Path) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    os.mkfifo(home / "pipe")
    snapshot = make_store(tmp_path / "snapshots").publish(KEY, "owner/repo", home, checkout, [], ["x"], NOW)
    assert stat.S_ISFIFO((snapshot.home / "pipe").lstat().st_mode)


def test_an_environment_over_max_bytes_is_refused_with_its_size(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    (home / "big.bin").write_bytes(b"\0" * (3 << 20))
    store = make_store(tmp_path / "snapshots", max_bytes=2 << 20)
    with pytest.raises(SnapshotRefused, match=r"^the environment is 3\.\d MiB, over environments\.max_snapshot_bytes"):
        store.publish(KEY, "owner/repo", home, checkout, [".venv"], [], NOW)
    assert store.find(KEY) is None
    assert not list((tmp_path / "snapshots").glob(".building-*"))


def test_paths_that_leave_the_checkout_and_bad_keys_are_refused(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    store = make_store(tmp_path / "snapshots")
    for path in ("../task", "/etc", ".git", "."):
        with pytest.raises(SnapshotError, match="not a path inside the checkout"):
            store.publish(KEY, "owner/repo", home, checkout, [path], [], NOW)
    with pytest.raises(SnapshotError, match="not an environment key"):
        store.find("../../etc")


def test_a_crash_between_copy_and_rename_leaves_nothing_found_and_the_sweep_removes_it(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    home, checkout = built
    root = tmp_path / "snapshots"
    child = builder(root, home, checkout, tmp_path / "report", "--die-before-rename")
    assert child.wait(timeout=120) == -9
    (leftover,) = root.glob(f".building-{KEY}-*")
    assert (leftover / "manifest.json").is_file()  # the copy was complete: only the rename was missing
    store = make_store(root)
    assert store.find(KEY) is None
    built_at = leftover.stat().st_mtime
    assert store.sweep(built_at + 60) == []  # it may still be a build under way
    assert store.sweep(built_at + STALE_BUILD_S + 1) == [leftover.name]
    assert not leftover.exists()
    with store.building(KEY, timeout=0):  # the dead builder's lock went with it
        pass


def test_a_leftover_build_whose_lock_is_held_is_not_swept(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    leftover = tmp_path / f".building-{KEY}-cafe"
    leftover.mkdir()
    with store.building(KEY):
        assert store.sweep(NOW + STALE_BUILD_S * 10) == []
    assert store.sweep(NOW + STALE_BUILD_S * 10) == [leftover.name]


def test_two_processes_that_need_one_key_build_it_once(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    root, go = tmp_path / "snapshots", tmp_path / "go"
    first_report, second_report = tmp_path / "first", tmp_path / "second"
    first = builder(root, home, checkout, first_report, "--hold-until", str(go))
    wait_for(lambda: lines(first_report) == ["holding"], timeout=60, what="the first builder to hold the lock")
    second = builder(root, home, checkout, second_report)
    wait_for(lambda: lines(second_report) == ["waited"], timeout=60, what="the second builder to find the lock held")
    go.touch()
    assert first.wait(timeout=120) == 0
    assert second.wait(timeout=120) == 0
    assert lines(first_report) == ["holding", "built"]
    assert lines(second_report) == ["waited", "found"]
    assert len(list(root.glob(f"*/{KEY}"))) == 1


def test_sweep_keeps_the_most_recently_used_per_repository_and_drops_the_long_unused(
    tmp_path: Path,
) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    (home / "f").write_text("x")
    store = make_store(tmp_path / "snapshots", keep_per_repository=2, keep_days=7)
    keys = [f"{index:032x}" for index in range(4)]
    for index, key in enumerate(keys):
        store.publish(key, "owner/repo", home, checkout, [], [], NOW + index)
    other = store.publish("e" * 32, "owner/other", home, checkout, [], [], NOW - 8 * DAY_S)
    store.restore(store.find(keys[0]) or pytest.fail("published"), tmp_path / "h", tmp_path / "c", now=NOW + 100)
    slug = other.path.parent.name
    removed = store.sweep(NOW + 200)
    repo_slug = (store.find(keys[0]) or pytest.fail("kept")).path.parent.name
    assert sorted(removed) == sorted([f"{repo_slug}/{keys[1]}", f"{repo_slug}/{keys[2]}", f"{slug}/{'e' * 32}"])
    assert [key for key in keys if store.find(key)] == [keys[0], keys[3]]
    assert not (tmp_path / "snapshots" / slug).exists()
    assert store.sweep(NOW + 300) == []
    assert sorted(store.sweep(NOW + 8 * DAY_S + 200)) == [f"{repo_slug}/{keys[0]}", f"{repo_slug}/{keys[3]}"]
    assert not list((tmp_path / "snapshots").glob(".deleting-*"))


def test_sweep_leaves_a_snapshot_whose_key_is_being_built(tmp_path: Path) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    store = make_store(tmp_path / "snapshots", keep_days=1)
    store.publish(KEY, "owner/repo", home, checkout, [], [], NOW)
    with store.building(KEY):
        assert store.sweep(NOW + 3 * DAY_S) == []
    assert len(store.sweep(NOW + 3 * DAY_S)) == 1
    assert store.find(KEY) is None


def test_sweep_leaves_a_snapshot_a_task_holds_even_from_another_process(tmp_path: Path) -> None:
    """A task restored by layers holds its snapshot (its lower layers are the snapshot's directories) until its end,
    or its process's: the sweep, in this process or another, leaves it until then."""
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    store = make_store(tmp_path / "snapshots", keep_days=1)
    store.publish(KEY, "owner/repo", home, checkout, [], [], NOW)
    held = store.hold(KEY)
    assert store.sweep(NOW + 3 * DAY_S) == []
    os.close(held)
    holder = subprocess.Popen(  # another worker's process holds it, then is killed
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from sandbox.snapshots import SnapshotStore"
         "; SnapshotStore(Path(sys.argv[1]), keep_per_repository=1, keep_days=1, max_bytes=1 << 30).hold(sys.argv[2])"
         "; print('held', flush=True); time.sleep(600)", str(tmp_path / "snapshots"), KEY],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        assert store.sweep(NOW + 3 * DAY_S) == []
    finally:
        holder.kill()
        holder.wait()
    assert len(store.sweep(NOW + 3 * DAY_S)) == 1
    assert store.find(KEY) is None


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def builder(root: Path, home: Path, checkout: Path, report: Path, *options: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.snapshot_builder",
            str(root),
            KEY,
            str(home),
            str(checkout),
            str(report),
            *options,
        ],
        cwd=ROOT,
    )


def test_the_bench_helper_times_a_restore_and_cleans_up(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", home, checkout, [".venv"], [], time.time())
    seconds = time_restore(store, snapshot, tmp_path / "bench")
    assert seconds > 0
    assert not (tmp_path / "bench").exists()


def test_restore_never_writes_through_a_symlink_the_repository_put_in_the_checkout(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    home, checkout = built
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", home, checkout, [".venv", "build/gen"], [], NOW)
    outside = tmp_path / "worker-files"
    outside.mkdir()
    (outside / "schema.py").write_text("the worker's own file\n")
    hostile = tmp_path / "hostile"
    (hostile / "build/gen").mkdir(parents=True)
    (hostile / "build/gen/schema.py").symlink_to(outside / "schema.py")
    store.restore(snapshot, tmp_path / "home2", hostile)
    assert (outside / "schema.py").read_text() == "the worker's own file\n"
    assert (hostile / "build/gen/schema.py").read_text() == "generated\n"

    shutil.rmtree(hostile / ".venv")
    (hostile / ".venv").symlink_to(outside)
    with pytest.raises(SnapshotError, match="copying into"):
        store.restore(snapshot, tmp_path / "home3", hostile)
    assert sorted(path.name for path in outside.iterdir()) == ["schema.py"]


def test_a_path_through_a_symlink_is_not_published(tmp_path: Path, built: tuple[Path, Path]) -> None:
    home, checkout = built
    outside = tmp_path / "worker-files"
    outside.mkdir()
    (outside / "id_rsa").write_text("private key\n")
    (checkout / "link").symlink_to(outside)
    store = make_store(tmp_path / "snapshots")
    with pytest.raises(SnapshotError, match="passes through a symlink"):
        store.publish(KEY, "owner/repo", home, checkout, ["link/id_rsa"], [], NOW)
    snapshot = store.publish(KEY, "owner/repo", home, checkout, ["link"], [], NOW)
    assert (snapshot.checkout / "link").is_symlink()  # kept as the link it is, not what it points to


def test_a_second_publish_of_a_key_keeps_the_first_and_leaves_no_temporary(tmp_path: Path) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    (home / "version").write_text("first")
    store = make_store(tmp_path / "snapshots")
    first = store.publish(KEY, "owner/repo", home, checkout, [], [], NOW)
    (home / "version").write_text("second")
    assert store.publish(KEY, "owner/repo", home, checkout, [], [], NOW + 1) == first
    assert (first.home / "version").read_text() == "first"
    assert not list((tmp_path / "snapshots").glob(".building-*"))


def test_restoring_a_snapshot_swept_meanwhile_is_one_line(tmp_path: Path) -> None:
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    store = make_store(tmp_path / "snapshots", keep_days=1)
    snapshot = store.publish(KEY, "owner/repo", home, checkout, [], [], NOW)
    assert store.sweep(NOW + 2 * DAY_S) == [f"{snapshot.path.parent.name}/{KEY}"]
    with pytest.raises(SnapshotError, match=f"^snapshot {KEY} is gone"):
        store.restore(snapshot, tmp_path / "h", tmp_path / "c")


def test_a_fingerprint_survives_moving_the_checkout_and_changes_with_any_change_to_the_files(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    _, checkout = built
    paths = (".venv", "build/gen")
    made = fingerprint(checkout, paths).digest
    moved = tmp_path / "idle" / "copy"
    moved.parent.mkdir()
    os.rename(checkout, moved)  # what a warm copy goes through between two tasks
    assert fingerprint(moved, paths).digest == made
    schema = moved / "build/gen/schema.py"
    next_clock_tick(tmp_path, schema)

    reference = tmp_path / "reference"
    shutil.copy2(schema, reference)  # its times, to the nanosecond
    schema.write_text("GENERATED\n")  # the same size
    os.utime(schema, ns=(reference.stat().st_atime_ns, reference.stat().st_mtime_ns))  # and the same mtime
    assert schema.stat().st_size == reference.stat().st_size
    assert fingerprint(moved, paths).digest != made  # the change time gives it away

    def changed(change: Callable[[Path], object]) -> bool:
        copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
        subprocess.run(["cp", "-a", str(checkout.parent / "original"), str(copy)], check=True)
        before = fingerprint(copy, paths).digest
        next_clock_tick(tmp_path, copy)
        change(copy)
        return fingerprint(copy, paths).digest != before

    subprocess.run(["cp", "-a", str(moved), str(checkout.parent / "original")], check=True)
    assert not changed(lambda copy: (copy / ".venv/pyvenv.cfg").read_bytes())  # reading changes nothing
    assert changed(lambda copy: (copy / ".venv/pyvenv.cfg").chmod(0o600))
    assert changed(lambda copy: (copy / ".venv/new.pth").write_text("import os\n"))
    assert changed(lambda copy: (copy / "build/gen/schema.py").unlink())
    assert changed(lambda copy: os.link(copy / "build/gen/schema.py", copy / "linked"))  # another name to write by
    assert changed(lambda copy: shutil.rmtree(copy / ".venv"))  # missing

    def through_a_symlink(copy: Path) -> None:
        os.rename(copy / "build", copy / "elsewhere")
        os.symlink("elsewhere", copy / "build")

    assert changed(through_a_symlink)


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root``: its mode and its content (a file's bytes, a symlink's target)."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            content = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            content = path.read_bytes().hex()
        else:
            content = ""
        found[path.relative_to(root).as_posix()] = (info.st_mode, content)
    return found


def fresh(tmp_path: Path, name: str) -> tuple[Path, Path]:
    home, checkout = tmp_path / name / "home", tmp_path / name / "checkout"
    home.mkdir(parents=True, mode=0o700)
    (checkout / "src").mkdir(parents=True)
    return home, checkout


def test_a_restore_moves_the_spare_into_place_a_private_copy_of_exactly_the_snapshot(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
    assert store.make_spare(snapshot) is True
    assert store.make_spare(snapshot) is False  # one is ready: at most one per key
    spare = tmp_path / "snapshots/.spares" / KEY
    assert tree(spare / "checkout") == tree(snapshot.checkout)

    home, checkout = fresh(tmp_path, "next")
    assert store.restore(snapshot, home, checkout, now=NOW + 60) is True
    assert not spare.exists()
    assert list((tmp_path / "snapshots/.spares").iterdir()) == []  # the claimed remains are gone too
    assert tree(home) == tree(snapshot.home)
    assert {k: v for k, v in tree(checkout).items() if k != "src"} == tree(snapshot.checkout)
    assert venv_runs(checkout / ".venv/bin/python") == f"{checkout / '.venv'} 42"
    assert (snapshot.path / "last-used").stat().st_mtime == NOW + 60

    assert store.make_spare(snapshot) is True  # the refill
    (site,) = checkout.glob(".venv/lib/python3*/site-packages")
    (checkout / ".venv/lib").chmod(0o755)
    (site / "kept_module.py").write_text("ANSWER = 'changed by the task'\n")
    (home / ".tasuki/env").write_text("")
    assert tree(spare / "checkout") == tree(snapshot.checkout)  # neither the snapshot nor the next spare changed
    assert tree(spare / "home") == tree(snapshot.home)
    (snapshot_site,) = snapshot.checkout.glob(".venv/lib/python3*/site-packages")
    assert (snapshot_site / "kept_module.py").read_text() == "ANSWER = 42\n"


def test_two_restores_at_once_never_get_the_same_spare(tmp_path: Path, built: tuple[Path, Path]) -> None:
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
    for round_ in range(3):
        assert store.make_spare(snapshot) is True
        barrier = threading.Barrier(2)
        targets = [fresh(tmp_path, f"round{round_}-{n}") for n in range(2)]
        used: list[bool] = []

        def restore(home: Path, checkout: Path, barrier: threading.Barrier, used: list[bool]) -> None:
            barrier.wait(timeout=30)
            used.append(store.restore(snapshot, home, checkout))

        threads = [threading.Thread(target=restore, args=(*target, barrier, used)) for target in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert sorted(used) == [False, True]
        for home, checkout in targets:  # both whole: one moved, one copied
            assert tree(home) == tree(snapshot.home)
            assert {k: v for k, v in tree(checkout).items() if k != "src"} == tree(snapshot.checkout)


def spare_not_in_place(root: Path, built: tuple[Path, Path]) -> tuple[SnapshotStore, Snapshot, Path]:
    """A store with a snapshot whose spare is complete but still under its temporary name (not yet renamed)."""
    store = make_store(root)
    snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
    assert store.make_spare(snapshot) is True
    temporary = root / ".spares" / f".building-{KEY}-cafe"
    os.rename(root / ".spares" / KEY, temporary)
    return store, snapshot, temporary


def test_a_half_made_spare_is_never_used_and_is_swept_once_its_maker_is_gone(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    root = tmp_path / "snapshots"
    store, snapshot, half = spare_not_in_place(root, built)  # a maker killed at the end
    home, checkout = fresh(tmp_path, "next")
    assert store.restore(snapshot, home, checkout, now=NOW) is False
    assert half.is_dir()
    with filelock.FileLock(root / ".locks" / f"{KEY}.spare.lock"):  # its maker still at work
        assert store.sweep(NOW) == []
    assert store.sweep(NOW) == [f".spares/{half.name}"]
    assert not half.exists()


def test_a_spare_of_a_swept_or_rebuilt_snapshot_is_discarded(tmp_path: Path, built: tuple[Path, Path]) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root)
    snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
    assert store.make_spare(snapshot) is True
    kept = tmp_path / "old-spare"
    shutil.copytree(root / ".spares" / KEY, kept, symlinks=True)
    swept = store.sweep(NOW + 30 * DAY_S)
    assert f".spares/{KEY}" in swept  # the sweep takes the snapshot's spare with it
    assert not (root / ".spares" / KEY).exists()

    home, checkout = built
    (home / ".tasuki/env").write_text("DATABASE_URL=rebuilt\n")
    rebuilt = store.publish(KEY, "owner/repo", home, checkout, [".venv", "build/gen"], [], NOW + 1)
    os.rename(kept, root / ".spares" / KEY)  # the old snapshot's spare, left behind
    new_home, new_checkout = fresh(tmp_path, "next")
    assert store.restore(rebuilt, new_home, new_checkout, now=NOW + 1) is False  # not the snapshot restored: discarded
    assert not (root / ".spares" / KEY).exists()
    assert list((root / ".spares").iterdir()) == []
    assert (new_home / ".tasuki/env").read_text() == "DATABASE_URL=rebuilt\n"

    assert store.make_spare(rebuilt) is True
    (rebuilt.path / "manifest.json").unlink()  # the snapshot as good as gone: its spare goes at the next sweep
    assert f".spares/{KEY}" in store.sweep(NOW + 2)
    assert not (root / ".spares" / KEY).exists()


def test_without_a_spare_the_restore_copies(tmp_path: Path, built: tuple[Path, Path]) -> None:
    store = make_store(tmp_path / "snapshots")
    snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
    home, checkout = fresh(tmp_path, "next")
    assert store.restore(snapshot, home, checkout) is False
    assert tree(home) == tree(snapshot.home)
    assert venv_runs(checkout / ".venv/bin/python") == f"{checkout / '.venv'} 42"


def test_a_restore_waits_for_the_spare_being_made_instead_of_copying_beside_it(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    root = tmp_path / "snapshots"
    store, snapshot, making = spare_not_in_place(root, built)
    home, checkout = fresh(tmp_path, "next")
    used: list[bool] = []
    with filelock.FileLock(root / ".locks" / f"{KEY}.spare.lock"):  # a maker at work
        restoring = threading.Thread(target=lambda: used.append(store.restore(snapshot, home, checkout, now=NOW + 5)))
        restoring.start()
        wait_for(lambda: (snapshot.path / "last-used").stat().st_mtime == NOW + 5, what="the restore to begin")
        os.rename(making, root / ".spares" / KEY)  # the maker's last step, then it lets go
    restoring.join(timeout=120)
    assert used == [True]
    assert tree(home) == tree(snapshot.home)


# -- a worker killed in the middle of a copy (SIGKILL to its process group: the python and its cp) ------------

MANY_FILES = 2000


def many_files(built: tuple[Path, Path]) -> tuple[Path, Path]:
    """The built home and checkout with two thousand files more under ``data``: a copy of them lasts far longer than
    the test's poll (every 10 ms), so the test kills the process that makes it in the middle."""
    home, checkout = built
    (checkout / "data").mkdir()
    for index in range(MANY_FILES):
        (checkout / "data" / f"{index:05}.txt").write_text(f"file {index}\n" * 64)
    return home, checkout


def group_gone(group: int) -> bool:
    """Whether no live process (zombies aside) is left in the process group ``group``."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == group and fields[0] != "Z":
            return False
    return True


def kill_when(child: subprocess.Popen[bytes], predicate: Callable[[], object], what: str) -> None:
    """SIGKILL ``child``'s whole process group (it runs in a session of its own) once ``predicate`` holds, as a
    host or a cgroup kill takes a worker and its ``cp``; wait until none of them is left."""
    wait_for(lambda: predicate() or child.poll() is not None, timeout=120, what=what)
    assert child.poll() is None, f"the child ended before it was killed ({what}): make the copy bigger"
    os.killpg(child.pid, 9)
    assert child.wait(timeout=60) == -9
    wait_for(lambda: group_gone(child.pid), timeout=60, what="the killed process group to be gone")


def in_background(root: Path, home: Path, checkout: Path, report: Path, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.snapshot_builder", *map(str, (root, KEY, home, checkout, report)), mode],
        cwd=ROOT,
        start_new_session=True,
    )


def files_under(root: Path) -> int:
    return sum(len(names) for _directory, _dirs, names in os.walk(root))


def test_a_maker_killed_mid_copy_leaves_half_a_spare_never_claimed_and_swept_once_its_lock_is_free(
    tmp_path: Path, built: tuple[Path, Path]
) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root)
    snapshot = store.publish(KEY, "owner/repo", *many_files(built), [".venv", "build/gen", "data"], [], NOW)
    maker = in_background(root, tmp_path / "unused", tmp_path / "unused", tmp_path / "report", "--spare")
    half_made = root / ".spares"

    def copying_the_checkout() -> list[Path]:
        return [half for half in half_made.glob(f".building-{KEY}-*") if (half / "checkout").is_dir()]

    kill_when(maker, copying_the_checkout, "the maker to be copying the snapshot's checkout")
    assert lines(tmp_path / "report") == []
    (half,) = half_made.glob(f".building-{KEY}-*")
    assert not (half_made / KEY).exists()
    assert files_under(half / "checkout") < files_under(snapshot.checkout)  # killed mid-copy

    home, checkout = fresh(tmp_path, "next")
    assert store.restore(snapshot, home, checkout, now=NOW + 1) is False  # not claimed: copied
    assert half.is_dir()
    assert tree(home) == tree(snapshot.home)
    assert {k: v for k, v in tree(checkout).items() if k != "src"} == tree(snapshot.checkout)
    assert venv_runs(checkout / ".venv/bin/python") == f"{checkout / '.venv'} 42"

    with filelock.FileLock(root / ".locks" / f"{KEY}.spare.lock"):  # a maker at work: not the sweep's
        assert store.sweep(NOW + 2) == []
    assert store.sweep(NOW + 2) == [f".spares/{half.name}"]  # the dead maker's lock went with it
    assert list(half_made.iterdir()) == []
    assert not list(root.glob(".deleting-*"))
    assert store.make_spare(snapshot) is True
    assert tree(half_made / KEY / "checkout") == tree(snapshot.checkout)


def test_a_restore_killed_mid_copy_is_restored_whole_by_the_next_one(tmp_path: Path, built: tuple[Path, Path]) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root)
    snapshot = store.publish(KEY, "owner/repo", *many_files(built), [".venv", "build/gen", "data"], [], NOW)
    as_published = tree(snapshot.path)
    home, checkout = fresh(tmp_path, "next")
    restoring = in_background(root, home, checkout, tmp_path / "report", "--restore")
    kill_when(restoring, (checkout / "data").is_dir, "the restore to be copying the checkout")
    assert lines(tmp_path / "report") == []
    assert files_under(checkout / "data") < MANY_FILES  # killed mid-copy

    assert store.restore(snapshot, home, checkout, now=NOW + 1) is False
    assert tree(home) == tree(snapshot.home)
    assert {k: v for k, v in tree(checkout).items() if k != "src"} == tree(snapshot.checkout)
    assert venv_runs(checkout / ".venv/bin/python") == f"{checkout / '.venv'} 42"
    assert tree(snapshot.path) == as_published  # only read


# -- snapshots and tasks on different file systems: a rename cannot cross, the restore copies ----------------


@pytest.mark.parametrize("layout", ["snapshots on a tmpfs", "the task on a tmpfs", "the task through a bind mount"])
def test_across_file_systems_the_restore_falls_back_to_a_private_copy(
    tmp_path: Path, built: tuple[Path, Path], layout: str
) -> None:
    with contextlib.ExitStack() as mounts:
        if layout == "snapshots on a tmpfs":
            root = mounts.enter_context(mounted_tmpfs(tmp_path / "other", 256 * MIB)) / "snapshots"
            tasks = tmp_path / "tasks"
        elif layout == "the task on a tmpfs":
            root, tasks = tmp_path / "snapshots", mounts.enter_context(mounted_tmpfs(tmp_path / "other", 256 * MIB))
        else:  # one file system, so the devices agree: the claim is made, and the first rename fails with EXDEV
            (tmp_path / "disk").mkdir()
            tasks = mounts.enter_context(bind_mounted(tmp_path / "disk", tmp_path / "bound"))
            root = tmp_path / "snapshots"
        store = make_store(root)
        snapshot = store.publish(KEY, "owner/repo", *built, [".venv", "build/gen"], [], NOW)
        assert store.make_spare(snapshot) is True
        spare = tree(root / ".spares" / KEY)
        for round_ in range(2):  # the second finds the spare as the first did (kept), or none (claimed, discarded)
            home, checkout = fresh(tasks, f"task{round_}")
            assert store.restore(snapshot, home, checkout, now=NOW + round_) is False
            assert tree(home) == tree(snapshot.home)
            assert {k: v for k, v in tree(checkout).items() if k != "src"} == tree(snapshot.checkout)
            assert venv_runs(checkout / ".venv/bin/python") == f"{checkout / '.venv'} 42"
            assert (
                os.stat(checkout / "build/gen/schema.py").st_ino
                != os.stat(snapshot.checkout / "build/gen/schema.py").st_ino
            )  # a copy of its own
            (checkout / "build/gen/schema.py").write_text("changed by the task\n")
            assert (snapshot.checkout / "build/gen/schema.py").read_text() == "generated\n"
        leftover = sorted(path.name for path in (root / ".spares").iterdir())
        if layout == "the task through a bind mount":
            assert leftover == []  # claimed, its move refused, deleted
        else:
            assert leftover == [KEY]  # never claimed: left whole, for a task on its file system
            assert tree(root / ".spares" / KEY) == spare
        assert not list(root.glob(".deleting-*"))


# -- all spares together within environments.max_spares_bytes ---------------------------------------------


def sized_snapshots(store: SnapshotStore, tmp_path: Path, count: int) -> list[Snapshot]:
    """``count`` snapshots of distinct keys, each holding one file of 1 MiB in its checkout."""
    home, checkout = tmp_path / "sized/home", tmp_path / "sized/checkout"
    home.mkdir(parents=True)
    (checkout / "blob").mkdir(parents=True)
    (checkout / "blob/data").write_bytes(b"x" * MIB)
    return [store.publish(f"{i:032x}", "owner/repo", home, checkout, ["blob"], [], NOW + i) for i in range(count)]


def test_spares_are_not_made_past_max_spares_bytes_and_a_claimed_one_makes_room(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root, max_spares_bytes=int(2.5 * MIB))
    first, second, third = sized_snapshots(store, tmp_path, 3)
    assert store.make_spare(first) is True
    assert store.make_spare(second) is True
    with pytest.raises(SnapshotError, match=r"beside the 2\.0 MiB of spares would go over environments\."):
        store.make_spare(third)
    assert sorted(path.name for path in (root / ".spares").iterdir()) == [first.key, second.key]  # nothing left

    home, checkout = fresh(tmp_path, "next")
    assert store.restore(first, home, checkout, now=NOW + 10) is True  # its spare is the task's now
    assert store.make_spare(third) is True
    assert (root / ".spares" / third.key / "checkout/blob/data").stat().st_size == MIB

    without = make_store(tmp_path / "none", max_spares_bytes=0)  # no spares at all
    with pytest.raises(SnapshotError, match=r"over environments\.max_spares_bytes \(0\.0 MiB\): not made"):
        without.make_spare(without.publish(KEY, "owner/repo", home, checkout, [], [], NOW))
    assert list((tmp_path / "none/.spares").iterdir()) == []


def test_a_live_makers_spare_counts_and_a_dead_makers_half_does_not(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root, max_spares_bytes=int(1.5 * MIB))
    first, second = sized_snapshots(store, tmp_path, 2)
    assert store.make_spare(first) is True
    half = root / ".spares" / f".building-{first.key}-cafe"  # its spare claimed meanwhile, a new one being made
    os.rename(root / ".spares" / first.key, half)
    maker = filelock.FileLock(root / ".locks" / f"{first.key}.spare.lock")
    with maker, pytest.raises(SnapshotError, match="max_spares_bytes"):  # its maker is at work
        store.make_spare(second)
    assert store.make_spare(second) is True  # the maker is gone: its half is the sweep's, not a share


def test_the_sweep_drops_the_oldest_spares_first_until_within_the_cap(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    store = make_store(root, keep_per_repository=9, max_spares_bytes=10 * MIB)
    snapshots = sized_snapshots(store, tmp_path, 4)
    for made_at, snapshot in zip((NOW + 30, NOW + 10, NOW + 40, NOW + 20), snapshots, strict=True):
        assert store.make_spare(snapshot) is True
        os.utime(root / ".spares" / snapshot.key / "spare.json", (made_at, made_at))
    assert store.sweep(NOW + 50) == []
    lowered = make_store(root, keep_per_repository=9, max_spares_bytes=int(2.5 * MIB))  # the operator lowered it
    assert lowered.sweep(NOW + 50) == [f".spares/{snapshots[1].key}", f".spares/{snapshots[3].key}"]
    assert sorted(path.name for path in (root / ".spares").iterdir()) == sorted([snapshots[0].key, snapshots[2].key])
    assert all(lowered.find(snapshot.key) for snapshot in snapshots)  # the snapshots are not the cap's
    assert lowered.sweep(NOW + 50) == []


def test_the_cap_is_the_operators_setting(make_settings: Callable[..., Settings]) -> None:
    assert snapshot_store(make_settings()).max_spares_bytes == 8 * 1024**3
    settings = make_settings({"TASUKI__ENVIRONMENTS__MAX_SPARES_BYTES": "0"})
    assert snapshot_store(settings).max_spares_bytes == 0
