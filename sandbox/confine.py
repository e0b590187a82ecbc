"""What holds one sandboxed call on the host (issue 36): the user it runs as, its cgroup, its rlimits, its disk cap.

- **The user.** A worker running as root never runs a sandbox as root: the call drops to ``sandbox.user`` (util-linux
  ``setpriv``, no supplementary groups) before bubblewrap, so the sandbox's uid 0 is that user's, not the host's.
  The task's trees are handed over to it (:func:`hand_over`) and it is let through the worker's directories on the way
  to what bubblewrap binds (:func:`let_through`: an ACL entry naming that user only, search without listing).
- **The cgroup.** Each call gets a cgroup of its own with ``pids.max`` and ``memory.max`` (cgroup v2, in the worker's
  own delegated subtree; or v1's memory and pids hierarchies when the worker is root), joined by the call's first
  process before it can fork, and removed with whatever is left in it after the call. Where neither can be used the
  worker says why once, and calls run without it (RLIMIT_NPROC then bounds processes, as before). No address-space
  limit: Node reserves address space for WebAssembly far beyond what it uses.
- **rlimits.** ``prlimit``: the largest file and the CPU time.
- **The disk cap.** The task's home and its layers are measured during the call (a walk whose cost is bounded: at most
  a twentieth of the time); a call that makes them grow past ``sandbox.disk_bytes`` is killed with a clear line.

The chain that starts on the host is ``prlimit … -- sh -c JOIN cgroup.procs… -- setpriv … -- <the sandbox's line>``,
every program by its absolute path, with the fixed environment of :mod:`sandbox.host`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import secrets
import signal
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from sandbox import layers
from sandbox.host import program
from sandbox.settings import SandboxLimits

log = structlog.get_logger(__name__)

CALL_PREFIX = "tasuki-call-"  # a call's cgroup
WORKER_LEAF = "tasuki-worker"  # where a v2 worker moves its cgroup's processes so that the cgroup may have children
# Joins the cgroups named before "--" (their cgroup.procs), then runs the rest: the shell's own pid is the call's.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_KILL_WAIT_S = 5.0
_DISK_EVERY_S = 1.0  # the disk cap's first look; later ones wait twenty times as long as the last walk took
_DISK_MAX_ENTRIES = 2_000_000  # a walk stops here (its total so far is the measure)
_GiB = 1 << 30


class SandboxUserMissing(LookupError):
    """The worker runs as root and its sandbox user does not exist (or is root)."""


@dataclass(frozen=True)
class SandboxUser:
    """Who a root worker's sandboxes run as on the host."""

    name: str
    uid: int
    gid: int


