"""Copy-on-write environments (docs/environments.md "Layers"): a snapshot's directories seen through overlayfs.

A restore by layers copies nothing: each directory the snapshot holds of the checkout (``.venv``, ``node_modules``)
is mounted, inside every sandbox of the task, as an overlay whose lower layer is the snapshot's directory (bound
read-only) and whose upper layer is the task's own (empty at first). The agent reads the snapshot's files and
whatever it writes, deletes or installs lands in the upper layer; the snapshot never changes.

The task's layers live in its home (``.tasuki/layers/N/upper`` and ``work``; overlayfs wants both on one mount),
described by ``.tasuki/layers/layers.json``, so they last for the task (a resume on this host mounts them again)
and go with the home. Inside the sandbox a small helper run first mounts them (bubblewrap 0.8, Debian 12's, has no
overlay option of its own; the sandbox's user namespace may mount overlayfs since Linux 5.11), hides the layers'
directory under an empty read-only tmpfs, mounts the sandbox's ``/dev/pts``, and then drops every capability
(``setpriv``: bounding, inheritable and ambient sets emptied, no new privileges) before the command starts: the
agent's processes hold none, as in a sandbox without layers.

Whether this host can is probed (:func:`layers_probe`, once per process by the worker); where it cannot (no
overlayfs for user namespaces, an upper file system without user xattrs, no ``python3`` or ``setpriv`` to run the
helper), restores copy, as before, and the worker says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contexts.errors import BAD_DATA_ERRORS
from sandbox.snapshot_files import SnapshotError

LAYERS_DIR = ".tasuki/layers"  # in the task's home
LAYERS_FILE = "layers.json"
LOWER_INSIDE = "/run/tasuki/lower"  # where the sandbox sees the snapshot's directories (read-only), one per number
FORMAT = 1
_UNREADABLE: tuple[type[Exception], ...] = (*BAD_DATA_ERRORS, OSError)  # missing, torn or edited
PROBE_TIMEOUT_S = 30
# What bubblewrap's --dev makes, by hand: with --dev, a user namespace that is not root's may not mount overlayfs
# (EPERM on Linux 6.x); the helper mounts /dev/pts itself.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
)
# The helper, run by the sandbox's python3 with every capability of the sandbox's own user namespace. Its arguments:
# setpriv's path, 1 or 0 (the layers writable, or read-only: a service's view), the directory to hide, the number of
# layers, four paths per layer (lower, upper, work, target), then the command, run by setpriv with no capability.
# Errors name the mount and exit 125. Plain argv and no json: importing json took longer than all the rest.
HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def mount(source, target, kind, options, flags=0):
    if libc.mount(source.encode(), target.encode(), kind.encode(), flags, options.encode()) != 0:
        sys.stderr.write(f"tasuki: mounting {target} failed: {os.strerror(ctypes.get_errno())}\n")
        sys.exit(125)
setpriv, writable, hide, count = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
for number in range(count):
    lower, upper, work, target = sys.argv[5 + 4 * number : 9 + 4 * number]
    if os.path.realpath(target) != target:  # a symlink the task's commands put on the way
        sys.stderr.write(f"tasuki: {target} passes through a symlink: its layer is not mounted\n")
        sys.exit(125)
    os.makedirs(upper, mode=0o700, exist_ok=True)
    os.makedirs(work, mode=0o700, exist_ok=True)
    if writable:
        layers = f"lowerdir={lower},upperdir={upper},workdir={work}"
    else:  # what the task's commands changed, over the snapshot, read-only
        layers = f"lowerdir={upper}:{lower}"
    mount("overlay", target, "overlay", layers + ",userxattr,index=off")  # the last call's mount may linger: no EBUSY
mount("tmpfs", hide, "tmpfs", "size=4k,mode=0500", 1)  # MS_RDONLY: the layers' directory looks empty
mount("devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=620", 10)  # MS_NOSUID | MS_NOEXEC
os.execv(setpriv, [setpriv, "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                   *sys.argv[5 + 4 * count :]])
"""


