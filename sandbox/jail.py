"""Where the agent's commands run (issue text is untrusted: one prompt injection must not leave the task).

A :class:`Sandbox` turns ``bash -c COMMAND`` in a checkout into the command line that runs it. The registry
:data:`BACKENDS` maps ``sandbox.backend`` to an implementation:

- ``bubblewrap`` (the default): Debian's ``bwrap`` with user, PID, mount, IPC, UTS and network namespaces. The
  checkout (at ``/workspace``) and the task's home (a host directory that lasts for the task, at ``HOME``) are the
  only writable places besides the call's private ``/tmp``; the system directories, and those of the tools on the
  worker's ``PATH`` (not Tasuki's own virtualenv: ``sandbox.toolchains``), are read-only. The worker's processes,
  its ``/proc``, its files, the contexts root and other tasks' checkouts are not there. ``--die-with-parent``, and
  the sandbox's init is killed at the end of every call, so nothing the command started outlives it.
- ``none``: the command runs as the worker's user on the host (a scrubbed environment, its own process
  group). Only for trusted models, e.g. the demo's replay model; never chosen silently.

The network namespace is empty in every ``sandbox.network`` mode (the host's loopback, where the fleet's Redis and
PostgreSQL listen, is not the sandbox's). With ``full`` and ``allowlist`` its only way out is the task's egress proxy
(``sandbox.egress``, whose policy tells the two apart): :meth:`Sandbox.with_egress` binds its socket in, socat bridges
``127.0.0.1:3128`` to it, and the proxy variables point there; ``none`` has no way out at all.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from contexts.errors import TasukiError
from sandbox import bridge, confine, envfiles, layers, seccomp
from sandbox.host import HOST_ENV, program
from sandbox.settings import SandboxLimits, SandboxSettings
from sandbox.toolchains import agent_path, toolchain_binds, toolchain_environment, worker_path

log = structlog.get_logger(__name__)

BASE_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",  # a git command asking for a password would hang until the timeout
    "GIT_AUTHOR_NAME": "tasuki-bot",
    "GIT_AUTHOR_EMAIL": "tasuki-bot@users.noreply.localhost",
    "GIT_COMMITTER_NAME": "tasuki-bot",
    "GIT_COMMITTER_EMAIL": "tasuki-bot@users.noreply.localhost",
    "PYTHONDONTWRITEBYTECODE": "1",
    "NO_COLOR": "1",
}
WORKSPACE = "/workspace"  # where the checkout appears inside the sandbox
HOME = "/tmp/home"  # noqa: S108 - a private tmpfs inside the sandbox, not the host's /tmp
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# What programs read from /etc; the rest of it (shadow, the worker's configuration) stays out of sight.
ETC_FILES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "ssl",
    "pki",
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "gitconfig",
    "python3",
    "npmrc",
    "pip.conf",
)
PROBE_TIMEOUT_S = 30
EGRESS_PROXY = f"http://127.0.0.1:{bridge.PORT}"  # socat's bridge to the task's egress proxy (sandbox.bridge)
# curl and git (libcurl) read only the lowercase http_proxy; pip, npm and most others read either case.
EGRESS_ENV = {
    **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"), EGRESS_PROXY),
    "NO_PROXY": "localhost,127.0.0.1,::1",
    "no_proxy": "localhost,127.0.0.1,::1",
}
_NO_SOCAT = (
    "sandbox.network: full and allowlist need socat in the sandbox (apt install socat): it bridges the sandbox's "
    "network to the task's egress proxy; install it, or choose sandbox.network: none"
)


class SandboxUnavailable(TasukiError):
    """The configured sandbox cannot run on this machine; tasks are refused rather than run unprotected."""


class Sandbox(Protocol):
    """How one tool command is run: the command line, where, and the limits applied before it starts."""

    name: str
    user: confine.SandboxUser | None  # who its commands run as on the host when the worker is root (None: as itself)

    def command(
        self, argv: Sequence[str], checkout: Path, home: Path, env: Mapping[str, str], inherit: Sequence[str] = ()
    ) -> tuple[list[str], Path]:
        """``argv`` wrapped to run in ``checkout`` with ``home`` as its home and ``env`` as its whole environment
        (and the variables named in ``inherit``, which :meth:`launch_env` passes out of sight of ``ps``: a setup's
        secrets); and the host cwd to start in."""
        ...

    def launch_env(self, env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the wrapped line starts with on the host."""
        ...

    def home_inside(self, home: Path) -> str:
        """What ``HOME`` and ``TMPDIR`` are as the command sees them."""
        ...

    def roots(self, checkout: Path, home: Path) -> tuple[str, ...]:
        """The command's own paths, as it sees them: where an env file's ``PATH`` directory may lie."""
        ...

    def with_egress(self, socket: Path | None) -> Sandbox:
        """This sandbox for one task whose only way out is the egress proxy on ``socket`` (None: as it is)."""
        ...


