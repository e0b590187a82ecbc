"""A task's services (SPEC §17): the databases and caches its tests need, each in a sandbox of its own.

They are declared in ``.tasuki/services.yml`` (``NAME: {command, ready, ready_timeout_s}``) or, for a repository
the operator cannot change, in ``environments.repositories[REPO].services``. Each service runs in the agent's jail
(:mod:`sandbox.jail`, the configured backend) with what a service needs differently:

- the checkout at ``/workspace`` **read-only** (a configuration file in the repository can be used; the work cannot
  be changed by a service);
- the task's home read-write at ``HOME``; the service's own directory ``HOME/.services/NAME`` (its
  ``$TASUKI_SERVICE_DIR``) holds its data, its sockets and ``service.log`` (its output, masked), so its data is
  the task's alone and goes with the task's home;
- an empty network namespace, whatever ``sandbox.network`` is: the agent's commands reach a service through the
  unix socket it makes in its directory (a path, so it works across network namespaces); a TCP port it opens is
  its own, seen by nobody (two tasks' services never meet on a port);
- a non-root user inside when the worker runs as root (PostgreSQL refuses to run as root).

A service is stopped with the task: SIGTERM to its processes, SIGKILL after a grace. A killed worker takes its
services along: ``bwrap --die-with-parent`` kills the sandbox's init, and with it its whole PID namespace. (The
parent is the *thread* that started it: start services from the thread that lives as long as the task.)
A service that fails to start or to become ready does not fail the task: the agent is told why.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import pwd
import re
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import structlog
import yaml
from pydantic import TypeAdapter, ValidationError

from contexts.errors import TasukiError
from contexts.masking import mask
from sandbox import confine, envfiles
from sandbox.jail import WORKSPACE, Bubblewrap, Sandbox, backend
from sandbox.settings import EnvironmentsSettings, SandboxSettings, ServiceSettings

log = structlog.get_logger(__name__)

SERVICES_FILE = ".tasuki/services.yml"
SERVICES_DIR = ".services"  # under the task's home
LOG_NAME = "service.log"
GRACE_S = 10.0  # between SIGTERM and SIGKILL when a service is stopped
READY_POLL_S = 0.2  # between two runs of a readiness check
READY_CHECK_S = 10.0  # a check started before the deadline may take this long (a sandbox starts slowly under load)
TAIL_LINES = 20  # lines of a failed service's log the agent is shown
MAX_LOG_BYTES = 10 * 1024 * 1024  # of a service's log
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DECLARED = TypeAdapter(dict[str, ServiceSettings])


class ServicesError(TasukiError):
    """A services declaration that cannot be used (one line: the file and the problem)."""


def declared_services(checkout: Path, repository: str, settings: EnvironmentsSettings) -> dict[str, ServiceSettings]:
    """The task's services: ``.tasuki/services.yml`` in the checkout, else the operator's for ``repository``."""
    path = checkout / SERVICES_FILE
    if path.is_symlink() or path.parent.is_symlink():  # the worker reads it: never a file outside the checkout
        raise ServicesError(f"{SERVICES_FILE}: a symbolic link; services are declared in a file of the repository")
    if path.is_file():
        return parse_services(path.read_text(encoding="utf-8", errors="replace"), SERVICES_FILE)
    configured = settings.for_repository(repository)
    return dict(configured.services) if configured is not None else {}


def parse_services(text: str, source: str) -> dict[str, ServiceSettings]:
    """``NAME: {command, ready, ready_timeout_s}`` from YAML; ServicesError names ``source`` and the problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ServicesError(f"{source}: not valid YAML{line}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    try:
        services = _DECLARED.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "top level"
        raise ServicesError(f"{source}: {where}: {first['msg']}") from None
    for name in services:
        if not _NAME.fullmatch(name):
            raise ServicesError(f"{source}: service name {name!r} must be letters, digits, '_', '.', '-'")
    return services


@dataclass(frozen=True)
class ServiceOutcome:
    """How a service's start went: ``problem`` is None when it is ready."""

    name: str
    directory: str  # as the agent's commands see it
    problem: str | None = None


@dataclass
class _Running:
    process: subprocess.Popen[bytes]
    pump: threading.Thread
    tail: collections.deque[str]


class ServiceJail:
    """How a service's commands are wrapped: the agent's sandbox, network-less, checkout read-only, home bound."""

    def __init__(self, settings: SandboxSettings, checkout: Path, home: Path) -> None:
        self.sandbox: Sandbox = backend(settings.backend).make(settings.model_copy(update={"network": "none"}))
        if isinstance(self.sandbox, Bubblewrap):
            self.sandbox.layers_writable = False  # the environment as the task's commands left it, read-only
        self.checkout, self.home = checkout, home
        self.home_inside = self.sandbox.home_inside(home)

    def confined(self, line: tuple[list[str], Path]) -> tuple[list[str], Path]:
        """A service's line run as the sandbox's user when the worker is root (sandbox.confine; no cgroup: a service
        lives as long as its task), with what the worker made in the home (its directory, its log) handed over."""
        argv, cwd = line
        user = self.sandbox.user
        confine.hand_over_call(self.checkout, self.home, user)
        confine.hand_over(self.home / SERVICES_DIR, user)
        with confine.confined(argv, None, 0, user=user) as call:
            return call.argv, cwd

    def directory(self, name: str) -> str:
        """The service's directory as every sandbox of the task sees it."""
        return f"{self.home_inside}/{SERVICES_DIR}/{name}"

    def command(self, script: str, name: str) -> tuple[list[str], Path]:
        """``bash -c script`` in the jail of the service ``name``, and the host directory to start it in."""
        argv, cwd = self.sandbox.command(["bash", "-c", script], self.checkout, self.home, self.env(name))
        if not isinstance(self.sandbox, Bubblewrap):  # bwrap's own options follow
            return argv, cwd
        # Mounted after the jail's own: the read-only checkout covers its writable one (the home is bound as always).
        extra = ["--ro-bind", str(self.checkout), WORKSPACE]
        if os.getuid() == 0:
            extra += ["--uid", str(_nobody()), "--gid", str(_nobody(group=True))]
        end = argv.index("--")
        return [*argv[:end], *extra, *argv[end:]], cwd

    def env(self, name: str) -> dict[str, str]:
        """The service's whole environment: with what the task's env files add (a setup may have installed the
        service's program in the home and named its directory in $TASUKI_PATH)."""
        base = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        own = {"HOME": self.home_inside, "TMPDIR": self.home_inside, "TASUKI_SERVICE_DIR": self.directory(name)}
        roots = self.sandbox.roots(self.checkout, self.home)
        return {**envfiles.applied(base, self.home, self.home_inside, roots).env, **own}

    def launch_env(self, name: str) -> dict[str, str]:
        """The environment the jail's command line starts with on the host."""
        return self.sandbox.launch_env(self.env(name))


def _nobody(*, group: bool = False) -> int:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534
    return entry.pw_gid if group else entry.pw_uid


class Services:
    """The services of one task, started together and stopped together."""

    def __init__(self, declared: Mapping[str, ServiceSettings], jail: ServiceJail, *, grace_s: float = GRACE_S):
        self.declared, self.jail, self.grace_s = dict(declared), jail, grace_s
        self.running: dict[str, _Running] = {}
        self.outcomes: list[ServiceOutcome] = []

    def start(self) -> list[ServiceOutcome]:
        """Start every service, then wait for each to be ready (its own deadline); the failed ones are stopped."""
        started = {name: (self._launch(name, service), time.monotonic()) for name, service in self.declared.items()}
        for name, (not_launched, since) in started.items():
            service = self.declared[name]
            problem = not_launched or self._wait_ready(name, service, since + service.ready_timeout_s)
            if problem is not None:
                problem = self._failed(name, problem)
            self.outcomes.append(ServiceOutcome(name, self.jail.directory(name), problem))
            log.info("service started" if problem is None else "service not available", service=name, problem=problem)
        return self.outcomes

    def stop(self) -> None:
        """Stop every service still running: SIGTERM to its processes, SIGKILL after the grace."""
        for name in list(self.running):
            self._stop(name)

    def _launch(self, name: str, service: ServiceSettings) -> str | None:
        try:
            output = _open_log(self.jail.home, name)
        except OSError as exc:
            return f"its directory cannot be made ({exc.strerror or exc})"
        argv, cwd = self.jail.confined(self.jail.command(service.command, name))
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.jail.launch_env(name),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            output.close()
            return f"it cannot start ({exc.strerror or exc})"
        assert process.stdout is not None  # noqa: S101 - stdout=PIPE guarantees it
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        pump = threading.Thread(target=_pump, args=(process.stdout, output, tail), name=f"service-{name}", daemon=True)
        pump.start()
        self.running[name] = _Running(process, pump, tail)
        return None

    def _wait_ready(self, name: str, service: ServiceSettings, deadline: float) -> str | None:
        """None once ``service.ready`` exits 0 (at once without a check); else why not by the deadline."""
        process = self.running[name].process
        last = "it never ran"
        while True:
            code = process.poll()
            if code is not None:
                return f"it exited with code {code} before it was ready"
            if service.ready is None:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"not ready after {service.ready_timeout_s} s (its ready check: {last})"
            last = self._check(name, service.ready, max(remaining, READY_CHECK_S))
            if not last:
                return None
            time.sleep(min(READY_POLL_S, max(deadline - time.monotonic(), 0)))

    def _check(self, name: str, ready: str, timeout_s: float) -> str:
        """Run the readiness check once: "" when it passed, else what it said."""
        argv, cwd = self.jail.confined(self.jail.command(ready, name))
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=self.jail.launch_env(name),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return "it did not finish in time"
        if done.returncode == 0:
            return ""
        said = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
        return mask(f"exit code {done.returncode}" + (f", {said[-1][:200]}" if said else ""))

    def _failed(self, name: str, problem: str) -> str:
        """Stop a service that did not come up; the problem with the last lines of its output."""
        running = self.running.get(name)
        if running is None:
            return problem
        self._stop(name)
        tail = "\n".join(f"  {line}" for line in running.tail)
        return f"{problem}; the last lines of its log:\n{tail}" if tail else f"{problem}; its log is empty"

    def _stop(self, name: str) -> None:
        running = self.running.pop(name)
        process = running.process
        if process.poll() is None:
            for pid in [process.pid, *_descendants(process.pid)]:  # the service's processes, not bwrap's
                if _command_name(pid) != "bwrap":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(self.grace_s)
        if process.returncode is None:  # not reaped yet, so its process group id is still its own
            # Its own session: the group of bwrap (whose death kills the PID namespace) or of an unsandboxed service.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        running.pump.join(self.grace_s)
        log.info("service stopped", service=name, exit_code=process.returncode)


def _open_log(home: Path, name: str) -> IO[bytes]:
    """``HOME/.services/NAME/service.log``, opened without following a link the task's commands may have put
    on the way (the home is theirs to write)."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in (SERVICES_DIR, name):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        # Without blocking: a named pipe the task's commands left there is refused (ENXIO), never waited on.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        log_fd = os.open(LOG_NAME, flags, 0o600, dir_fd=fd)
        if not stat.S_ISREG(os.fstat(log_fd).st_mode):
            os.close(log_fd)
            raise OSError(errno.EINVAL, f"{LOG_NAME} is not a regular file")
        return os.fdopen(log_fd, "ab")
    finally:
        os.close(fd)


def _pump(source: IO[bytes], sink: IO[bytes], tail: collections.deque[str]) -> None:
    """Copy a service's output to its log, masked line by line, keeping the last lines for a failure report; past
    MAX_LOG_BYTES only the last lines are kept (a chatty service does not fill the disk)."""
    kept = 0
    with source, sink:
        for raw in source:
            line = mask(raw.decode(errors="replace").rstrip("\n"))
            tail.append(line[:500])
            data = line.encode() + b"\n"
            if kept + len(data) > MAX_LOG_BYTES:
                if kept <= MAX_LOG_BYTES:  # said once
                    sink.write(b"[the rest of the output is not kept]\n")
                    sink.flush()
                    kept = MAX_LOG_BYTES + 1
                continue
            sink.write(data)
            sink.flush()
            kept += len(data)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents first (from /proc)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _command_name(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    return ""


def services_message(outcomes: list[ServiceOutcome]) -> str:
    """What the agent's first message says about its services ("" without any)."""
    if not outcomes:
        return ""
    lines = [
        "Services started for this task (stopped when it ends). Each has its own directory, where it keeps its data "
        "and makes its unix socket; reach it through that socket (it has no network port you can reach):"
    ]
    for outcome in outcomes:
        if outcome.problem is None:
            lines.append(f"- {outcome.name}: ready, in {outcome.directory}")
        else:
            lines.append(f"- {outcome.name}: NOT available, the task goes on without it: {outcome.problem}")
    return "\n".join(lines)


@contextmanager
def task_services(
    declared: Mapping[str, ServiceSettings],
    settings: SandboxSettings,
    checkout: Path,
    home: Path,
    *,
    grace_s: float = GRACE_S,
) -> Iterator[str]:
    """Run the task's services for the duration of the block; yields what the agent is told about them."""
    services = Services(declared, ServiceJail(settings, checkout, home), grace_s=grace_s)
    try:
        yield services_message(services.start())
    finally:
        services.stop()
