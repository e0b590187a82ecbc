"""Copy-on-write environments (docs/environments.md "Layers"): a snapshot's directories seen through overlayfs.

A restore by layers copies nothing: each directory the snapshot holds of the checkout (``.venv``, ``node_modules``)
is mounted, inside every sandbox of the task, as an overlay whose lower layer is the snapshot's directory (bound
read-only) and whose upper layer is the task's own (empty at first). The agent reads the snapshot's files and
whatever it writes, deletes or installs lands in the upper layer; the snapshot never changes.

The task's layers live beside its home, never in it (``{home}.layers/N/upper`` and ``work``; overlayfs wants both on
one mount), described by ``{home}.layers/layers.json``: the task's state, which nothing bound into the sandbox can
name or reach (issue 36: a description in the home was the agent's to forge). They last for the task (a resume on
this host mounts them again) and go with the home. Inside the sandbox a small helper run first mounts them
(bubblewrap 0.8, Debian 12's, has no overlay option of its own; the sandbox's user namespace may mount overlayfs
since Linux 5.11), hides where they were bound under an empty read-only tmpfs, mounts the sandbox's ``/dev/pts``,
and then drops every capability (``setpriv``: bounding, inheritable and ambient sets emptied, no new privileges).
The helper starts with an empty environment; the agent's is applied only by the final ``env -i``, after every
capability is gone, so nothing the agent set (``LD_PRELOAD``) runs while one is held. A task without layers never
gets the helper.

Whether this host can is probed (:func:`layers_probe`, once per process by the worker); where it cannot (no
overlayfs for user namespaces, an upper file system without user xattrs, no ``python3`` or ``setpriv`` to run the
helper), restores copy, as before, and the worker says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from contexts.errors import BAD_DATA_ERRORS
from sandbox.host import HOST_ENV, program
from sandbox.snapshot_files import SnapshotError

log = structlog.get_logger(__name__)

LAYERS_SUFFIX = ".layers"  # {home}.layers: beside the task's home, out of every sandbox's sight
LAYERS_FILE = "layers.json"
INSIDE = "/run/tasuki-layers"  # where the helper finds them (hidden under a tmpfs before the command starts)
LOWER_INSIDE = f"{INSIDE}/lower"  # the snapshot's directories (read-only), one per number
OWN_INSIDE = f"{INSIDE}/own"  # the task's upper and work directories, one per number
FORMAT = 1
_UNREADABLE: tuple[type[Exception], ...] = (*BAD_DATA_ERRORS, OSError)  # missing, torn or edited
PROBE_TIMEOUT_S = 30
# What bubblewrap's --dev makes, by hand: with --dev, a user namespace that is not root's may not mount overlayfs
# (EPERM on Linux 6.x); the helper mounts /dev/pts itself.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_BYTES = 1024 * 1024  # /dev itself: device nodes and links only, read-only once made
DEV_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
)
# The helper, run by the sandbox's python3 with every capability of the sandbox's own user namespace and an empty
# environment. Its arguments: setpriv's path, 1 or 0 (the layers writable, or read-only: a service's view), the
# directory to hide, the number of layers, four paths per layer (lower, upper, work, target), then the command: setpriv
# drops every capability and runs ``env -i NAME=VALUE... -- COMMAND``, so the agent's environment applies from there on.
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


# a sandbox's command(argv, checkout, home, env)
Command = Callable[[Sequence[str], Path, Path, Mapping[str, str]], tuple[list[str], Path]]


@dataclass(frozen=True)
class Layer:
    """One directory seen through an overlay: the snapshot's copy of it (``lower``, on the host) and where it is
    (``path``, relative to the checkout, or to the home when ``home``)."""

    lower: str
    path: str
    home: bool = False


def layers_dir(home: Path) -> Path:
    """Where a task's layers live: beside its home (``{home}.layers``), never in it."""
    return home.with_name(home.name + LAYERS_SUFFIX)


