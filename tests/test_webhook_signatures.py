"""Webhook signatures against the published test vectors, and the ways a signature must be refused."""

from __future__ import annotations

import pytest

from webhooks.signatures import (
    TIMESTAMP_TOLERANCE_S,
    github_signature,
    signing_key,
    standard_signature,
    verify_github,
    verify_gitlab_token,
    verify_standard,
)

# GitHub's documented example ("Validating webhook deliveries"): secret, payload and X-Hub-Signature-256.
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_PAYLOAD = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# The Standard Webhooks specification's reference vector (GitLab signing tokens use the same scheme).
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TIMESTAMP = "1614265330"
SW_BODY = b'{"test": 2432232314}'
SW_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_github_documented_vector_is_reproduced_and_accepted() -> None:
    assert github_signature(GITHUB_SECRET, GITHUB_PAYLOAD) == GITHUB_SIGNATURE
    assert verify_github(GITHUB_SECRET, GITHUB_PAYLOAD, GITHUB_SIGNATURE)


@pytest.mark.parametrize(
    ("secret", "body", "header"),
    [
        (GITHUB_SECRET, GITHUB_PAYLOAD + b" ", GITHUB_SIGNATURE),  # body changed
        ("another secret", GITHUB_PAYLOAD, GITHUB_SIGNATURE),
        (GITHUB_SECRET, GITHUB_PAYLOAD, GITHUB_SIGNATURE.removeprefix("sha256=")),  # prefix required
        (GITHUB_SECRET, GITHUB_PAYLOAD, "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59"),  # SHA-1, never
        (GITHUB_SECRET, GITHUB_PAYLOAD, GITHUB_SIGNATURE.upper().replace("SHA256=", "sha256=")),
        (GITHUB_SECRET, GITHUB_PAYLOAD, None),
        (GITHUB_SECRET, GITHUB_PAYLOAD, ""),
        (None, GITHUB_PAYLOAD, GITHUB_SIGNATURE),  # no secret configured: nothing is trusted
        ("", GITHUB_PAYLOAD, GITHUB_SIGNATURE),
        (GITHUB_SECRET, GITHUB_PAYLOAD, GITHUB_SIGNATURE + "é"),  # non-ASCII header bytes
    ],
)
def test_github_signature_is_refused_when_anything_differs(secret: str | None, body: bytes, header: str | None) -> None:
    assert not verify_github(secret, body, header)


def test_standard_webhooks_reference_vector_is_reproduced_and_accepted() -> None:
    key = signing_key(SW_SECRET)
    assert key is not None
    assert standard_signature(key, SW_ID, SW_TIMESTAMP, SW_BODY) == SW_SIGNATURE
    assert verify_standard(SW_SECRET, SW_BODY, SW_ID, SW_TIMESTAMP, SW_SIGNATURE, now=float(SW_TIMESTAMP))


def test_standard_signature_accepts_any_matching_entry_of_a_rotated_key_list() -> None:
    header = f"v1,bm90IHRoaXMgb25l v2,xyz {SW_SIGNATURE}"
    assert verify_standard(SW_SECRET, SW_BODY, SW_ID, SW_TIMESTAMP, header, now=float(SW_TIMESTAMP))


@pytest.mark.parametrize("skew", [TIMESTAMP_TOLERANCE_S + 1, -(TIMESTAMP_TOLERANCE_S + 1)])
def test_standard_signature_outside_five_minutes_is_refused(skew: int) -> None:
    now = float(SW_TIMESTAMP) + skew
    assert not verify_standard(SW_SECRET, SW_BODY, SW_ID, SW_TIMESTAMP, SW_SIGNATURE, now=now)


def test_standard_signature_at_the_edge_of_the_window_is_accepted() -> None:
    now = float(SW_TIMESTAMP) + TIMESTAMP_TOLERANCE_S
    assert verify_standard(SW_SECRET, SW_BODY, SW_ID, SW_TIMESTAMP, SW_SIGNATURE, now=now)


@pytest.mark.parametrize(
    ("secret", "message_id", "timestamp", "body", "header"),
    [
        (SW_SECRET, "msg_other", SW_TIMESTAMP, SW_BODY, SW_SIGNATURE),  # the id is signed
        (SW_SECRET, SW_ID, SW_TIMESTAMP, SW_BODY + b" ", SW_SIGNATURE),
        (SW_SECRET, SW_ID, "1614265330.0", SW_BODY, SW_SIGNATURE),
        (SW_SECRET, SW_ID, "１６１４２６５３３０", SW_BODY, SW_SIGNATURE),  # non-ASCII digits
        (SW_SECRET, SW_ID, SW_TIMESTAMP, SW_BODY, SW_SIGNATURE.replace("v1,", "v2,")),
        (SW_SECRET, None, SW_TIMESTAMP, SW_BODY, SW_SIGNATURE),
        (SW_SECRET, SW_ID, None, SW_BODY, SW_SIGNATURE),
        (SW_SECRET, SW_ID, SW_TIMESTAMP, SW_BODY, None),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SW_ID, SW_TIMESTAMP, SW_BODY, SW_SIGNATURE),  # not a whsec_ token
        ("whsec_not*base64", SW_ID, SW_TIMESTAMP, SW_BODY, SW_SIGNATURE),
        (None, SW_ID, SW_TIMESTAMP, SW_BODY, SW_SIGNATURE),
    ],
)
def test_standard_signature_is_refused_when_anything_differs(
    secret: str | None, message_id: str | None, timestamp: str | None, body: bytes, header: str | None
) -> None:
    assert not verify_standard(secret, body, message_id, timestamp, header, now=float(SW_TIMESTAMP))


def test_gitlab_token_must_equal_the_secret() -> None:
    assert verify_gitlab_token("s3cret-token", "s3cret-token")
    assert not verify_gitlab_token("s3cret-token", "s3cret-tokeN")
    assert not verify_gitlab_token("s3cret-token", "")
    assert not verify_gitlab_token("s3cret-token", None)
    assert not verify_gitlab_token(None, "anything")
    assert not verify_gitlab_token("s3cret-token", "s3cret-token\u00e9")
