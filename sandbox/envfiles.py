"""The env files (SPEC §17): what a setup or the agent adds to every later command's environment.

``$TASUKI_ENV`` (``HOME/.tasuki/env``) holds ``KEY=VALUE`` lines, and GitHub's multi-line form::

    NAME<<DELIM
    first line
    second line
    DELIM

``$TASUKI_PATH`` (``HOME/.tasuki/path``) holds one absolute directory per line, prepended to ``PATH`` (the
last line first, as GitHub's ``$GITHUB_PATH``). Both are read before every command; a line that cannot be
read (torn by a killed command, not a name, a NUL byte) is skipped with a warning, never an error. Names that
look like credentials are dropped here as from the worker's own environment: a secret a setup wrote there
would otherwise reach every command of the agent.

The files are the agent's: the worker reads and makes them as data only (issue 36). Each is opened beneath the
home without following a link, as a regular file only and without blocking (a named pipe in their place is
refused, never waited on); the dynamic loader's variables are refused, and so is a ``PATH`` directory outside the
sandbox's own paths; each refusal is a line the command's output shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from sandbox import homefiles

log = structlog.get_logger(__name__)

ENV_FILE = ".tasuki/env"
PATH_FILE = ".tasuki/path"
MAX_FILE_BYTES = 1024 * 1024  # read at most this much of either file: a runaway append must not stall every call
# Names that look like credentials never reach the agent's shell, even when a caller or an env file names them.
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by the sandbox itself; an env file cannot move the home, nor the env files.
_RESERVED = frozenset({"HOME", "TMPDIR", "TASUKI_ENV", "TASUKI_PATH", "GITHUB_ENV", "GITHUB_PATH"})
# What glibc drops from a setuid program's environment (its UNSECURE_ENVVARS): variables that make the dynamic loader
# or libc load code or data from a path; an env file may set none of them.
LOADER_NAMES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    }
)


@dataclass(frozen=True)
class EnvFiles:
    """What the two files say: variables in order, directories in ``PATH`` order, and the lines skipped."""

    variables: dict[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def prepare(home: Path) -> None:
    """Make ``HOME/.tasuki`` and the two files (empty) when they are missing: ``>> $TASUKI_ENV`` just works.
    Whatever the agent left in their place that is not a directory or a regular file (a symlink, a pipe) is
    removed first, never followed (:mod:`sandbox.homefiles`)."""
    homefiles.ensure(home, (ENV_FILE, PATH_FILE))


def locations(home_inside: str) -> dict[str, str]:
    """``TASUKI_ENV`` and ``TASUKI_PATH`` as a command sees them (its home is ``home_inside``)."""
    return {"TASUKI_ENV": f"{home_inside}/{ENV_FILE}", "TASUKI_PATH": f"{home_inside}/{PATH_FILE}"}


def read(home: Path) -> EnvFiles:
    """Both files of ``home`` parsed; missing files are empty, and what is not a regular file is skipped."""
    env_text, env_problem = _text(home, ENV_FILE)
    path_text, path_problem = _text(home, PATH_FILE)
    variables, skipped = parse_env(env_text)
    path, path_skipped = parse_path(path_text)
    problems = tuple(problem for problem in (env_problem, path_problem) if problem)
    return EnvFiles(variables, path, problems + skipped + path_skipped)


def _text(home: Path, name: str) -> tuple[str, str | None]:
    """The beginning of the file ``name`` beneath ``home`` (:func:`sandbox.homefiles.read`); and why it was not
    read, when it is there but could not be."""
    try:
        data = homefiles.read(home, name, MAX_FILE_BYTES)
    except homefiles.Unreadable as exc:
        log.warning("env file not read", file=name, error=str(exc.strerror)[:200])
        return "", exc.strerror
    if data is None:
        return "", None
    if len(data) > MAX_FILE_BYTES:
        log.warning("env file larger than its limit: only its beginning is read", file=name, limit_bytes=MAX_FILE_BYTES)
        data = data[:MAX_FILE_BYTES].rsplit(b"\n", 1)[0]
    return data.decode("utf-8", errors="replace"), None


def parse_env(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """``KEY=VALUE`` and ``NAME<<DELIM`` blocks; returns the variables (a later line wins) and why lines were
    skipped (each reason names its line number)."""
    variables: dict[str, str] = {}
    skipped: list[str] = []
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        line = lines[number].removesuffix("\r")
        number += 1
        if not line.strip():
            continue
        name, heredoc, rest = _split(line)
        if heredoc:
            end = next((i for i in range(number, len(lines)) if lines[i].removesuffix("\r") == rest), None)
            if end is None or not rest:
                skipped.append(f"env line {number}: {name}<<{rest} has no closing {rest or 'delimiter'} line")
                break  # the rest is the unfinished block (a torn write): nothing after it can be told apart
            value = "\n".join(part.removesuffix("\r") for part in lines[number:end])
            number = end + 1
        elif rest is None:
            skipped.append(f"env line {number}: not NAME=VALUE")
            continue
        else:
            value = rest
        problem = _problem(name, value)
        if problem:
            skipped.append(f"env line {number}: {problem}")
            continue
        variables[name] = value
    return variables, tuple(skipped)


def _split(line: str) -> tuple[str, bool, str | None]:
    """(name, is a ``<<`` block, value or delimiter); ``None`` when the line has neither form."""
    equals, heredoc = line.find("="), line.find("<<")
    if heredoc != -1 and (equals == -1 or heredoc < equals):
        return line[:heredoc], True, line[heredoc + 2 :]
    if equals == -1:
        return line, False, None
    return line[:equals], False, line[equals + 1 :]


def _problem(name: str, value: str) -> str | None:
    if not _NAME.fullmatch(name):
        return f"{name[:40]!r} is not a variable name"
    if "\x00" in value:
        return f"{name} holds a NUL byte"
    if name in _RESERVED:
        return f"{name} is set by the sandbox"
    if name.startswith("LD_") or name in LOADER_NAMES:
        return f"{name} is a variable of the dynamic loader: refused"
    return None


def parse_path(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The directories in ``PATH`` order (the last line first) and why lines were skipped."""
    directories: list[str] = []
    skipped: list[str] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("/") or ":" in line or "\x00" in line:
            skipped.append(f"path line {number}: {line[:60]!r} is not an absolute directory")
            continue
        if line in directories:
            directories.remove(line)
        directories.append(line)
    return tuple(reversed(directories)), tuple(skipped)


