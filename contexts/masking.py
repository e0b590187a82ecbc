"""Masking of secrets and personal data before anything reaches a file or a log line (SPEC §3 rule 8)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# PEM (`-----BEGIN RSA PRIVATE KEY-----`) and PGP (`-----BEGIN PGP PRIVATE KEY BLOCK-----`) blocks; a block
# cut off before its END line is masked to the end of the text.  `( BLOCK|)` always takes part in the match,
# so that `\2` also matches the empty string for PEM.
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY( BLOCK|)-----.*?(?:-----END \1PRIVATE KEY\2-----|\Z)", re.DOTALL
)
# A bare token as a URL's user name (https://TOKEN@host) is masked by the token rules.  The token patterns
# start with a literal, which the regex engine searches for quickly (an alternation of literals at the start
# would make it try every position); whether a match stands on its own or sits inside a longer word is
# decided by `_inside_word` afterwards, for the same reason.  An `_` may arrive URL-encoded (`%5F`).
_U = r"(?:_|%5[Ff])"
_GIT_TOKEN = re.compile(
    rf"g(?:h[pousr]{_U}[A-Za-z0-9]{{16,}}"
    rf"|ithub{_U}pat{_U}(?:[A-Za-z0-9_]|%5[Ff]){{16,}}"
    # GitLab's prefixed tokens; a routable one (glpat-<payload>.01.<crc>) ends in two dotted parts.
    r"|l(?:pat|dt|rtr?|ptt|cbt|soat|oas|imt|agent|ft|ffct|wt)-(?:[A-Za-z0-9_-]|%5[Ff]){16,}(?:\.\d+\.[A-Za-z0-9]+)?)"
)
_GITLAB_RUNNER_REGISTRATION = re.compile(r"GR1348941(?:[A-Za-z0-9_-]|%5[Ff]){16,}")
_OPENAI = re.compile(r"sk-(?:[A-Za-z0-9_-]|%5[Ff]){16,}")
# Tasuki's own personal API tokens (contexts/api_tokens.py): ``tsk_`` and 32 random bytes, URL-safe (43 characters).
_TASUKI_TOKEN = re.compile(rf"tsk{_U}(?:[A-Za-z0-9_-]|%5[Ff]){{40,}}")
# `Authorization: Basic ...`, `"authorization": "Bearer ..."`, `-H 'Authorization: token ...'`, JSON-escaped
# quotes and query strings (`?authorization=Bearer%20...`) included: the credential after an optional scheme.
_AUTH_SCHEMES = ("basic", "bearer", "token", "digest", "negotiate", "ntlm", "dpop", "apikey", "bot", "ssws",
                 "sso-key", "aws4-hmac-sha256")
_AUTHORIZATION = re.compile(
    r"(?i)(authorization\\?[\"']?[ \t]*[:=][ \t]*(?:[bfru]{0,2}\\?[\"'])?[ \t]*)"
    rf"((?:{'|'.join(_AUTH_SCHEMES)})(?:[ \t]+|%20|\+))?([^\s\"'`,;\\&)]+)"
)
# Credentials inside URLs go before e-mail addresses, so that `user:secret@host` is not read as an address.
# The password runs to the last `@` that a host follows, so it may hold `@` and `:`, and `/` or `?#` but not
# a `/` and then a `?#` (that `/` starts the path, that `?` the query: `u:pw@host/p?mail=a@b.c`).  A named
# host or localhost with a port (`http://localhost:5173/@vite/client`) is no user and password.  Every
# quantifier stops at a character the next one needs, so a long run of text costs linear time.
_URL_CREDENTIALS = re.compile(
    r"://(?!(?:localhost|[^\s/@:.]*\.[^\s/@:]*):\d{1,5}(?:[/?#]|$))"
    r"[^\s/@:]*:[^\s\"'<>`/?#]*(?:/[^\s\"'<>`?#]*|[?#][^\s\"'<>`/]*)?@(?=[A-Za-z0-9\[])"
)
# The look-behind starts an address only where its run of name characters starts: trying every position of
# a long run (a hex dump, `a.a.a...`) would cost quadratic time, and a later start finds the same `@` anyway.
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# After `user@host:`, the path of an scp-like remote (`git@github.com:org/r.git`, `deploy@h:/srv`, `u@h:~`).
_SCP_PATH = re.compile(r"[~/]|[\w.-]+/")
_HEX = frozenset("0123456789abcdefABCDEF")


def _escaped(text: str, start: int) -> bool:
    """Whether an escape sequence (`\\n`, `%3D`, `\\u003d`) ends just before ``start``."""
    return (
        (start >= 2 and text[start - 2] == "\\")
        or (start >= 3 and text[start - 3] == "%" and set(text[start - 2 : start]) <= _HEX)
        or (start >= 6 and text[start - 6 : start - 4] == "\\u" and set(text[start - 4 : start]) <= _HEX)
    )


def _inside_word(match: re.Match[str]) -> bool:
    """Whether ``match`` continues an ASCII word (`task-...`), rather than following a separator or escape."""
    start = match.start()
    before = match.string[start - 1 : start]
    return before.isascii() and before.isalnum() and not _escaped(match.string, start)


def _looks_random(tail: str) -> bool:
    """At least 20 characters mixing two of lower case, upper case and digits, as a generated key does."""
    kinds = (any(c.islower() for c in tail), any(c.isupper() for c in tail), any(c.isdigit() for c in tail))
    return len(tail) >= 20 and sum(kinds) >= 2


def _git_token(match: re.Match[str]) -> str:
    if _inside_word(match):
        return match.group()
    return "[GITLAB_TOKEN]" if match.group().startswith(("gl", "GR")) else "[GITHUB_TOKEN]"


def _openai_key(match: re.Match[str]) -> str:
    start = match.start()
    if _inside_word(match):
        return match.group()  # `task-...`, `disk-...`
    # Glued to an identifier by `-` or `_` (`x_sk-...`, `-sk-...`), only a random-looking tail is a key:
    # `--sk-some-long-option-name` is not.
    if match.string[start - 1 : start] in ("-", "_") and not _looks_random(match.group()[3:]):
        return match.group()
    return "[OPENAI_KEY]"


def _authorization(match: re.Match[str]) -> str:
    header, scheme, credential = match.group(1, 2, 3)
    if credential[0] in "[$<{%":
        return match.group()  # already masked, or a placeholder or template: `f"Bearer {token}"`, `$TOKEN`
    if scheme is None and (len(credential) < 16 or credential.lower() in _AUTH_SCHEMES):
        return match.group()  # no scheme: only a key-length word is a credential (`Authorization: required`)
    return f"{header}{scheme or ''}[CREDENTIALS]"


def _email(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    if text.startswith(":", end) and _SCP_PATH.match(text, end + 1):
        return match.group()  # `git@github.com:org/r.git`: a user and a host, not an address
    if start >= 3 and text.startswith("://", start - 3) and not text.startswith("@", end):
        return match.group()  # `ssh://git@github.com/...`: a URL's user and host
    if text[start - 1 : start] == "\\" and match.group()[0] in "nrtbf":
        return match.group()[0] + "[EMAIL]"  # keep the JSON escape `\n` in front of the address
    return "[EMAIL]"


_literal_secrets: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Mask these exact strings too (secrets from the environment that match no pattern)."""
    for value in values:
        if value and len(value) >= 6:
            _literal_secrets.add(value)


