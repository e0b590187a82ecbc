"""tasuki.env: what `tasuki init` writes is what every command reads back, with shell quoting and no expansion;
a file others may read or change is refused with its fix (issue 41)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from worker.env_file import EnvFileError, load, load_beside, parse, read_private, render

AWKWARD = {
    "OPENAI_API_KEY": "sk-plain-0123",
    "QUOTED": "it's \"both\" quotes",
    "SPACES": "  a b  ",
    "SHELLISH": "$HOME `id` $(id) \\n # not a comment; ls",
    "LINES": "-----BEGIN KEY-----\nabc\n-----END KEY-----",
    "EMPTY": "",
}


def private(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def test_what_render_writes_parse_reads_back_as_a_shell_sourcing_it_would(tmp_path: Path) -> None:
    text = render(AWKWARD)
    assert parse(text, tmp_path / "tasuki.env") == AWKWARD
    script = f"set -a; . {private(tmp_path / 'tasuki.env', text)}; set +a; " + "; ".join(
        f'printf "%s\\0" "${name}"' for name in AWKWARD
    )
    sourced = subprocess.run(["sh", "-c", script], capture_output=True, check=True, env={}).stdout
    assert sourced.decode().split("\0")[:-1] == list(AWKWARD.values())


def test_comments_blank_lines_export_and_double_quotes_are_read_as_a_shell_would(tmp_path: Path) -> None:
    text = "# a comment\n\nexport A=1\nB=\"two words\"  # trailing comment\nC='x'\"y\"\n"
    assert parse(text, tmp_path / "f") == {"A": "1", "B": "two words", "C": "xy"}


@pytest.mark.parametrize("text", ["A=unquoted s3cr3t\n", "not-a-name=s3cr3t\n", "A='s3cr3t\n", "s3cr3t\n"])
def test_a_malformed_file_is_refused_without_showing_its_words(tmp_path: Path, text: str) -> None:
    with pytest.raises(EnvFileError) as raised:
        parse(text, tmp_path / "tasuki.env")
    assert str(raised.value).startswith(f"{tmp_path / 'tasuki.env'}: ")
    assert "s3cr3t" not in str(raised.value)
    assert "NAME='" in str(raised.value)  # the fix: how to write a line


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_file_others_may_read_or_change_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = private(tmp_path / "tasuki.env", "A='1'\n")
    path.chmod(mode)
    with pytest.raises(EnvFileError) as raised:
        read_private(path)
    assert str(raised.value) == (f"{path} may be read or changed by others (mode {mode:04o}); fix: chmod 600 {path}")


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    path = private(tmp_path / "tasuki.env", "A='1'\n")
    os.chown(path, 65534, 65534)
    with pytest.raises(EnvFileError, match=r"belongs to uid 65534, not you \(uid 0\); fix: chown 0 "):
        read_private(path)


def test_a_variable_already_set_wins_and_is_named_as_kept(tmp_path: Path) -> None:
    path = private(tmp_path / "tasuki.env", render({"A": "from-file", "B": "from-file"}))
    environ = {"A": "from-environment"}
    loaded = load(path, environ)
    assert environ == {"A": "from-environment", "B": "from-file"}
    assert (loaded.loaded, loaded.kept) == (("B",), ("A",))
    assert loaded.describe() == f"secrets {path} (B; the environment's A)"
    assert "from-" not in loaded.describe()


def test_only_the_file_beside_the_configuration_is_read(tmp_path: Path) -> None:
    private(tmp_path / "tasuki.env", "A='1'\n")
    (tmp_path / "cfg").mkdir()
    environ: dict[str, str] = {}
    assert load_beside(tmp_path / "cfg" / "config.yaml", environ) is None
    assert load_beside(None, environ) is None
    assert environ == {}
    assert load_beside(tmp_path / "config.yaml", environ) is not None
    assert environ == {"A": "1"}
