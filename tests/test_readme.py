"""The README is part of the product: its Quick start, and the configuration reference it links to, match the code."""

from __future__ import annotations

import re
from pathlib import Path

from worker import config_reference

README = Path(__file__).resolve().parents[1] / "README.md"
CONFIGURATION = README.parent / "docs" / "configuration.md"


def test_configuration_reference_matches_the_settings_models() -> None:
    text = CONFIGURATION.read_text()
    start, end = text.index(config_reference.START), text.index(config_reference.END)
    assert text[start : end + len(config_reference.END)] == config_reference.markdown()


def test_quick_start_has_exactly_two_commands_run_demo_and_run_tests() -> None:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```\w*\n(.*?)```", section, re.DOTALL)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["./tasuki demo", "./tasuki test"]