def drop_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without names that look like credentials (each dropped one is logged, never its value)."""
    kept = {}
    for name, value in env.items():
        if SECRET_NAME.search(name):
            log.warning("tool_env_secret_dropped", variable=name)
            continue
        kept[name] = value
    return kept


@dataclass(frozen=True)
class Applied:
    """A command's environment with the env files applied, and what of them was refused (a line each)."""

    env: dict[str, str]
    refused: tuple[str, ...] = ()


def applied(env: Mapping[str, str], home: Path, home_inside: str, roots: Sequence[str] = ()) -> Applied:
    """``env`` with what the env files of ``home`` add (secret-looking names dropped), ``PATH`` extended by their
    directories that lie under one of ``roots`` (the sandbox's own paths; empty: any), and ``TASUKI_ENV`` /
    ``TASUKI_PATH`` naming the files as the command sees them."""
    files = read(home)
    refused = list(files.skipped)
    path = tuple(directory for directory in files.path if not roots or _under(directory, roots))
    refused += [f"path: {d[:80]!r} is outside the sandbox's own paths: refused" for d in files.path if d not in path]
    for reason in refused:
        log.warning("env file line skipped", reason=reason)
    result = {**env, **drop_secrets(files.variables), **locations(home_inside)}
    if path:
        result["PATH"] = ":".join((*path, *([result["PATH"]] if result.get("PATH") else [])))
    return Applied(result, tuple(refused))


def _under(directory: str, roots: Sequence[str]) -> bool:
    normal = os.path.normpath(directory)
    return any(normal == root or normal.startswith(root.rstrip("/") + "/") for root in roots)
