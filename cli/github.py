"""``tasuki github app-manifest``: the GitHub App manifest for GitHub's manifest flow (docs/github-app.md)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from cli.common import UsageError, out
from worker.forges.app_manifest import ManifestError, app_manifest

if TYPE_CHECKING:
    from worker.settings_models import Settings


def manifest_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the App's webhooks go, and what GitHub shows of it."""
    parser.add_argument("--webhook-url", required=True,
                        help="the intake's public URL (https://HOST; /webhooks/github is appended)")
    parser.add_argument("--name", default="Tasuki", help="the App's name on GitHub (unique there)")
    parser.add_argument("--homepage", help="the App's homepage (default: the intake's origin)")
    parser.add_argument("--redirect-url", help="where GitHub sends the browser, with ?code=, once the App exists")
    parser.add_argument("--public", action="store_true", help="let other accounts install it (default: only yours)")


def cmd_app_manifest(args: argparse.Namespace, settings: Settings) -> int:
    """Print the manifest as JSON."""
    try:
        manifest = app_manifest(args.webhook_url, name=args.name, homepage=args.homepage,
                                redirect_url=args.redirect_url, public=args.public)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    out(json.dumps(manifest, indent=2))
    return 0
