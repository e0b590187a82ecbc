"""Webhook authenticity (SPEC §8): GitHub's and Gitea's HMAC-SHA256, GitLab's secret token, Standard-Webhooks
signatures.

Pure functions of the secret, the raw body, the headers and ``now``; every comparison is constant-time.
Header values arrive as Starlette decodes them (latin-1), so ``latin-1`` gives back their exact bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

GITHUB_PREFIX = "sha256="  # SHA-1 (``X-Hub-Signature``) is never accepted
SIGNING_TOKEN_PREFIX = "whsec_"  # noqa: S105 - the format marker of GitLab signing tokens, not a secret
TIMESTAMP_TOLERANCE_S = 300  # Standard Webhooks: refuse replays older (or newer) than five minutes
_MAX_TIMESTAMP_DIGITS = 12


def _raw(header: str) -> bytes:
    return header.encode("latin-1", errors="replace")


def github_signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``."""
    return GITHUB_PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_github(secret: str | None, body: bytes, header: str | None) -> bool:
    """True when ``header`` is ``sha256=`` + the HMAC-SHA256 of ``body`` under ``secret``."""
    if not secret or not header or not header.startswith(GITHUB_PREFIX):
        return False
    return hmac.compare_digest(github_signature(secret, body).encode(), _raw(header))


def gitea_signature(secret: str, body: bytes) -> str:
    """The ``X-Gitea-Signature`` (and Forgejo's ``X-Forgejo-Signature``) value for ``body``: bare lowercase hex."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_gitea(secret: str | None, body: bytes, *headers: str | None) -> bool:
    """True when one of ``headers`` is the hex HMAC-SHA256 of ``body`` under ``secret``."""
    if not secret:
        return False
    expected = gitea_signature(secret, body).encode()
    matched = False
    for header in headers:  # every one compared, not just until a match
        if header:
            matched |= hmac.compare_digest(expected, _raw(header))
    return matched


def verify_gitlab_token(secret: str | None, header: str | None) -> bool:
    """True when ``X-Gitlab-Token`` equals the configured secret."""
    if not secret or not header:
        return False
    return hmac.compare_digest(secret.encode(), _raw(header))


def signing_key(secret: str) -> bytes | None:
    """The HMAC key of a ``whsec_<base64>`` signing token; None for any other secret."""
    if not secret.startswith(SIGNING_TOKEN_PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(SIGNING_TOKEN_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    return key or None


def standard_signature(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` as a Standard-Webhooks sender signs it."""
    signed = _raw(message_id) + b"." + _raw(timestamp) + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify_standard(
    secret: str | None,
    body: bytes,
    message_id: str | None,
    timestamp: str | None,
    signatures: str | None,
    now: float,
) -> bool:
    """True when one ``v1,`` entry of ``webhook-signature`` matches and the timestamp is within tolerance."""
    if not secret or not message_id or not timestamp or not signatures:
        return False
    key = signing_key(secret)
    if key is None or not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > _MAX_TIMESTAMP_DIGITS:
        return False
    if abs(now - int(timestamp)) > TIMESTAMP_TOLERANCE_S:
        return False
    expected = _raw(standard_signature(key, message_id, timestamp, body))
    # Several space-separated entries are allowed (key rotation); compare every one, not just until a match.
    matched = False
    for entry in signatures.split(" "):
        if entry.startswith("v1,"):
            matched |= hmac.compare_digest(expected, _raw(entry))
    return matched
