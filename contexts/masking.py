"""Masking of secrets and personal data before anything reaches a file or a log line (SPEC §3 rule 8)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
        ),
        "[PRIVATE_KEY]",
    ),
    # Credentials inside URLs go first so that the e-mail rule does not eat `user:secret@host`.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]*:[^\s/@]+@"), r"\1[CREDENTIALS]@"),
    # A bare token as the URL's user name (https://TOKEN@host) is masked by the token rules below.
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{16,}"), "[GITHUB_TOKEN]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), "[GITHUB_TOKEN]"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}"), "[GITLAB_TOKEN]"),
    (re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{16,}"), "[OPENAI_KEY]"),
    (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), "[EMAIL]"),
)
# Cheap substring checks let the common case (nothing to mask) skip every regular expression.
_TRIGGERS = ("-----BEGIN", "://", "github_pat_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "glpat-", "sk-", "@")

_literal_secrets: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Mask these exact strings too (secrets from the environment that match no pattern)."""
    for value in values:
        if value and len(value) >= 6:
            _literal_secrets.add(value)


def mask(text: str) -> str:
    """Return ``text`` with tokens, keys, URL credentials, PEM keys and e-mail addresses replaced."""
    for secret in _literal_secrets:
        if secret in text:
            text = text.replace(secret, "[SECRET]")
    if not any(trigger in text for trigger in _TRIGGERS):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def mask_value(value: object) -> object:
    """Mask every string inside ``value`` (dicts, lists and tuples are walked; other values pass through)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {mask(k) if isinstance(k, str) else k: mask_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_value(v) for v in value]
    return value
