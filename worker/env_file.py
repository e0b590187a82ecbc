"""``tasuki.env``: the secrets `tasuki init` writes beside ``config.yaml``, and how a ``tasuki`` command reads them.

The writer (:func:`render`) and the reader (:func:`parse`) of the format live here together: ``NAME='value'`` lines
that a shell can source, read with shell quoting rules (:mod:`shlex`) and no expansion. The command line loads the
file beside its configuration at start (:func:`load_beside`), so nobody has to source it; a variable already set in
the environment wins over the file, as docker compose treats ``.env``.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import NamedTuple

from contexts.errors import TasukiError
from contexts.masking import register_secrets

ENV_FILE = "tasuki.env"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvFileError(TasukiError):
    """The secrets file cannot be used: others may read or change it, or it is not ``NAME=VALUE`` lines."""


class LoadedEnvFile(NamedTuple):
    """Which secrets file a command read: the names it set, and those the environment already held (kept)."""

    path: Path
    loaded: tuple[str, ...]
    kept: tuple[str, ...]

    def describe(self) -> str:
        """Names only, never a value."""
        names = ", ".join(self.loaded) or "nothing new"
        kept = f"; the environment's {', '.join(self.kept)}" if self.kept else ""
        return f"secrets {self.path} ({names}{kept})"


def render(values: Mapping[str, str]) -> str:
    """The file's text: one single-quoted ``NAME='value'`` line per secret."""
    lines = ["# Secrets of Tasuki (`tasuki init`). Every tasuki command whose config.yaml is beside this file reads",
             f"# it (a variable already set in the environment wins). Other programs: set -a; . ./{ENV_FILE}; set +a"]
    lines += [f"{name}='" + value.replace("'", "'\\''") + "'" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def parse(text: str, path: Path) -> dict[str, str]:
    """``NAME=VALUE`` words as a shell reads them (quotes, ``#`` comments, an optional ``export``), unexpanded."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:  # an unclosed quote
        raise EnvFileError(f"{path}: {exc}; write each secret as NAME='value'") from None
    values: dict[str, str] = {}
    for word in words:
        name, equals, value = word.partition("=")
        if word == "export":
            continue
        if not equals or not _NAME.fullmatch(name):  # the word itself may be part of a secret: never shown
            raise EnvFileError(f"{path}: a word that is not NAME=VALUE; quote values with spaces: NAME='a b'")
        values[name] = value
    return values


def read_private(path: Path) -> dict[str, str]:
    """The secrets in ``path``, refused unless it is a regular file of this user that no one else may read or
    change (checked on the open file: what is read is what was checked)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:  # a FIFO must not block us
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise EnvFileError(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise EnvFileError(f"{path} belongs to uid {info.st_uid}, not you (uid {os.getuid()}); "
                               f"fix: chown {os.getuid()} {path}; chmod 600 {path}")
        if info.st_mode & 0o077:
            raise EnvFileError(f"{path} may be read or changed by others (mode {stat.S_IMODE(info.st_mode):04o}); "
                               f"fix: chmod 600 {path}")
        raw = handle.read()
    try:
        return parse(raw.decode("utf-8"), path)
    except UnicodeDecodeError:
        raise EnvFileError(f"{path} is not UTF-8 text") from None


def load(path: Path, environ: MutableMapping[str, str]) -> LoadedEnvFile:
    """Set in ``environ`` each secret of ``path`` it does not already hold; every value is masked in logs."""
    values = read_private(path)
    register_secrets(values.values())
    loaded = tuple(name for name in values if name not in environ)
    environ.update({name: values[name] for name in loaded})
    return LoadedEnvFile(path, loaded, tuple(name for name in values if name not in loaded))


def load_beside(config_file: Path | None, environ: MutableMapping[str, str]) -> LoadedEnvFile | None:
    """Load the ``tasuki.env`` beside ``config_file`` into ``environ``, if there is one."""
    if config_file is None:
        return None
    path = config_file.parent / ENV_FILE
    if not path.exists() and not path.is_symlink():
        return None
    return load(path, environ)
