"""The toolchains the agent's commands use (SPEC §17 "Toolchains"): which of the worker's are on the agent's
``PATH``, what the sandbox must show for them to run, and a probe that says at worker start which cannot.

- Tasuki's own virtualenv is never the agent's: its ``bin`` leaves the agent's ``PATH`` and is not bound, so the
  agent's ``python3`` is the interpreter the operator installed, without Celery and the rest of Tasuki's
  dependencies (:func:`agent_path`).
- A toolchain that reads configuration outside its installation gets it bound read-only: a Debian JDK's
  ``/etc/java-17-openjdk``, Maven's ``/etc/maven`` (the ``/etc`` directories their installations link into),
  and rustup's home, which its proxies (``cargo``, ``rustc``) find through ``RUSTUP_HOME``
  (:func:`toolchain_binds`, :func:`toolchain_environment`).
- :func:`probe_toolchains` runs one tiny command per toolchain found on ``PATH`` inside the sandbox and names
  each that fails, with its error and the fix.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox import confine
from sandbox.host import HOST_ENV

if TYPE_CHECKING:  # jail imports this module for its binds
    from sandbox.jail import Sandbox
    from sandbox.settings import SandboxLimits

PROBE_TIMEOUT_S = 60
# Installations whose links into /etc are looked for no deeper than this (a JDK's conf/security/java.security).
_LINK_DEPTH = 3
# Prefixes too broad to scan for links: a program resolved here is a system package's, seen already.
_BROAD = frozenset({"/", "/usr", "/usr/local", "/bin", "/opt"})
_BIND_ETC = "bind it read-only: add {path} to sandbox.read_only_paths"


@dataclass(frozen=True)
class Toolchain:
    """A toolchain the agent may find on PATH, and the tiny command that proves it runs."""

    name: str
    argv: tuple[str, ...]
    fix: str  # what the operator does when it fails in the sandbox


TOOLCHAINS: tuple[Toolchain, ...] = (
    Toolchain("python", ("python3", "-c", "1"), "add the interpreter's installation to sandbox.read_only_paths"),
    Toolchain("node", ("node", "-e", "0"), "add node's installation to sandbox.read_only_paths"),
    Toolchain("go", ("go", "version"), "add GOROOT to sandbox.read_only_paths"),
    Toolchain(
        "cargo",
        ("cargo", "--version"),
        "rustup's proxies need its home: set RUSTUP_HOME in the worker's environment (default ~/.rustup) "
        "or put the toolchain's own bin directory on PATH",
    ),
    Toolchain(
        "rustc",
        ("rustc", "--version"),
        "rustup's proxies need its home: set RUSTUP_HOME in the worker's environment (default ~/.rustup) "
        "or put the toolchain's own bin directory on PATH",
    ),
    Toolchain(
        "java",
        ("javac", "-version"),
        "a JDK reads its configuration from /etc/java-*: add that directory to sandbox.read_only_paths",
    ),
    Toolchain("maven", ("mvn", "--version"), "Maven reads /etc/maven: add it to sandbox.read_only_paths"),
    Toolchain("gcc", ("gcc", "--version"), "add the compiler's installation to sandbox.read_only_paths"),
    Toolchain("make", ("make", "--version"), "add make's installation to sandbox.read_only_paths"),
)


@dataclass(frozen=True)
class ToolchainProblem:
    """A toolchain on PATH that failed its probe inside the sandbox."""

    toolchain: str
    error: str
    fix: str

    def __str__(self) -> str:
        return f"{self.toolchain} cannot run in the sandbox ({self.error}); fix: {self.fix}"


def own_prefixes() -> frozenset[Path]:
    """Tasuki's own virtualenv: ``sys.prefix`` when it is one, and the one ``sys.executable`` belongs to."""
    found: set[Path] = set()
    if sys.prefix != sys.base_prefix:
        found.add(Path(sys.prefix).resolve())
    venv = Path(sys.executable).parent.parent  # not resolved: a virtualenv's python links to its base
    if (venv / "pyvenv.cfg").is_file():
        found.add(venv.resolve())
    return frozenset(found)


def agent_path(entries: Sequence[str], own: frozenset[Path] | None = None) -> list[str]:
    """The worker's ``PATH`` entries without those inside Tasuki's own virtualenv (``own``, default
    :func:`own_prefixes`); the base interpreter it was made from stays, where it is on ``PATH`` by itself."""
    mine = own_prefixes() if own is None else own
    kept: list[str] = []
    for entry in entries:
        if entry and entry not in kept and not _inside(Path(entry), mine):
            kept.append(entry)
    return kept


def _inside(entry: Path, prefixes: frozenset[Path]) -> bool:
    for candidate in {entry.absolute(), entry.resolve()}:
        if any(candidate == prefix or prefix in candidate.parents for prefix in prefixes):
            return True
    return False


def worker_path() -> list[str]:
    """The worker's ``PATH`` as the agent gets it."""
    return list(_agent_path_of(os.environ.get("PATH", os.defpath)))


@functools.lru_cache(maxsize=8)
def _agent_path_of(path: str) -> tuple[str, ...]:
    # Resolving every entry took 2 ms a tool call; the worker's PATH does not change while it runs.
    return tuple(agent_path(path.split(os.pathsep)))


