"""The GitHub App manifest (GitHub's "Registering a GitHub App from a manifest" flow): what Tasuki needs of an
App — its permissions and the webhook events it subscribes to — so creating it is one form submitted once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from contexts.errors import TasukiError

PERMISSIONS = {
    "contents": "write",  # clone, push the task branch and its checkpoints
    "issues": "write",  # labels, the progress comment, the summary
    "pull_requests": "write",  # open the pull request, answer review threads
    "checks": "read",  # a check suite's failed check runs (CI follow-ups)
    "actions": "read",  # a workflow run's jobs and logs; GitHub sends workflow_run only with it
    "metadata": "read",  # every App has it
}
EVENTS = ("issues", "issue_comment", "pull_request", "pull_request_review", "pull_request_review_comment",
          "check_suite", "workflow_run")
WEBHOOK_PATH = "/webhooks/github"


class ManifestError(TasukiError):
    """A manifest cannot be made of what was given (a URL that is not http(s))."""


def _url(value: str, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ManifestError(f"{what} must be an http:// or https:// URL, not {value!r}")
    return value


def app_manifest(intake_url: str, *, name: str = "Tasuki", homepage: str | None = None,
                 redirect_url: str | None = None, public: bool = False) -> dict[str, Any]:
    """The manifest of an App whose webhooks go to the intake at ``intake_url`` (``/webhooks/github`` is
    appended unless it is there)."""
    base = _url(intake_url, "the intake URL").rstrip("/")
    hook = base if base.endswith(WEBHOOK_PATH) else base + WEBHOOK_PATH
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(base))
    manifest: dict[str, Any] = {
        "name": name,
        "url": _url(homepage, "the homepage URL") if homepage else origin,
        "hook_attributes": {"url": hook, "active": True},
        "public": public,
        "default_permissions": dict(PERMISSIONS),
        "default_events": list(EVENTS),
    }
    if redirect_url:
        manifest["redirect_url"] = _url(redirect_url, "the redirect URL")
    return manifest