Command = Callable[[Sequence[str], Path, Path], tuple[list[str], Path]]  # a sandbox's command(argv, checkout, home)


@dataclass(frozen=True)
class Layer:
    """One directory seen through an overlay: the snapshot's copy of it (``lower``, on the host) and where it is
    (``path``, relative to the checkout, or to the home when ``home``)."""

    lower: str
    path: str
    home: bool = False


def layers_dir(home: Path) -> Path:
    """Where a task's layers live in its home."""
    return home / LAYERS_DIR


def lay(
    home: Path, checkout: Path, lower: Path, paths: Sequence[str], lower_home: Path | None = None
) -> tuple[str, ...]:
    """Layer the directories among ``paths`` (relative) of the snapshot's ``lower`` over the same paths of
    ``checkout`` for every later command of the task whose home is ``home``, and the directories at the top of the
    snapshot's ``lower_home`` (a setup's caches: ``.cargo``, ``go``, ``.npm``) over the same names in ``home`` but
    ``.tasuki`` (the env files the worker reads); the paths of the checkout layered (the others are not directories:
    the caller copies them, and the home's entries :func:`home_layered` does not name). The mount points are made
    (in the checkout, empty directories git never sees); the description is written last, whole or not at all."""
    layered = tuple(path for path in paths if _directory(lower / path))
    in_home = home_layered(lower_home) if lower_home is not None else ()
    drop(home)
    directory = layers_dir(home)
    directory.mkdir(mode=0o700, parents=True)
    for path in layered:
        _mount_point(checkout, path)
    for name in in_home:
        _mount_point(home, name)
    for number in range(len(layered) + len(in_home)):
        (directory / str(number)).mkdir(mode=0o700)
    described = {
        "format": FORMAT,
        "layers": [{"lower": str(lower / path), "path": path} for path in layered]
        + [{"lower": str(lower_home / name), "path": name, "home": True} for name in in_home if lower_home],
    }
    temporary = directory / f".{LAYERS_FILE}.new"
    temporary.write_text(json.dumps(described))
    temporary.chmod(0o600)
    os.replace(temporary, directory / LAYERS_FILE)
    return layered


def home_layered(lower_home: Path) -> tuple[str, ...]:
    """The entries of a snapshot's home that :func:`lay` layers: its directories, but the worker's own ``.tasuki``."""
    return tuple(sorted(e.name for e in lower_home.iterdir() if e.name != ".tasuki" and _directory(e)))


def _directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _mount_point(checkout: Path, path: str) -> None:
    """An empty directory at ``path`` of ``checkout`` (what an earlier attempt left there goes: the layer covers it);
    SnapshotError when the way there passes through a symlink (the checkout is the agent's)."""
    parts = path.split("/")
    if any((checkout.joinpath(*parts[:depth])).is_symlink() for depth in range(1, len(parts) + 1)):
        raise SnapshotError(f"{path} passes through a symlink in the checkout: not layered")
    target = checkout / path
    if target.is_dir() and any(target.iterdir()):
        shutil.rmtree(target)
    elif target.exists() and not target.is_dir():
        target.unlink()
    target.mkdir(mode=0o700, parents=True, exist_ok=True)


def layers_of(home: Path) -> tuple[Layer, ...]:
    """The layers of the task whose home is ``home`` (none when it has none, or their description is unreadable)."""
    try:
        described = json.loads((layers_dir(home) / LAYERS_FILE).read_text())
        if described.get("format") != FORMAT:
            return ()
        return tuple(
            Layer(str(entry["lower"]), str(entry["path"]), bool(entry.get("home"))) for entry in described["layers"]
        )
    except _UNREADABLE:
        return ()


def whole(home: Path) -> bool:
    """Whether every lower layer of the task is still there (a swept snapshot takes its layers' lower half)."""
    return all(Path(layer.lower).is_dir() for layer in layers_of(home))


def remove_home(home: Path) -> None:
    """Delete a task's home whole, its layers too (:func:`drop`: rmtree alone leaves their work directories)."""
    drop(home)
    shutil.rmtree(home, ignore_errors=True)


