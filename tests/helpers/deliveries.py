"""Webhook deliveries as GitHub, GitLab and Gitea send them: the checked-in example payloads, signed."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from webhooks.signatures import gitea_signature, github_signature, signing_key, standard_signature

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "webhooks"


def load_payload(name: str) -> dict[str, Any]:
    """A checked-in example payload, e.g. ``github/issues.labeled.json`` (see fixtures/webhooks/README.md)."""
    payload: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return payload


def github_delivery(event: str, payload: dict[str, Any] | bytes, secret: str | None,
                    delivery: str | None = None, hook_id: str = "109948940") -> tuple[bytes, dict[str, str]]:
    """The body and headers of a GitHub delivery (signed with ``secret`` when one is given)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Hook-ID": hook_id,
               "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "User-Agent": "GitHub-Hookshot/fake"}
    if secret is not None:
        headers["X-Hub-Signature-256"] = github_signature(secret, body)
    return body, headers


def gitlab_delivery(event: str, payload: dict[str, Any] | bytes, *, token: str | None = None,
                    signing_token: str | None = None, idempotency_key: str | None = None,
                    timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a GitLab delivery: ``X-Gitlab-Token`` and/or a Standard-Webhooks signature."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    key = idempotency_key or str(uuid.uuid4())
    headers = {"Content-Type": "application/json", "X-Gitlab-Event": event, "Idempotency-Key": key,
               "X-Gitlab-Event-UUID": str(uuid.uuid4()), "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
               "User-Agent": "GitLab/fake"}
    if token is not None:
        headers["X-Gitlab-Token"] = token
    if signing_token is not None:
        stamp = str(timestamp if timestamp is not None else int(time.time()))
        signing = signing_key(signing_token)
        assert signing is not None
        headers.update({"webhook-id": key, "webhook-timestamp": stamp,
                        "webhook-signature": standard_signature(signing, key, stamp, body)})
    return body, headers


def gitea_delivery(event: str, payload: dict[str, Any] | bytes, secret: str | None, *,
                   delivery: str | None = None, forgejo: bool = False) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a Gitea delivery, or a Forgejo one (which names itself in ``X-Forgejo-*`` only,
    as older Forgejo does): the hex HMAC-SHA256 of the body when ``secret`` is given."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    prefix = "X-Forgejo" if forgejo else "X-Gitea"
    headers = {"Content-Type": "application/json", f"{prefix}-Event": event, f"{prefix}-Delivery":
               delivery or str(uuid.uuid4()), "User-Agent": "Go-http-client/1.1"}
    if secret is not None:
        headers[f"{prefix}-Signature"] = gitea_signature(secret, body)
    return body, headers


def gitea_labeled(labels: list[str], number: int | None = None) -> dict[str, Any]:
    """A Gitea ``issues`` delivery of ``label_updated``: the published ``issues.opened.json`` with the action and the
    issue's labels after the change (see fixtures/webhooks/README.md)."""
    payload = load_payload("gitea/issues.opened.json")
    payload["action"] = "label_updated"
    payload["issue"]["labels"] = [{"id": 100 + i, "name": name, "color": "ededed"} for i, name in enumerate(labels)]
    if number is not None:
        payload["issue"]["number"] = payload["number"] = number
    return payload
