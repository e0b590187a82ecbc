"""Hosts as network namespaces for the fleet tests (SPEC §12, issue 27).

A :class:`Network` is a switch namespace holding one bridge, and a namespace per host, each linked to the bridge by
a veth pair (the host's ``eth0`` at ``10.77.0.N``, its peer in the switch namespace): traffic goes only between the
namespaces the test made, never through the root namespace's network. A worker :class:`Host` also has its own PID
and UTS namespace (``unshare --pid --fork --mount-proc --uts`` inside ``ip netns exec``): its own hostname, and an
init whose death takes every process of the host with it (the kernel kills a PID namespace with its init).

Names carry a per-process prefix (``tk<pid>``), so parallel runs never collide; :meth:`Network.close` kills every
process in each namespace it made and deletes them (also when the test failed), then sweeps its prefix and those
of runs whose process is gone. Where ``ip netns add`` is not permitted the tests skip (fail in CI).

The test process itself stays in the root namespace and reaches a host by :func:`entered`, which moves only the
calling thread into the host's network namespace: sockets opened there (a PostgreSQL or Redis client, a server's
listening socket) and processes started there stay in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.ci import cannot_run

SUBNET = "10.77.0"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
SWITCH, BRIDGE = "sw", "br0"
PREFIX = f"tk{os.getpid()}"
_serial = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
TIMEOUT_S = 30.0


def ip(*args: str) -> str:
    """``ip ARGS``; raises with its stderr when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the calling thread in network namespace ``name`` until the block ends."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def netns_can_be_made() -> str | None:
    """Why this machine cannot make network namespaces, or None when it can."""
    probe = f"{PREFIX}-probe"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, OSError) as exc:
        return f"network namespaces cannot be made here ({exc})"
    ip("netns", "delete", probe)
    return None


def pids_in(name: str) -> list[int]:
    """Every process whose network namespace is ``name``."""
    try:
        return [int(pid) for pid in ip("netns", "pids", name).split()]
    except RuntimeError:
        return []


def remove_namespace(name: str) -> None:
    """SIGKILL every process in namespace ``name``, then delete it (its veth ends go with it)."""
    for _ in range(50):  # a process may fork while we kill; until none is left
        pids = pids_in(name)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)  # let the kernel reap them before we look again
    with contextlib.suppress(RuntimeError):
        ip("netns", "delete", name)


def sweep(prefix: str = PREFIX) -> None:
    """Remove the namespaces of ``prefix``, and those of earlier runs whose process is gone."""
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        owner = re.match(r"tk(\d+)(?:\.\d+)?-", name)
        if name.startswith(f"{prefix}-") or (owner and not Path(f"/proc/{owner.group(1)}").exists()):
            remove_namespace(name)


@dataclass
class Namespace:
    """One host's network namespace, linked to the switch; ``link`` is its veth end in the switch namespace."""

    name: str
    address: str
    switch: str
    link: str

    def exec_args(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *command]

    def entered(self) -> contextlib.AbstractContextManager[None]:
        return entered(self.name)

    def cut(self) -> None:
        """Take the host's link down at the switch: it reaches nobody and nobody reaches it."""
        ip("-n", self.switch, "link", "set", self.link, "down")

    def heal(self) -> None:
        ip("-n", self.switch, "link", "set", self.link, "up")