def drop(home: Path) -> None:
    """The task has no layers any more (what its commands wrote in them is deleted)."""
    directory = layers_dir(home)
    if directory.exists():
        # overlayfs leaves its work directory unreadable (mode 000): made readable again, or rmtree skips it
        for root, dirnames, _files in os.walk(directory):
            for name in dirnames:
                os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(directory, ignore_errors=True)


def bwrap_options(layers: Sequence[Layer]) -> list[str]:
    """bubblewrap's options for a sandbox with ``layers``: the lower layers bound read-only, a /dev made by hand
    (see DEVICES), and every capability for the helper (it drops them all before the command)."""
    options = ["--cap-add", "ALL", "--tmpfs", "/dev"]
    for device in DEVICES:
        options += ["--dev-bind-try", f"/dev/{device}", f"/dev/{device}"]
    for target, name in DEV_LINKS:
        options += ["--symlink", target, name]
    options += ["--dir", "/dev/shm", "--dir", "/dev/pts"]  # noqa: S108 - inside the sandbox's own /dev
    for number, layer in enumerate(layers):
        options += ["--ro-bind", layer.lower, f"{LOWER_INSIDE}/{number}"]
    return options


def helper_argv(
    layers: Sequence[Layer], workspace: str, home_inside: str, argv: Sequence[str], *, writable: bool = True
) -> list[str]:
    """``argv`` behind the helper that mounts ``layers`` over their paths under ``workspace`` (read-only when not
    ``writable``: what the task's commands changed over the snapshot)."""
    inside = f"{home_inside}/{LAYERS_DIR}"
    paths = [
        path
        for number, layer in enumerate(layers)
        for path in (
            f"{LOWER_INSIDE}/{number}",
            f"{inside}/{number}/upper",
            f"{inside}/{number}/work",
            f"{home_inside if layer.home else workspace}/{layer.path}",
        )
    ]
    helper = [_tool("python3") or "python3", "-I", "-S", "-c", HELPER, _tool("setpriv") or "setpriv"]
    return [*helper, "1" if writable else "0", inside, str(len(layers)), *paths, *argv]


def _tool(name: str) -> str | None:
    """A system program the helper uses, by its path in the system directories (the sandbox sees those)."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")


def layers_probe(scratch_parent: Path, command: Command, home_inside: str) -> str | None:
    """Why this host cannot restore by layers under ``scratch_parent`` (None: it can), found by running a real
    layered command: a file of the lower layer rewritten and another deleted, the layers' directory empty to the
    command, then the lower layer checked unchanged. ``command`` is a bubblewrap sandbox's ``command``, and
    ``home_inside`` where it shows the task's home (the worker probes once per process: worker.environment)."""
    missing = [name for name in ("python3", "setpriv") if _tool(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found in the system directories (the sandbox's layer helper needs them)"
    try:
        scratch_parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".layers-probe-", dir=scratch_parent) as scratch:
            return _probe_in(Path(scratch), command, home_inside)
    except OSError as exc:
        return f"its probe could not run ({exc})"


def _probe_in(scratch: Path, command: Command, home_inside: str) -> str | None:
    lower, home, checkout = scratch / "lower", scratch / "home", scratch / "checkout"
    (lower / "env" / "sub").mkdir(parents=True)
    (lower / "env" / "kept").write_text("lower\n")
    (lower / "env" / "sub" / "gone").write_text("lower\n")
    home.mkdir()
    checkout.mkdir()
    lay(home, checkout, lower, ["env"])
    script = 'echo upper > env/kept && rm env/sub/gone && test ! -e env/sub/gone && test -z "$(ls -A "$1")"'
    argv, cwd = command(["sh", "-c", script, "probe", f"{home_inside}/{LAYERS_DIR}"], checkout, home)
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its probe could not run ({exc})"
    finally:
        drop(home)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    if (lower / "env" / "kept").read_text() != "lower\n" or not (lower / "env" / "sub" / "gone").exists():
        return "its probe changed the lower layer"
    return None