def toolchain_binds(path: Sequence[str], home: Path | None = None) -> tuple[str, ...]:
    """More directories to bind read-only for the toolchains on ``path``: the ``/etc`` directories their
    installations link into (outside the sandbox's short list of /etc files), and rustup's home."""
    found: list[str] = []
    for toolchain in TOOLCHAINS:
        program = shutil.which(toolchain.argv[0], path=os.pathsep.join(path))
        if program is None:
            continue
        for directory in _etc_links(Path(program).resolve().parent.parent):
            if directory not in found:
                found.append(directory)
    rustup = rustup_home(path, home)
    if rustup is not None:
        found.append(str(rustup))
    return tuple(found)


def toolchain_environment(path: Sequence[str], home: Path | None = None) -> dict[str, str]:
    """Variables the toolchains on ``path`` need inside the sandbox, whose home is not the worker's."""
    found: dict[str, str] = {}
    rustup = rustup_home(path, home)
    if rustup is not None:
        found["RUSTUP_HOME"] = str(rustup)
    if shutil.which("go", path=os.pathsep.join(path)) is not None:
        # go.mod's "toolchain" line must not make go fetch and run another compiler: the repository's go is the
        # worker's, and a module that asks for a newer one says so ("go.mod requires go >= 1.24 (running go 1.23.5;
        # GOTOOLCHAIN=local)") instead of downloading one
        found["GOTOOLCHAIN"] = "local"
    return found


def rustup_home(path: Sequence[str], home: Path | None = None) -> Path | None:
    """Where rustup keeps its toolchains, when ``cargo`` or ``rustc`` on ``path`` is one of its proxies."""
    for name in ("cargo", "rustc"):
        program = shutil.which(name, path=os.pathsep.join(path))
        if program is not None and (Path(program).parent / "rustup").exists():
            configured = os.environ.get("RUSTUP_HOME")
            rustup = Path(configured) if configured else (home or Path.home()) / ".rustup"
            return rustup.resolve() if rustup.is_dir() else None
    return None


def _etc_links(installation: Path) -> list[str]:
    """``/etc/NAME`` for each link below ``installation`` (a few levels deep) that points into /etc."""
    if str(installation) in _BROAD or not installation.is_dir():
        return []
    found: list[str] = []
    base_depth = len(installation.parts)
    for root, dirs, files in os.walk(installation):
        if len(Path(root).parts) - base_depth >= _LINK_DEPTH:
            dirs.clear()
        for name in (*dirs, *files):
            link = Path(root, name)
            if not link.is_symlink():
                continue
            target = Path(root, os.readlink(link))
            parts = Path(os.path.normpath(target)).parts
            if len(parts) > 2 and parts[1] == "etc":  # ("/", "etc", NAME, ...)
                directory = f"/etc/{parts[2]}"
                if directory not in found and os.path.isdir(directory):
                    found.append(directory)
    return found


def found_toolchains(path: Sequence[str], toolchains: Sequence[Toolchain] = TOOLCHAINS) -> list[str]:
    """The names of ``toolchains`` whose program is on ``path``."""
    joined = os.pathsep.join(path)
    return [toolchain.name for toolchain in toolchains if shutil.which(toolchain.argv[0], path=joined)]


def probe_toolchains(
    sandbox: Sandbox,
    path: Sequence[str],
    limits: SandboxLimits | None = None,
    toolchains: Sequence[Toolchain] = TOOLCHAINS,
) -> list[ToolchainProblem]:
    """Each toolchain on ``path`` whose tiny command fails inside ``sandbox`` (under the tool calls' ``limits``):
    its name, error and fix."""
    user = sandbox.user
    problems: list[ToolchainProblem] = []
    joined = os.pathsep.join(path)
    for toolchain in toolchains:
        if shutil.which(toolchain.argv[0], path=joined) is None:
            continue
        with tempfile.TemporaryDirectory(prefix="tasuki-toolchain-") as scratch:
            home = Path(scratch, "home")
            checkout = Path(scratch, "checkout")
            home.mkdir()
            checkout.mkdir()
            inside = sandbox.home_inside(home)
            env = {"PATH": joined, "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8"}
            confine.hand_over(Path(scratch), user)
            argv, cwd = sandbox.command(list(toolchain.argv), checkout, home, env)
            with confine.confined(argv, limits, PROBE_TIMEOUT_S, user=user) as call:
                error = _failure(call.argv, cwd)
        if error is not None:
            problems.append(ToolchainProblem(toolchain.name, error, _fix(toolchain, error)))
    return problems


def _failure(argv: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=HOST_ENV, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {PROBE_TIMEOUT_S} s"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    if not lines:
        return f"exit {done.returncode}, no output"
    first = next((n for n, line in enumerate(lines) if "error" in line.lower()), len(lines) - 1)
    # The error, and the line after it when that says what it was (not a stack frame).
    said = [line for n, line in enumerate(lines[first : first + 2]) if n == 0 or not line.startswith("at ")]
    return f"exit {done.returncode}: {': '.join(said)}"


def _fix(toolchain: Toolchain, error: str) -> str:
    """The toolchain's fix, naming the /etc directories of this host where it has them."""
    if "Could not reserve enough space" in error:  # a JVM sizes its heap and code cache by the host, not RLIMIT_AS
        return (
            "its process needs more address space than sandbox.limits.memory_bytes: raise it (null: no limit), "
            "or cap the JVM's heap (JAVA_TOOL_OPTIONS=-Xmx1g in the repository's environment)"
        )
    if toolchain.name == "java":
        configs = sorted(str(p) for p in Path("/etc").glob("java-*") if p.is_dir())
        if configs:
            return _BIND_ETC.format(path=" and ".join(configs))
    if toolchain.name == "maven" and os.path.isdir("/etc/maven"):
        return _BIND_ETC.format(path="/etc/maven")
    return toolchain.fix
