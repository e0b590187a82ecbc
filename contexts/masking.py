"""Masking of secrets and personal data before anything reaches a file or a log line (SPEC §3 rule 8)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL)
# Credentials inside URLs go before e-mail addresses, so that `user:secret@host` is not read as an address.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]*:[^\s/@]+@")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# A bare token as a URL's user name (https://TOKEN@host) is masked by the token rules.  The token patterns
# start with a literal, which the regex engine searches for quickly; the word boundary before a token is
# checked in `_token` instead of with a look-behind, which would make the engine try every position.
_GITHUB = re.compile(r"g(?:ithub_pat_[A-Za-z0-9_]{16,}|h[pousr]_[A-Za-z0-9]{16,})")
_GITLAB = re.compile(r"glpat-[A-Za-z0-9_-]{16,}")
_OPENAI = re.compile(r"sk-[A-Za-z0-9_-]{16,}")


def _token(pattern: re.Pattern[str], label: str, text: str, joiners: str = "_") -> str:
    def replace(match: re.Match[str]) -> str:
        start = match.start()
        if start and (text[start - 1].isalnum() or text[start - 1] in joiners):
            return match.group(0)  # inside a longer word, e.g. `task-...`: not a token
        return label

    return pattern.sub(replace, text)


_literal_secrets: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Mask these exact strings too (secrets from the environment that match no pattern)."""
    for value in values:
        if value and len(value) >= 6:
            _literal_secrets.add(value)


def mask(text: str) -> str:
    """Return ``text`` with tokens, keys, URL credentials, PEM keys and e-mail addresses replaced.

    Every string written goes through here, so the common case (nothing to mask) costs a few
    single-character scans: each rule runs only when a character its pattern needs is present.
    """
    for secret in _literal_secrets:
        if secret in text:
            text = text.replace(secret, "[SECRET]")
    if "-" in text:
        if "-----BEGIN" in text:
            text = _PEM.sub("[PRIVATE_KEY]", text)
        text = _token(_GITLAB, "[GITLAB_TOKEN]", text)
        text = _token(_OPENAI, "[OPENAI_KEY]", text, joiners="_-")
    if "_" in text:
        text = _token(_GITHUB, "[GITHUB_TOKEN]", text)
    if "@" in text:
        text = _EMAIL.sub("[EMAIL]", _URL_CREDENTIALS.sub(r"\1[CREDENTIALS]@", text))
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
