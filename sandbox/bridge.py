"""A task's network under ``sandbox.network: full`` or ``allowlist``: one network namespace for all of its calls.

The namespace is held by a small sandbox of its own for as long as the task's egress proxy lives: bubblewrap with new
user, network and PID namespaces, running socat as the sandbox's user, which listens on ``127.0.0.1:3128`` there and
bridges every connection to the proxy's unix socket. Each of the task's calls joins that user and network namespace
(``nsenter``, as the same user: the owner of a user namespace may enter it) before its own bubblewrap makes the rest
of its namespaces as before. A call then starts nothing for the network: before, each started socat and waited for
it to listen, which doubled a call's cost.

The agent's command sees the bridge's port and nothing else of it: the holder's processes are in another PID
namespace, it holds no capability in the namespace that owns the network (so it can change no address, route or
filter there), and socat serves at most :data:`MAX_CONNECTIONS` connections at a time. The holder is started by a
thread of its own and dies with it (bubblewrap's ``--die-with-parent``): with the task's proxy (:func:`stop`), or with
the worker.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import structlog

from contexts.errors import TasukiError
from contexts.lock import process_alive
from sandbox.host import HOST_ENV, program

log = structlog.get_logger(__name__)

PORT = 3128  # where the proxy is, inside
SOCKET_INSIDE = "/run/tasuki/egress.sock"
MAX_CONNECTIONS = 64  # socat's children at a time: they run outside the calls' cgroups
START_TIMEOUT_S = 10.0
INFO_FD = "{info-fd}"  # in a holder line: the descriptor bubblewrap writes the holder's pid to
_LISTENING = f"0100007F:{PORT:04X} 00000000:0000 0A"  # /proc/net/tcp: 127.0.0.1:3128, any remote, LISTEN


class BridgeError(TasukiError):
    """The task's network namespace could not be made (its bridge to the egress proxy did not start)."""


class Bridge:
    """The network namespace of the task whose egress proxy listens on ``socket``, and socat in it."""

    def __init__(self, socket: Path, line: Sequence[str]) -> None:
        self.socket, self.line = socket, list(line)
        self.pid: int | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def target(self) -> int:
        """The pid whose namespaces a call joins; the holder is (re)started when it is not running."""
        with self._lock:
            if self.pid is None or not process_alive(self.pid):
                self._start()
            assert self.pid is not None  # noqa: S101 - _start sets it or raises
            return self.pid

    def stop(self) -> None:
        """End the holder (its thread exits: bubblewrap's --die-with-parent takes it and socat)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)

    def _start(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
        self._stopping, self._ready, self._error, self.pid = threading.Event(), threading.Event(), None, None
        self._thread = threading.Thread(target=self._hold, name="tasuki-egress-bridge", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S + 1) or self.pid is None:
            self._stopping.set()
            raise BridgeError(f"the task's egress bridge did not start: {self._error or 'no answer in time'}")

    def _hold(self) -> None:
        """The holder's whole life, in this thread: start it, say when it listens, wait for the stop, end it."""
        with tempfile.TemporaryFile() as said:  # bubblewrap's or socat's complaint, read only when it fails
            read, write = os.pipe()
            line = [str(write) if arg == INFO_FD else arg for arg in self.line]
            try:
                process = subprocess.Popen(
                    line,
                    env=HOST_ENV,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=said,
                    pass_fds=(write,),
                    start_new_session=True,
                )
            except OSError as exc:
                self._error = str(exc)
                return
            finally:
                os.close(write)
                if self._error is not None:
                    os.close(read)
                    self._ready.set()
            try:
                self.pid = self._wait_listening(read, process, said)
            except BridgeError as exc:
                self._error = str(exc)
            finally:
                os.close(read)
                self._ready.set()
            self._stopping.wait()
            process.kill()
            process.wait()

    def _wait_listening(self, info: int, process: subprocess.Popen[bytes], said: IO[bytes]) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        data = b""
        while b"}" not in data:  # bubblewrap's --info-fd: {"child-pid": N, ...}
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([info], [], [], remaining)[0]:
                raise BridgeError("bubblewrap said nothing")
            chunk = os.read(info, 4096)
            if not chunk:
                code = process.wait()
                said.seek(0)
                lines = said.read(4000).decode(errors="replace").strip().splitlines()
                raise BridgeError(lines[-1] if lines else f"bubblewrap exited ({code})")
            data += chunk
        pid = int(json.loads(data[: data.index(b"}") + 1])["child-pid"])
        pause = 0.0005
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BridgeError(f"socat exited ({process.returncode})")
            try:
                if _LISTENING in Path(f"/proc/{pid}/net/tcp").read_text():
                    return pid
            except OSError as exc:
                raise BridgeError(f"its network cannot be read ({exc.strerror})") from exc
            time.sleep(pause)  # the holder's own start, a few milliseconds once per task
            pause = min(pause * 2, 0.02)
        raise BridgeError(f"socat did not listen within {START_TIMEOUT_S:g} s")


def holder_line(bwrap: str, socat: str, socket: Path, system: Sequence[str], user: Sequence[str]) -> list[str]:
    """The holder's command line: ``user`` (setpriv to the sandbox's user, or nothing), then bubblewrap with the
    system directories (``system``: its ``--ro-bind``/``--symlink`` options) and the proxy's socket, running socat."""
    listen = f"TCP-LISTEN:{PORT},bind=127.0.0.1,fork,reuseaddr,max-children={MAX_CONNECTIONS}"
    return [
        *user,
        bwrap,
        "--unshare-user",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--dev-bind",  # not --dev: bubblewrap would then nest a second user namespace, which a call could not join
        "/dev/null",
        "/dev/null",
        "--proc",
        "/proc",
        *system,
        "--ro-bind",
        str(socket),
        SOCKET_INSIDE,
        "--info-fd",
        INFO_FD,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--",
        socat,
        listen,
        f"UNIX-CONNECT:{SOCKET_INSIDE}",
    ]


_BRIDGES: dict[Path, Bridge] = {}
_REGISTRY = threading.Lock()


def bridge(socket: Path, line: Sequence[str]) -> Bridge:
    """The bridge of the task whose proxy listens on ``socket`` (made on first use; ``line`` as :func:`holder_line`
    makes it)."""
    with _REGISTRY:
        found = _BRIDGES.get(socket)
        if found is None:
            found = _BRIDGES[socket] = Bridge(socket, line)
        return found


def stop(socket: Path) -> None:
    """The task's proxy is going: its bridge goes too (nothing when it never started)."""
    with _REGISTRY:
        found = _BRIDGES.pop(socket, None)
    if found is not None:
        found.stop()


def join_line(pid: int) -> list[str]:
    """What a call runs its bubblewrap behind: the holder's user and network namespaces joined."""
    nsenter = program("nsenter") or "/usr/bin/nsenter"
    return [nsenter, f"--target={pid}", "--user", "--net", "--preserve-credentials", "--"]