def mask(text: str) -> str:
    """Return ``text`` with tokens, keys, credentials, private-key blocks and e-mail addresses replaced.

    Every string written goes through here, so the common case (nothing to mask) costs a few
    substring scans: each rule runs only when a character or literal its pattern needs is present.
    """
    for secret in _literal_secrets:
        if secret in text:
            text = text.replace(secret, "[SECRET]")
    if "-" in text:
        if "-----BEGIN" in text:
            text = _PRIVATE_KEY.sub("[PRIVATE_KEY]", text)
        text = _OPENAI.sub(_openai_key, text)
    if "_" in text or "-" in text or "%" in text:
        text = _GIT_TOKEN.sub(_git_token, text)
    if "tsk" in text:
        text = _TASUKI_TOKEN.sub(lambda m: m.group() if _inside_word(m) else "[TASUKI_TOKEN]", text)
    if "GR1348941" in text:
        text = _GITLAB_RUNNER_REGISTRATION.sub(_git_token, text)
    if "thorization" in text or "THORIZATION" in text:
        text = _AUTHORIZATION.sub(_authorization, text)
    if "@" in text:
        if "://" in text:
            text = _URL_CREDENTIALS.sub("://[CREDENTIALS]@", text)
        text = _EMAIL.sub(_email, text)
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


OPAQUE_REASONING_KEYS = frozenset({"encrypted_content", "signature", "data"})
"""Fields of a reasoning item that are ciphertext or a signature (Responses' ``encrypted_content``, Anthropic's
``signature`` and a redacted block's ``data``): nothing readable is in them, and a changed byte makes the API
refuse the item."""


def mask_reasoning(reasoning: dict[str, Any]) -> dict[str, Any]:
    """A reply's reasoning to keep on disk and send back: its readable parts cannot be masked without breaking the
    signature or the encryption that covers them, so an item whose readable text holds something to mask is
    dropped whole (the provider goes on without it), and the opaque fields are kept byte for byte."""
    kept = []
    for item in reasoning.get("items") or []:
        readable = {k: v for k, v in item.items() if k not in OPAQUE_REASONING_KEYS} if isinstance(item, dict) else item
        if mask_value(readable) == readable:
            kept.append(item)
    return {**{k: mask_value(v) for k, v in reasoning.items() if k != "items"}, "items": kept}
