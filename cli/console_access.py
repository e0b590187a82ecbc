"""How a person on this machine signs in to the console that ``up``, ``demo`` and ``console`` serve.

Through the OpenID Connect provider when ``auth.oidc`` is configured. Otherwise, on a console bound to this machine
only (a loopback address), the local mode: break-glass with the configured token (``console.token``, else
``TASUKI_API_TOKEN``), or one made once and kept in ``{local.var_dir}/console-token`` (0600) — so the demo's
console works out of the box, the token never goes to the terminal or a log, and every page says it is the shared
token. A console reachable from elsewhere gets no shared token unless ``auth.break_glass`` says so."""

from __future__ import annotations

import ipaddress
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


def loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def console_access(settings: Settings, host: str | None = None) -> ConsoleAccess:
    """How the console bound to ``host`` (default ``console.host``) is signed in to; see the module's docstring."""
    oidc = settings.auth.oidc
    if oidc.configured and not settings.auth.break_glass:
        return ConsoleAccess(settings, {}, f"sign in through {oidc.issuer}")
    if not settings.auth.break_glass and not loopback(host or settings.console.host):
        return ConsoleAccess(settings, {}, "no sign-in: configure auth.oidc (docs/console-auth.md), or "
                                           "auth.break_glass: true with console.token")
    auth = settings.auth.model_copy(update={"break_glass": True})
    settings = settings.model_copy(update={"auth": auth})
    env = {"TASUKI__AUTH__BREAK_GLASS": "true"}
    if settings.console_token() is not None:
        return ConsoleAccess(settings, env, "sign in with the console token (console.token, else TASUKI_API_TOKEN)")
    path = settings.local.var_dir / TOKEN_FILE
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_bytes_atomic(path, secrets.token_urlsafe(24).encode())
    token = path.read_text().strip()
    console = settings.console.model_copy(update={"token": SecretStr(token)})
    return ConsoleAccess(settings.model_copy(update={"console": console}), {**env, "TASUKI__CONSOLE__TOKEN": token},
                         f"sign in with the token in {path}")
