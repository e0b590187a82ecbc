"""How ``tasuki up``, ``demo`` and ``console`` let a person on this machine in (issue 40): the local token as
break-glass only on a loopback address, nothing shared once a provider is configured or the console is reachable
from elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cli.console_access import console_access
from worker.settings_models import Settings


def test_a_loopback_console_without_a_provider_gets_the_local_token_as_break_glass(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings({"TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var")})
    access = console_access(settings, "127.0.0.1")
    token = (tmp_path / "var" / "console-token").read_text().strip()
    assert access.env == {"TASUKI__AUTH__BREAK_GLASS": "true", "TASUKI__CONSOLE__TOKEN": token}
    assert (access.settings.auth.break_glass, access.settings.console_token()) == (True, token)
    assert (tmp_path / "var" / "console-token").stat().st_mode & 0o777 == 0o600
    assert console_access(settings, "::1").env["TASUKI__CONSOLE__TOKEN"] == token  # made once, kept


def test_a_console_reachable_from_elsewhere_or_behind_a_provider_gets_no_shared_token(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings({"TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var"), "TASUKI__CONSOLE__TOKEN": "t0k"})
    wide = console_access(settings, "0.0.0.0")
    assert (wide.env, wide.settings.auth.break_glass) == ({}, False)
    assert "configure auth.oidc" in wide.hint
    provider = make_settings({"TASUKI__LOCAL__VAR_DIR": str(tmp_path / "var"),
                              "TASUKI__AUTH__OIDC__ISSUER": "https://id.example.com",
                              "TASUKI__AUTH__OIDC__CLIENT_ID": "tasuki"})
    through = console_access(provider, "127.0.0.1")
    assert (through.env, through.settings.auth.break_glass) == ({}, False)
    assert through.hint == "sign in through https://id.example.com"
    assert not (tmp_path / "var" / "console-token").exists()
    chosen = console_access(settings.model_copy(update={"auth": settings.auth.model_copy(
        update={"break_glass": True})}), "0.0.0.0")
    assert (chosen.settings.console_token(), chosen.env["TASUKI__AUTH__BREAK_GLASS"]) == ("t0k", "true")
