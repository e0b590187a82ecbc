"""How a person on this machine signs in to the console that ``up``, ``demo`` and ``console`` serve: the
configured token (``console.token``, else ``TASUKI_API_TOKEN``), or else one made once and kept in
``{local.var_dir}/console-token`` (0600), so that the console works out of the box and the token never goes to
the terminal or a log."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from pydantic import SecretStr

from contexts.atomic import write_bytes_atomic
from worker.settings_models import Settings

TOKEN_FILE = "console-token"  # noqa: S105 - the name of the file, not a token


@dataclass(frozen=True)
class ConsoleAccess:
    """Settings whose console has a token, the environment that hands it to a child, and where to find it."""

    settings: Settings
    env: dict[str, str]
    hint: str


def console_access(settings: Settings) -> ConsoleAccess:
    """The configured token when there is one, else the one kept under ``local.var_dir`` (made on first use)."""
    if settings.console_token() is not None:
        return ConsoleAccess(settings, {}, "sign in with the console token (console.token, else TASUKI_API_TOKEN)")
    path = settings.local.var_dir / TOKEN_FILE
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_bytes_atomic(path, secrets.token_urlsafe(24).encode())
    token = path.read_text().strip()
    console = settings.console.model_copy(update={"token": SecretStr(token)})
    return ConsoleAccess(settings.model_copy(update={"console": console}), {"TASUKI__CONSOLE__TOKEN": token},
                         f"sign in with the token in {path}")