def sandbox_user(name: str) -> SandboxUser | None:
    """The user a sandboxed call drops to: ``name`` when the worker is root, None when it is not (its sandboxes run as
    itself). SandboxUserMissing, one line with the fix, when ``name`` does not exist or is root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SandboxUserMissing(
            f"the worker runs as root and its sandbox user {name!r} (sandbox.user) does not exist: "
            f"useradd --system --no-create-home {name}"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SandboxUserMissing(f"sandbox.user {name!r} is root: name an unprivileged user")
    return SandboxUser(name, entry.pw_uid, entry.pw_gid)


def hand_over(path: Path, user: SandboxUser | None, depth: int | None = None) -> int:
    """Give ``path`` and what is below it (``depth`` levels at most; never following a link, never leaving its file
    system) to ``user``; what is its already is left alone, and so is a file with other hard links (never the
    worker's to give). How many entries changed owner. Nothing to do without a user (the worker is not root)."""
    if user is None:
        return 0
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return 0
    changed = _give(None, str(path), top, user)
    if not stat.S_ISDIR(top.st_mode) or depth == 0:
        return changed
    base = str(path).rstrip(os.sep).count(os.sep)
    for root, dirs, files, fd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            try:
                info = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            changed += _give(fd, name, info, user)
        deeper = depth is None or root.rstrip(os.sep).count(os.sep) - base + 1 < depth
        dirs[:] = [name for name in dirs if deeper and _same_device(fd, name, top.st_dev)]
    return changed


def hand_over_call(checkout: Path, home: Path, user: SandboxUser | None) -> None:
    """Before a call: what the worker itself writes into a task's trees while it runs (its env files, its git's
    objects, index and refs) is the sandbox user's again; the trees were handed over whole when the task began."""
    if user is None:
        return
    own = layers.layers_dir(home)  # a task's layers: the helper makes its upper and work directories as that user
    for path, depth in ((home, 0), (home / ".tasuki", None), (checkout, 0), (checkout / ".git", None), (own, 1)):
        hand_over(path, user, depth)


def _give(fd: int | None, name: str, info: os.stat_result, user: SandboxUser) -> int:
    if info.st_uid == user.uid and info.st_gid == user.gid:
        return 0
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return 0
    with contextlib.suppress(FileNotFoundError):
        os.chown(name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(name, stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID), dir_fd=fd)
        return 1
    return 0


def _same_device(fd: int, name: str, device: int) -> bool:
    try:
        return os.lstat(name, dir_fd=fd).st_dev == device
    except FileNotFoundError:
        return False


# POSIX ACLs as the kernel takes them (system.posix_acl_access): a version, then (tag, permissions, id) entries.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF
_SEARCH = 1


def _let_through_once(directory: str, uid: int) -> None:
    info = os.stat(directory)
    owner, group, other = (info.st_mode >> 6) & 7, (info.st_mode >> 3) & 7, info.st_mode & 7
    entries = [(_USER_OBJ, owner, _UNDEFINED_ID), (_USER, _SEARCH, uid), (_GROUP_OBJ, group, _UNDEFINED_ID)]
    entries += [(_MASK, group | _SEARCH, _UNDEFINED_ID), (_OTHER, other, _UNDEFINED_ID)]
    value = struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
    os.setxattr(directory, "system.posix_acl_access", value)


# (directory, inode, change time, uid) found passable: looked at again only once the directory changed — a chmod
# narrows an ACL's mask and takes the passage away (pytest does it to its own temporary root at every start), and a
# directory made again is another inode. A stat a directory instead of 2 ms a call.
_PASSABLE: set[tuple[str, int, int, int]] = set()


def let_through(paths: Iterable[str], user: SandboxUser | None) -> None:
    """Let ``user`` search (not list) each directory on the way to ``paths`` that it cannot pass yet and that the
    worker owns, by an ACL entry naming it alone; bubblewrap, run as that user, must reach what it binds. A
    directory the worker does not own, or whose file system takes no ACL, is left as it is (bubblewrap then says
    which path it cannot find)."""
    if user is None:
        return
    for path in paths:
        for directory in reversed(Path(path).parents):
            name = str(directory)
            if name == "/":
                continue
            try:
                info = os.stat(name)
            except OSError:
                continue  # missing: bubblewrap's -try binds skip it (a later call looks again)
            seen = (name, info.st_ino, info.st_ctime_ns, user.uid)
            if seen in _PASSABLE:
                continue
            if _can_search(name, user):
                if stat.S_ISDIR(info.st_mode):
                    _PASSABLE.add(seen)
                continue
            with contextlib.suppress(OSError):
                if os.stat(name).st_uid == os.geteuid():
                    _let_through_once(name, user.uid)


def _can_search(directory: str, user: SandboxUser) -> bool:
    try:
        info = os.stat(directory)
    except OSError:
        return True  # missing: bubblewrap's -try binds skip it
    if info.st_uid == user.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == user.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    if info.st_mode & stat.S_IXOTH:
        return True
    return _acl_lets(directory, user.uid)


def _acl_lets(directory: str, uid: int) -> bool:
    try:
        value = os.getxattr(directory, "system.posix_acl_access")
    except OSError:
        return False
    entries = [struct.unpack_from("<HHI", value, offset) for offset in range(4, len(value) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)  # a chmod since narrows the mask
    return any(tag == _USER and ident == uid and perm & mask & _SEARCH for tag, perm, ident in entries)


_BIND_SOURCES = frozenset({"--bind", "--ro-bind", "--bind-try", "--ro-bind-try", "--dev-bind", "--dev-bind-try"})
# bubblewrap's options that take arguments, by how many; the others take none.
_ARITY = {
    **dict.fromkeys(_BIND_SOURCES, 2),
    **dict.fromkeys(("--symlink", "--setenv", "--bind-fd", "--ro-bind-fd", "--file", "--bind-data", "--chmod"), 2),
    **dict.fromkeys(("--ro-bind-data",), 2),
    **dict.fromkeys(
        (
            "--unsetenv", "--hostname", "--cap-drop", "--cap-add", "--dev", "--proc", "--tmpfs", "--dir", "--chdir",
            "--remount-ro", "--size", "--perms", "--seccomp", "--add-seccomp-fd", "--uid", "--gid", "--sync-fd",
            "--userns", "--userns2", "--pidns", "--args", "--exec-label", "--file-label", "--lock-file", "--block-fd",
            "--userns-block-fd", "--info-fd", "--json-status-fd", "--mqueue", "--argv0",
        ),
        1,
    ),
}


def bind_sources(argv: Sequence[str]) -> list[str]:
    """The host paths a sandbox's line binds: the sources of bubblewrap's bind options, read option by option (an
    option's arguments are never taken for options) from ``bwrap`` up to ``--``."""
    start = next((n + 1 for n, arg in enumerate(argv) if os.path.basename(arg) == "bwrap"), len(argv))
    sources, n = [], start
    while n < len(argv) and argv[n] != "--":
        option = argv[n]
        if option in _BIND_SOURCES and n + 1 < len(argv):
            sources.append(argv[n + 1])
        n += 1 + _ARITY.get(option, 0)
    return [source for source in sources if source.startswith("/")]


# ---- cgroups ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cgroups:
    """Where this worker makes its calls' cgroups: v2's one base, or v1's memory and pids bases."""

    version: int
    bases: tuple[Path, ...]  # v2: (base,); v1: (memory base, pids base)


@functools.cache
def call_cgroups() -> Cgroups | None:
    """This process's place for its calls' cgroups, found once (the reason there is none is logged once)."""
    try:
        found = _v2() or _v1()
    except OSError as exc:
        found, why = None, f"{exc.strerror or exc}"
    else:
        why = "no cgroup v2 with memory and pids, nor v1 memory and pids hierarchies the worker (as root) can write"
    if found is None:
        log.warning("tool calls run without a cgroup: no pids.max nor memory.max for them", reason=why)
    else:
        log.info("tool calls run in cgroups", version=found.version, base=[str(b) for b in found.bases])
    return found


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of each cgroup mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        kind, _source, options = [*rest.split(" "), "", "", ""][:3]
        if kind in ("cgroup", "cgroup2"):
            found.append((fields.split(" ")[4], kind, options))
    return found


def _own(controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` ("" : v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _number, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    return None


def _v2() -> Cgroups | None:
    mount = next((point for point, kind, _ in _mounts() if kind == "cgroup2"), None)
    own = _own("")
    if mount is None or own is None:
        return None
    base = Path(mount) / own.lstrip("/")
    if base.name == WORKER_LEAF:  # an earlier worker process of this cgroup moved us here
        base = base.parent
    if not {"memory", "pids"} <= set((base / "cgroup.controllers").read_text().split()):
        return None
    if not os.access(base / "cgroup.subtree_control", os.W_OK):
        return None
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        try:
            _enable(base)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            _vacate(base)  # a cgroup with processes may not give its controllers to children
            _enable(base)
    return Cgroups(2, (base,))


def _enable(base: Path) -> None:
    (base / "cgroup.subtree_control").write_text("+memory +pids")


def _vacate(base: Path) -> None:
    """Move every process of ``base`` into its leaf (this worker among them)."""
    leaf = base / WORKER_LEAF
    leaf.mkdir(exist_ok=True)
    for pid in (base / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError, OSError):
            (leaf / "cgroup.procs").write_text(pid)


def _v1() -> Cgroups | None:
    if os.geteuid() != 0:
        return None
    bases = []
    for controller in ("memory", "pids"):
        mounts = (p for p, kind, options in _mounts() if kind == "cgroup" and controller in options.split(","))
        mount = next(mounts, None)
        own = _own(controller)
        if mount is None or own is None:
            return None
        base = Path(mount) / own.lstrip("/")
        if not os.access(base, os.W_OK):
            return None
        bases.append(base)
    return Cgroups(1, tuple(bases))


@dataclass
class CallCgroup:
    """One call's cgroup (v2: one directory; v1: one in memory's hierarchy and one in pids')."""

    cgroups: Cgroups
    limits: SandboxLimits
    paths: list[Path] = field(default_factory=list)

    def make(self) -> None:
        """Make the directories and set the limits."""
        name = f"{CALL_PREFIX}{secrets.token_hex(6)}"
        for base in self.cgroups.bases:
            (base / name).mkdir()
            self.paths.append(base / name)
        memory, pids = (self.paths[0], self.paths[0]) if self.cgroups.version == 2 else self.paths
        if self.limits.memory_bytes is not None:
            wanted = "memory.max" if self.cgroups.version == 2 else "memory.limit_in_bytes"
            (memory / wanted).write_text(str(self.limits.memory_bytes))
            if self.cgroups.version == 2:
                with contextlib.suppress(OSError):  # no swap for a call over its memory (absent without swap)
                    (memory / "memory.swap.max").write_text("0")
        if self.limits.processes is not None:
            (pids / "pids.max").write_text(str(self.limits.processes))

    @property
    def procs(self) -> list[str]:
        """The files the call's first process writes its pid to."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def kill(self) -> None:
        """SIGKILL to everything in the cgroup."""
        kill_file = self.paths[0] / "cgroup.kill" if self.paths else None
        if kill_file is not None and self.cgroups.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        for path in self.paths:
            for pid in _pids(path):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def hits(self) -> list[str]:
        """Which of the call's limits the kernel enforced (read before the cgroup goes)."""
        memory, pids = (self.paths[0], self.paths[0]) if self.cgroups.version == 2 else self.paths
        found = []
        memory_events = "memory.events" if self.cgroups.version == 2 else "memory.oom_control"
        if _counter(memory / memory_events, "oom_kill") > 0:
            found.append(
                f"the command used all the memory a call may (sandbox.limits.memory_bytes: "
                f"{_size(self.limits.memory_bytes)}): the kernel killed a process of it"
            )
        if _counter(pids / "pids.events", "max") > 0:
            found.append(
                f"the command reached the processes a call may have (sandbox.limits.processes: "
                f"{self.limits.processes}): a fork failed"
            )
        return found

    def remove(self) -> None:
        """Kill what is left and remove the directories (retried until they are empty, a few seconds at most)."""
        deadline = time.monotonic() + _KILL_WAIT_S
        for path in self.paths:
            pause = 0.0005  # the sandbox's last processes are usually gone within a millisecond or two
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("a call's cgroup could not be removed", cgroup=str(path))
                        break
                    self.kill()
                    time.sleep(pause)
                    pause = min(pause * 2, 0.01)


def _pids(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _counter(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _size(value: int | None) -> str:
    if value is None:
        return "no limit"
    return f"{value / _GiB:g} GiB" if value >= _GiB else f"{value >> 20} MiB"


# ---- the disk cap -------------------------------------------------------------------------------------------------


def disk_usage(paths: Sequence[Path], max_entries: int = _DISK_MAX_ENTRIES) -> int:
    """Bytes the trees at ``paths`` take on disk (allocated blocks; links not followed, hard links counted once);
    the walk stops after ``max_entries`` entries."""
    seen: set[tuple[int, int]] = set()
    total, count = 0, 0
    stack = [str(path) for path in paths]
    while stack and count < max_entries:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                for entry in listing:
                    count += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class Disk:
    """What the disk cap measures of a task (its home and its environment layers), and how much they may take."""

    paths: tuple[Path, ...]
    cap: int


def task_disk(sandbox: object, home: Path) -> Disk | None:
    """The disk cap of a call with the task's ``home`` in ``sandbox`` (its ``disk_bytes``; None: no cap)."""
    cap = getattr(sandbox, "disk_bytes", None)
    return Disk((home, layers.layers_dir(home)), cap) if isinstance(cap, int) else None


class DiskWatch:
    """Measures ``paths`` while a call runs and calls ``kill`` once they grew past ``cap`` bytes (and past what they
    took when the call began: a task over its cap may still delete)."""

    def __init__(self, paths: Sequence[Path], cap: int, kill: Callable[[], None]) -> None:
        self.paths, self.cap, self.kill = tuple(paths), cap, kill
        self.over: int | None = None  # the measure that passed the cap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tasuki-disk-cap", daemon=True)

    def start(self) -> None:
        """Begin measuring (the first measure is the call's starting point)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop measuring; one last look says whether the call ended over the cap."""
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        began = time.monotonic()
        start = disk_usage(self.paths)
        wait = max(_DISK_EVERY_S, 20 * (time.monotonic() - began))
        while not self._stop.wait(wait):
            began = time.monotonic()
            used = disk_usage(self.paths)
            wait = max(_DISK_EVERY_S, 20 * (time.monotonic() - began))
            if used > self.cap and used > start:
                self.over = used
                self.kill()
                return
        used = disk_usage(self.paths)
        if used > self.cap and used > start:
            self.over = used


# ---- one call ------------------------------------------------------------------------------------------------------


@dataclass
class Confined:
    """One call's line on the host (``argv``) and, once it ended, what it hit (``notes``: a line each)."""

    argv: list[str]
    cgroup: CallCgroup | None = None
    disk: DiskWatch | None = None
    disk_cap: int | None = None
    pid: int | None = None
    notes: list[str] = field(default_factory=list)

    def started(self, pid: int) -> None:
        """The call's first process is ``pid`` (its own session): the disk cap may begin watching."""
        self.pid = pid
        if self.disk is not None:
            self.disk.start()

    def _kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
        elif self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    @property
    def disk_error(self) -> str | None:
        """The disk cap's line when the call made the task's home and layers pass it, else None."""
        if self.disk is None or self.disk.over is None:
            return None
        return (
            f"the task's home and layers take {_size(self.disk.over)} on disk, over sandbox.disk_bytes "
            f"({_size(self.disk_cap)}): the command was killed; delete what it does not need in $HOME"
        )


@contextlib.contextmanager
def confined(
    argv: Sequence[str],
    limits: SandboxLimits | None,
    cpu_s: int,
    *,
    user: SandboxUser | None = None,
    disk: Disk | None = None,
) -> Iterator[Confined]:
    """``argv`` (a sandbox's line) wrapped to run confined: behind ``prlimit``, in a cgroup of its own, as ``user``;
    the block starts it (calling :meth:`Confined.started`) and waits for it. At the end whatever is left in the
    cgroup is killed, the cgroup removed, and what the call hit is in ``notes`` (and :attr:`Confined.disk_error`).
    ``limits`` None: no cgroup nor rlimits, the user all the same."""
    cgroups = call_cgroups() if limits is not None else None
    cgroup = CallCgroup(cgroups, limits) if cgroups is not None and limits is not None else None
    if cgroup is not None:
        try:
            cgroup.make()
        except OSError as exc:
            log.warning("a call's cgroup could not be made; it runs without", error=str(exc)[:200])
            cgroup.remove()
            cgroup = None
    line = list(argv)
    if user is not None:
        let_through(bind_sources(line), user)
        setpriv = program("setpriv") or "/usr/bin/setpriv"
        line = [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--", *line]
    if cgroup is not None:
        line = [program("sh") or "/bin/sh", "-c", _JOIN, "tasuki-join", *cgroup.procs, "--", *line]
    if limits is not None:
        line = _rlimits(line, limits, cpu_s, nproc=cgroup is None)
    call = Confined(line, cgroup, disk_cap=disk.cap if disk is not None else None)
    if disk is not None:
        call.disk = DiskWatch(disk.paths, disk.cap, call._kill)
    try:
        yield call
    finally:
        if call.disk is not None and call.pid is not None:
            call.disk.stop()
        if cgroup is not None:
            call.notes += cgroup.hits()
            cgroup.kill()
            cgroup.remove()


def _rlimits(argv: list[str], limits: SandboxLimits, cpu_s: int, *, nproc: bool) -> list[str]:
    """``argv`` behind util-linux's ``prlimit`` (a program, not a ``preexec_fn``: forking a threaded worker must not
    run Python in the child): the largest file, the CPU time, and the processes when no cgroup counts them."""
    wanted = {"--fsize": limits.file_size_bytes, "--cpu": cpu_s, "--nproc": limits.processes if nproc else None}
    prlimit = program("prlimit")
    if prlimit is None:
        _warn_once("prlimit (util-linux) not found: tool calls run without rlimits")
        return argv
    return [prlimit, *(f"{flag}={value}" for flag, value in wanted.items() if value is not None), "--", *argv]


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)