def lay(
    home: Path, checkout: Path, lower: Path, paths: Sequence[str], lower_home: Path | None = None
) -> tuple[str, ...]:
    """Layer the directories among ``paths`` (relative) of the snapshot's ``lower`` over the same paths of
    ``checkout`` for every later command of the task whose home is ``home``, and the directories at the top of the
    snapshot's ``lower_home`` (a setup's caches: ``.cargo``, ``go``, ``.npm``) over the same names in ``home`` but
    ``.tasuki`` (the env files); the paths of the checkout layered (the others are not directories:
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


def remove_home(home: Path) -> tuple[str, ...]:
    """Delete a task's home whole, and its layers; what could not be removed (logged, relative paths) is returned.
    The home is the agent's: nothing in it is followed, and each of its directories is made writable first (a
    mode-000 directory would otherwise keep its contents)."""
    drop(home)
    left = remove_tree(home)
    if left:
        log.warning("task home not removed whole", home=home.name, left=len(left), first=list(left[:5]))
    return left


def drop(home: Path) -> None:
    """The task has no layers any more (what its commands wrote in them is deleted)."""
    left = remove_tree(layers_dir(home))
    if left:
        log.warning("task layers not removed whole", home=home.name, left=len(left), first=list(left[:5]))


def remove_tree(path: Path) -> tuple[str, ...]:
    """Delete ``path`` and everything under it without following a link: every real directory is made ``0700``
    through a descriptor opened with ``O_NOFOLLOW`` (overlayfs leaves its work directory mode 000, and so can the
    agent), then removed by ``shutil.rmtree`` (which never follows links either); the paths left behind."""
    try:
        top = os.open(path, _WALK)
    except FileNotFoundError:
        return ()
    except OSError:  # a link or a file in the tree's place: removed itself, never followed
        with contextlib.suppress(OSError):
            os.unlink(path)
        return () if not os.path.lexists(path) else (".",)
    try:
        _writable_below(top)
    finally:
        os.close(top)
    failed: list[str] = []
    shutil.rmtree(path, onerror=lambda _f, name, _e: failed.append(os.path.relpath(name, path)))
    return tuple(failed)


_WALK = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DEPTH = 512  # deeper than any honest tree; rmtree reports what lies below


def _writable_below(directory: int, depth: int = 0) -> None:
    """``0700`` for the directory ``directory`` and every real directory under it (fds only, links not followed)."""
    with contextlib.suppress(OSError):
        os.fchmod(directory, 0o700)
    if depth >= _MAX_DEPTH:
        return
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            child = os.open(entry.name, _WALK | os.O_PATH, dir_fd=directory)
        except OSError:
            continue
        try:
            os.chmod(f"/proc/self/fd/{child}", 0o700)  # an O_PATH fd: opened even at mode 000, chmod via its link
            reopened = os.open(".", _WALK, dir_fd=child)
        except OSError:
            os.close(child)
            continue
        os.close(child)
        try:
            _writable_below(reopened, depth + 1)
        finally:
            os.close(reopened)


def bwrap_options(layers: Sequence[Layer], own: Path, tmpfs_bytes: int | None = None) -> list[str]:
    """bubblewrap's options for a sandbox with ``layers``: the lower layers bound read-only and the task's own
    directories (``own``, :func:`layers_dir`) writable, where only the helper sees them; a /dev made by hand (see
    DEVICES), read-only but for its own ``shm`` (a tmpfs of ``tmpfs_bytes``); every capability for the helper (it
    drops them all before the command)."""
    options = ["--cap-add", "ALL", "--size", str(DEV_BYTES), "--tmpfs", "/dev"]
    for device in DEVICES:
        options += ["--dev-bind-try", f"/dev/{device}", f"/dev/{device}"]
    for target, name in DEV_LINKS:
        options += ["--symlink", target, name]
    options += ["--dir", "/dev/pts", *sized(tmpfs_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]  # noqa: S108
    for number, layer in enumerate(layers):
        options += ["--ro-bind", layer.lower, f"{LOWER_INSIDE}/{number}"]
        options += ["--bind", str(own / str(number)), f"{OWN_INSIDE}/{number}"]
    return options


def sized(size: int | None) -> list[str]:
    """bubblewrap's ``--size`` for the next ``--tmpfs`` (none: the kernel's default, half the memory)."""
    return ["--size", str(size)] if size is not None else []


def helper_argv(
    layers: Sequence[Layer],
    workspace: str,
    home_inside: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    writable: bool = True,
) -> list[str]:
    """``argv`` behind the helper that mounts ``layers`` over their paths under ``workspace`` (read-only when not
    ``writable``: what the task's commands changed over the snapshot), then runs it with ``env`` and no capability
    (the helper itself runs with an empty environment: bubblewrap's ``--clearenv``)."""
    paths = [
        path
        for number, layer in enumerate(layers)
        for path in (
            f"{LOWER_INSIDE}/{number}",
            f"{OWN_INSIDE}/{number}/upper",
            f"{OWN_INSIDE}/{number}/work",
            f"{home_inside if layer.home else workspace}/{layer.path}",
        )
    ]
    python3, setpriv = program("python3") or "/usr/bin/python3", program("setpriv") or "/usr/bin/setpriv"
    helper = [python3, "-I", "-S", "-c", HELPER, setpriv]
    applied = [program("env") or "/usr/bin/env", "-i", "--", *(f"{name}={value}" for name, value in env.items())]
    return [*helper, "1" if writable else "0", INSIDE, str(len(layers)), *paths, *applied, *argv]


def layers_probe(scratch_parent: Path, command: Command) -> str | None:
    """Why this host cannot restore by layers under ``scratch_parent`` (None: it can), found by running a real
    layered command: a file of the lower layer rewritten and another deleted, the layers' directory empty to the
    command, then the lower layer checked unchanged. ``command`` is a bubblewrap sandbox's ``command`` (the worker
    probes once per process: worker.environment)."""
    missing = [name for name in ("python3", "setpriv") if program(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found in the system directories (the sandbox's layer helper needs them)"
    try:
        scratch_parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".layers-probe-", dir=scratch_parent) as scratch:
            return _probe_in(Path(scratch), command)
    except OSError as exc:
        return f"its probe could not run ({exc})"


def _probe_in(scratch: Path, command: Command) -> str | None:
    lower, home, checkout = scratch / "lower", scratch / "home", scratch / "checkout"
    (lower / "env" / "sub").mkdir(parents=True)
    (lower / "env" / "kept").write_text("lower\n")
    (lower / "env" / "sub" / "gone").write_text("lower\n")
    home.mkdir()
    checkout.mkdir()
    lay(home, checkout, lower, ["env"])
    script = 'echo upper > env/kept && rm env/sub/gone && test ! -e env/sub/gone && test -z "$(ls -A "$1")"'
    argv, cwd = command(["sh", "-c", script, "probe", INSIDE], checkout, home, {"PATH": "/usr/bin:/bin"})
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its probe could not run ({exc})"
    finally:
        drop(home)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    if (lower / "env" / "kept").read_text() != "lower\n" or not (lower / "env" / "sub" / "gone").exists():
        return "its probe changed the lower layer"
    return None
