"""Token estimates: UTF-8 bytes / 4, corrected by what the provider reports (SPEC §6)."""

from __future__ import annotations

import json
from typing import Any

MIN_CALIBRATION = 0.25
MAX_CALIBRATION = 4.0
_SMOOTHING = 0.5


def estimate_tokens(text: str | None) -> int:
    """Estimated tokens of ``text``: UTF-8 bytes / 4, rounded up (chars / 4 on ASCII)."""
    if not text:
        return 0
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return (size + 3) // 4


def estimate_message_tokens(content: str | None, tool_calls: list[Any] | None = None) -> int:
    """Estimated tokens of one message: its content plus its tool calls as JSON."""
    tokens = estimate_tokens(content)
    if tool_calls:
        tokens += estimate_tokens(json.dumps(tool_calls, ensure_ascii=False))
    return tokens + 4  # role and framing, as providers count them


def calibrate(current: float, estimated: int, reported: int) -> float:
    """New estimate multiplier after a provider reported ``reported`` prompt tokens for ``estimated``."""
    if estimated <= 0 or reported <= 0:
        return current
    observed = min(max(reported / estimated, MIN_CALIBRATION), MAX_CALIBRATION)
    return round(current * (1 - _SMOOTHING) + observed * _SMOOTHING, 4)
