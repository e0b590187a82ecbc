"""What a `tasuki` subprocess must look like: clean success, or one error line and a given exit code."""

from __future__ import annotations

import subprocess


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that succeeded without a word on stderr."""
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one ``tasuki: error:`` line of a command that failed with ``code`` (never a traceback)."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tasuki: error: ")
    return lines[0]
