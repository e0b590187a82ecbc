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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

ENV_FILE = ".tasuki/env"
PATH_FILE = ".tasuki/path"
MAX_FILE_BYTES = 1024 * 1024  # read at most this much of either file: a runaway append must not stall every call
# Names that look like credentials never reach the agent's shell, even when a caller or an env file names them.
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by the sandbox itself; an env file cannot move the home, nor the env files.
_RESERVED = frozenset({"HOME", "TMPDIR", "TASUKI_ENV", "TASUKI_PATH", "GITHUB_ENV", "GITHUB_PATH"})


@dataclass(frozen=True)
class EnvFiles:
    """What the two files say: variables in order, directories in ``PATH`` order, and the lines skipped."""

    variables: dict[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def prepare(home: Path) -> None:
    """Make ``HOME/.tasuki`` and the two files (empty) when they are missing: ``>> $TASUKI_ENV`` just works."""
    directory = home / ENV_FILE.split("/", 1)[0]
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in (ENV_FILE, PATH_FILE):
        (home / name).touch(mode=0o600, exist_ok=True)


def locations(home_inside: str) -> dict[str, str]:
    """``TASUKI_ENV`` and ``TASUKI_PATH`` as a command sees them (its home is ``home_inside``)."""
    return {"TASUKI_ENV": f"{home_inside}/{ENV_FILE}", "TASUKI_PATH": f"{home_inside}/{PATH_FILE}"}


def read(home: Path) -> EnvFiles:
    """Both files of ``home`` parsed; missing files are empty."""
    variables, skipped = parse_env(_text(home / ENV_FILE))
    path, path_skipped = parse_path(_text(home / PATH_FILE))
    return EnvFiles(variables, path, skipped + path_skipped)


def _text(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return ""
    except OSError as exc:
        log.warning("env file not read", file=path.name, error=str(exc)[:200])
        return ""
    if len(data) > MAX_FILE_BYTES:
        log.warning(
            "env file larger than its limit: only its beginning is read", file=path.name, limit_bytes=MAX_FILE_BYTES
        )
        data = data[:MAX_FILE_BYTES].rsplit(b"\n", 1)[0]
    return data.decode("utf-8", errors="replace")


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


def applied(env: Mapping[str, str], home: Path, home_inside: str) -> dict[str, str]:
    """``env`` with what the env files of ``home`` add (secret-looking names dropped), ``PATH`` extended, and
    ``TASUKI_ENV``/``TASUKI_PATH`` naming the files as the command sees them."""
    files = read(home)
    for reason in files.skipped:
        log.warning("env file line skipped", reason=reason)
    result = {**env, **drop_secrets(files.variables), **locations(home_inside)}
    if files.path:
        result["PATH"] = ":".join((*files.path, *([result["PATH"]] if result.get("PATH") else [])))
    return result