@dataclass
class Host(Namespace):
    """A worker host: its namespace, plus a PID and UTS namespace whose init is ``init``'s child."""

    hostname: str = ""
    root: Path = Path()
    init: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def boot(self) -> Host:
        """Start the host's init (``sleep infinity`` as PID 1 under the host's hostname) and wait for it."""
        self.root.mkdir(parents=True, exist_ok=True)
        script = 'hostname "$0" && exec sleep infinity'
        self.init = subprocess.Popen(
            self.exec_args(
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--uts",
                "--kill-child",
                "--",
                "sh",
                "-c",
                script,
                self.hostname,
            ),
            start_new_session=True,
        )
        _wait(lambda: _command_of(self._init_pid()) == "sleep", f"host {self.hostname}'s init")  # hostname set
        return self

    def _init_pid(self) -> int | None:
        """PID 1 of the host's PID namespace, as the root namespace numbers it (the child of ``unshare``)."""
        assert self.init is not None
        try:
            children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    @property
    def init_pid(self) -> int:
        pid = self._init_pid()
        assert pid is not None, f"host {self.hostname} has no init"
        return pid

    def _enter(self) -> list[str]:
        """``nsenter`` into the host's network, PID, UTS and mount namespaces."""
        return ["nsenter", "-t", str(self.init_pid), "--net", "--pid", "--uts", "--mount", "--"]

    def popen(self, command: list[str], *, env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        """Start ``command`` on this host, its output appended to ``log``."""
        with log.open("ab") as out:
            process = subprocess.Popen(
                [*self._enter(), *command],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def run(self, command: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on this host to its end, its output captured."""
        return subprocess.run(
            [*self._enter(), *command], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120
        )

    def pids(self) -> list[int]:
        """Every live process of the host's PID namespace (its init included), as the root namespace numbers it."""
        try:
            own = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except (AssertionError, OSError):
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/pid") == own and _state(int(entry)) != "Z":
                        found.append(int(entry))
        return found

    def pause(self) -> set[int]:
        """SIGSTOP every process of the host (until no new one shows up); returns them for :meth:`resume`."""
        stopped: set[int] = set()
        while fresh := [pid for pid in self.pids() if pid not in stopped]:
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
        return stopped

    def resume(self, stopped: set[int]) -> None:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def kill(self) -> None:
        """The host dies: SIGKILL its init, which the kernel follows with every process of the namespace."""
        os.kill(self.init_pid, signal.SIGKILL)
        for process in [*self.processes, *([self.init] if self.init else [])]:
            process.wait(timeout=TIMEOUT_S)

    def shutdown(self) -> None:
        """Teardown: kill whatever is left of the host and reap what we started. The namespace's processes die
        with its init; ``unshare`` and ``nsenter`` reap them and exit (killed first, they would leave zombies to a
        PID 1 that may never reap them)."""
        with contextlib.suppress(AssertionError, ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)
        for process in [*self.processes, *([self.init] if self.init else [])]:
            try:
                process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=TIMEOUT_S)


class Network:
    """The switch namespace and its hosts; :meth:`close` removes every one of them and every process in them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"{PREFIX}.{next(_serial)}"
        self.switch = f"{self.prefix}-{SWITCH}"
        self.members: list[Namespace] = []
        self._made: list[str] = []
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", BRIDGE, "up")

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _link(self, role: str) -> tuple[str, str, str]:
        """A namespace for ``role`` with ``eth0`` on the bridge; its name, address and the switch's end."""
        name, address = f"{self.prefix}-{role}", f"{SUBNET}.{len(self.members) + 1}"
        self._add_namespace(name)
        ip("-n", self.switch, "link", "add", role, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("-n", self.switch, "link", "set", role, "master", BRIDGE, "up")
        ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        return name, address, role

    def namespace(self, role: str) -> Namespace:
        """A plain host (storage, model): a network namespace on the bridge."""
        name, address, link = self._link(role)
        made = Namespace(name, address, self.switch, link)
        self.members.append(made)
        return made

    def host(self, hostname: str) -> Host:
        """A worker host named ``hostname``, with its own PID namespace and directory, booted."""
        name, address, link = self._link(hostname)
        made = Host(name, address, self.switch, link, hostname=hostname, root=self.root / hostname)
        self.members.append(made)
        return made.boot()

    def close(self) -> None:
        for member in self.members:
            if isinstance(member, Host):
                member.shutdown()
        for name in reversed(self._made):
            remove_namespace(name)
        sweep(self.prefix)


@contextlib.contextmanager
def network(root: Path) -> Iterator[Network]:
    """A :class:`Network` for one test, removed on the way out whatever happened; skips (fails in CI) where
    namespaces cannot be made."""
    problem = netns_can_be_made()
    if problem is not None:
        cannot_run(problem)
    made = None
    try:
        made = Network(root)
        yield made
    finally:
        if made is not None:
            made.close()
        else:  # the switch itself failed half-made
            sweep(PREFIX)


def _command_of(pid: int | None) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() if pid else None
    except OSError:
        return None


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _wait(predicate: object, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)  # polling, bounded by the deadline
    raise AssertionError(f"timed out waiting for {what}")