class NoSandbox:
    """Runs the command on the host, in the checkout (sandbox.backend: none)."""

    name = "none"
    user: confine.SandboxUser | None = None  # as the worker itself: nothing is confined

    def command(
        self, argv: Sequence[str], checkout: Path, home: Path, env: Mapping[str, str], inherit: Sequence[str] = ()
    ) -> tuple[list[str], Path]:
        """The command as it is."""
        return list(argv), checkout

    def launch_env(self, env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
        """The command's own: it is the process started on the host."""
        return {**env, **(inherited or {})}

    def home_inside(self, home: Path) -> str:
        """The host directory itself."""
        return str(home)

    def roots(self, checkout: Path, home: Path) -> tuple[str, ...]:
        """Anywhere: a command on the host is trusted (sandbox.backend: none)."""
        return ()

    def with_egress(self, socket: Path | None) -> Sandbox:
        """Unchanged: without a sandbox there is no network namespace to confine."""
        return self


class Bubblewrap:
    """Runs the command under ``bwrap`` (sandbox.backend: bubblewrap)."""

    name = "bubblewrap"

    def __init__(self, settings: SandboxSettings, path: Sequence[str] | None = None) -> None:
        self.network = settings.network
        self.egress: Path | None = None  # the task's egress proxy socket on the host
        self.layers_writable = True  # a task's environment layers (sandbox.layers): writable, or a service's view
        self.tmpfs_bytes = settings.limits.tmpfs_bytes
        # Tasuki's own virtualenv is neither on the agent's PATH nor bound (sandbox.toolchains).
        entries = agent_path(path if path is not None else os.environ.get("PATH", "").split(os.pathsep))
        self.read_only = tool_dirs(entries) + toolchain_binds(entries)
        self.read_only += tuple(str(p) for p in settings.read_only_paths)
        self.environment = toolchain_environment(entries)
        self.bwrap = program("bwrap") or shutil.which("bwrap") or "bwrap"  # absolute: never the agent's PATH
        self.disk_bytes = settings.disk_bytes  # the cap on the task's home and layers (sandbox.confine)
        try:  # a root worker's sandboxes run as sandbox.user (sandbox.confine), never as root
            self.user = confine.sandbox_user(settings.user)
        except confine.SandboxUserMissing as exc:
            raise SandboxUnavailable(str(exc)) from None

    def command(
        self, argv: Sequence[str], checkout: Path, home: Path, env: Mapping[str, str], inherit: Sequence[str] = ()
    ) -> tuple[list[str], Path]:
        """``sh -c 'exec 3<FILTER; exec bwrap OPTIONS -- argv'`` with the checkout at /workspace: the seccomp
        filter on fd 3, the environment cleared and ``env`` set inside only (with ``inherit``: kept, not cleared)."""
        options = [self.bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        options += ["--unshare-cgroup-try"]
        # Every network mode has a namespace of its own: the task's, whose only way out is its egress proxy (joined,
        # sandbox.bridge), or an empty one.
        join = bridge.join_line(self._bridge().target()) if self.egress is not None else []
        if not join:
            options.append("--unshare-net")
        options += ["--die-with-parent", "--new-session", "--hostname", "tasuki-sandbox", "--seccomp", "3"]
        # The private /tmp first: a read-only path below /tmp (a checkout's git mirror, a tool's venv) stays seen,
        # and the task's home is bound over it at HOME (the same path in every call and every task).
        # A task whose environment was restored by layers (sandbox.layers) gets them mounted by a helper first; the
        # description is read beside the home, where the agent cannot write.
        layered = layers.layers_of(home)
        # No capability for the command, even when the worker runs as root (bwrap then keeps them all by default, and
        # the command could remount a read-only bind writable); with layers, the helper drops them (sandbox.layers).
        # /dev read-only but for its shm, both sized; /proc/sys read-only (a root worker's uid could write it).
        bare = ["--cap-drop", "ALL", "--dev", "/dev", *layers.sized(self.tmpfs_bytes), "--tmpfs", "/dev/shm"]  # noqa: S108
        bare += ["--remount-ro", "/dev"]
        options += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        options += layers.bwrap_options(layered, layers.layers_dir(home), self.tmpfs_bytes) if layered else bare
        options += [*layers.sized(self.tmpfs_bytes), "--tmpfs", "/tmp", "--bind", str(home), HOME]  # noqa: S108
        for directory in SYSTEM_DIRS:
            options += _ro_bind(directory)
        for name in ETC_FILES:
            options += _ro_bind(f"/etc/{name}")
        for directory in self.read_only:
            options += _ro_bind(directory)
        inside = {**env, **self.environment}
        if self.egress is not None:
            inside.update(EGRESS_ENV)
        if inherit and not layered:  # bwrap's own environment: the fixed one and these, which the command keeps
            options += [arg for name in HOST_ENV if name not in inside for arg in ("--unsetenv", name)]
        else:  # bwrap's own environment is the host's fixed one; the command's is set below
            options += ["--clearenv"]
        if layered:  # the helper starts with none: the agent's applies only once every capability is gone
            argv = layers.helper_argv(layered, WORKSPACE, HOME, argv, inside, writable=self.layers_writable)
        else:
            for name, value in inside.items():
                options += ["--setenv", name, value]
        options += ["--bind", str(checkout), WORKSPACE, "--remount-ro", "/", "--chdir", WORKSPACE, "--"]
        opener = [program("sh") or "/bin/sh", "-c", 'exec 3<"$0" && exec "$@"', str(seccomp.filter_file())]
        return [*opener, *join, *options, *argv], checkout

    def _bridge(self) -> bridge.Bridge:
        """The task's network namespace and its bridge to the egress proxy (started on the task's first call)."""
        assert self.egress is not None  # noqa: S101 - only asked for with a proxy
        socat = program("socat") or shutil.which("socat") or "socat"  # absolute, as bwrap's
        user = self.user
        drop = [program("setpriv") or "/usr/bin/setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
                "--clear-groups", "--"] if user is not None else []
        system = [arg for directory in SYSTEM_DIRS for arg in _ro_bind(directory)]
        try:
            return bridge.bridge(self.egress, bridge.holder_line(self.bwrap, socat, self.egress, system, drop))
        except bridge.BridgeError as exc:
            raise SandboxUnavailable(str(exc)) from None

    def launch_env(self, env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
        """The fixed environment (:data:`sandbox.host.HOST_ENV`) and ``inherited``: never the command's."""
        return {**HOST_ENV, **(inherited or {})}

    def home_inside(self, home: Path) -> str:
        """The fixed path the task's home is bound at."""
        return HOME

    def roots(self, checkout: Path, home: Path) -> tuple[str, ...]:
        """The checkout, the home, the system directories and the tools' installations the sandbox shows."""
        return (WORKSPACE, HOME, *SYSTEM_DIRS, *self.read_only)

    def with_egress(self, socket: Path | None) -> Sandbox:
        """A copy whose network namespace is empty but for a bridge to the proxy on ``socket``."""
        if socket is None:
            return self
        if shutil.which("socat") is None:  # whoever asks for a proxy (the agent's run, a setup's) learns it here
            raise SandboxUnavailable(_NO_SOCAT)
        confine.hand_over(socket.parent, self.user)  # socat runs as the sandbox's user: the proxy's socket is its
        confine.let_through([str(socket)], self.user)
        bound = copy.copy(self)
        bound.egress = socket
        return bound


def _ro_bind(path: str) -> list[str]:
    # A symlink (e.g. /bin -> usr/bin on merged-/usr systems) is recreated as one; a missing path is skipped.
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    return ["--ro-bind-try", path, path]


def tool_dirs(path_entries: Sequence[str]) -> tuple[str, ...]:
    """Read-only directories that make the worker's ``PATH`` work inside: for each entry outside the system
    directories, the installation it belongs to (``/root/.pyenv/shims`` -> ``/root/.pyenv``, a virtualenv's
    ``bin`` -> the virtualenv, and what their interpreters link to)."""
    found: list[str] = []
    for entry in path_entries:
        if not entry or not os.path.isdir(entry) or _under_system(entry):
            continue
        for candidate in (Path(entry).parent, Path(entry).resolve().parent):
            prefix = str(candidate)
            if prefix not in found and prefix != "/" and not _under_system(prefix):
                found.append(prefix)
        for tool in Path(entry).iterdir() if os.access(entry, os.R_OK) else ():
            if tool.is_symlink() and tool.name.startswith("python"):
                target = tool.resolve().parent.parent  # an interpreter's installation prefix
                if str(target) not in found and not _under_system(str(target)):
                    found.append(str(target))
    return tuple(found)


def _under_system(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


@dataclass(frozen=True)
class Backend:
    """One ``sandbox.backend`` as the rest of Tasuki knows it: how it is made and what it promises."""

    make: Callable[[SandboxSettings], Sandbox]
    confines: bool
    """Whether its commands run in namespaces of their own: a network namespace whose only way out is the task's
    egress proxy, the checkout and home at fixed paths (what environment snapshots are laid into). False: they run
    on the host, as the worker, for trusted models only."""


BACKENDS: dict[str, Backend] = {
    "bubblewrap": Backend(Bubblewrap, confines=True),
    "none": Backend(lambda _: NoSandbox(), confines=False),
}
"""``sandbox.backend``'s values: the only place a backend's name is compared (a new one is a class and a line)."""


def backend(name: str) -> Backend:
    """The registered backend ``name`` (``sandbox.backend``, or a :class:`Sandbox`'s ``name``)."""
    return BACKENDS[name]


@functools.cache
def make_sandbox(settings: SandboxSettings, read_only: Sequence[Path] = ()) -> Sandbox:
    """The configured sandbox, checked once per process; SandboxUnavailable when it cannot run here.
    ``read_only``: more paths the task's commands see read-only (its checkout's git mirror)."""
    if read_only:
        settings = settings.model_copy(update={"read_only_paths": (*settings.read_only_paths, *read_only)})
    kind = backend(settings.backend)
    sandbox = kind.make(settings)
    problem = probe(sandbox)
    if problem is not None:
        raise SandboxUnavailable(problem)
    if kind.confines and settings.network != "none" and shutil.which("socat") is None:
        raise SandboxUnavailable(_NO_SOCAT)
    return sandbox


def probe(sandbox: Sandbox) -> str | None:
    """Why ``sandbox`` cannot run a command here (None: it can)."""
    if not backend(sandbox.name).confines:
        return None
    if shutil.which("bwrap") is None:
        return (
            "bubblewrap is not installed (apt install bubblewrap), so agent commands cannot be sandboxed; "
            "install it, or set sandbox.backend: none to run them unsandboxed on purpose"
        )
    with tempfile.TemporaryDirectory(prefix="tasuki-probe-") as scratch:
        user = sandbox.user
        confine.hand_over(Path(scratch), user)
        argv, cwd = sandbox.command(["true"], Path(scratch), Path(scratch), {"PATH": "/usr/bin:/bin"})
        try:
            with confine.confined(argv, SandboxLimits(), PROBE_TIMEOUT_S, user=user) as call:
                done = subprocess.run(
                    call.argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                    check=False,
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot start ({exc}); set sandbox.backend: none to run agent commands unsandboxed"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return (
            f"bubblewrap cannot create its namespaces here ({why}; e.g. Docker's default seccomp profile "
            "blocks user namespaces); see the README's Security section, or set sandbox.backend: none"
        )
    return None


def sandbox_env(env: Mapping[str, str], sandbox: Sandbox, home: Path) -> dict[str, str]:
    """The command's environment with ``HOME`` and ``TMPDIR`` as the sandbox shows them."""
    inside = sandbox.home_inside(home)
    return {**env, "HOME": inside, "TMPDIR": inside}


def scrubbed_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A command's whole environment on the host's side: an allow-list plus ``extra``, minus secret-looking names."""
    # PATH is the one variable taken from the worker: it says where the operator installed the tools
    # (all but Tasuki's own virtualenv: the agent's python3 is never the one running Tasuki).
    env = {"PATH": os.pathsep.join(worker_path()), **BASE_ENV}
    env.update(extra or {})
    env.update({"HOME": str(home), "TMPDIR": str(home)})
    return envfiles.drop_secrets(env)


def command_env(
    home: Path, extra: Mapping[str, str] | None, sandbox: Sandbox, checkout: Path | None = None
) -> envfiles.Applied:
    """A command's environment in ``sandbox`` with the task's ``home``: scrubbed, then what the env files add
    (their ``PATH`` directories only among the sandbox's own paths); and what of the env files was refused."""
    env = sandbox_env(scrubbed_env(home, extra), sandbox, home)
    return envfiles.applied(env, home, sandbox.home_inside(home), sandbox.roots(checkout or home, home))
