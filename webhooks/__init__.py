"""Tasuki's HTTP intake: GitHub/GitLab webhooks, the task API, ``/healthz`` and ``/metrics`` (SPEC §8)."""

from webhooks.app import create_app
from webhooks.server import serve

__all__ = ["create_app", "serve"]
