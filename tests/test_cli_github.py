"""``tasuki github app-manifest``: the manifest GitHub's manifest flow takes, as the installed command prints it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from worker.forges.app_manifest import app_manifest


def tasuki(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "tasuki"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]
    return subprocess.run([*command, *args], cwd=tmp, capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp)})


def test_the_manifest_asks_for_what_tasuki_uses_and_sends_webhooks_to_the_intake(tmp_path: Path) -> None:
    done = tasuki(tmp_path, "github", "app-manifest", "--webhook-url", "https://tasuki.example.org/",
                  "--name", "Tasuki for ACME", "--redirect-url", "https://tasuki.example.org/app-created")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest == {
        "name": "Tasuki for ACME",
        "url": "https://tasuki.example.org",
        "hook_attributes": {"url": "https://tasuki.example.org/webhooks/github", "active": True},
        "redirect_url": "https://tasuki.example.org/app-created",
        "public": False,
        "default_permissions": {"contents": "write", "issues": "write", "pull_requests": "write",
                                "checks": "read", "actions": "read", "metadata": "read"},
        "default_events": ["issues", "issue_comment", "pull_request", "pull_request_review",
                           "pull_request_review_comment", "check_suite", "workflow_run"],
    }


def test_a_webhook_url_already_ending_in_the_path_is_kept() -> None:
    manifest = app_manifest("http://10.0.0.5:8000/webhooks/github", public=True)
    assert manifest["hook_attributes"]["url"] == "http://10.0.0.5:8000/webhooks/github"
    assert manifest["url"] == "http://10.0.0.5:8000"
    assert manifest["public"] is True
    assert "redirect_url" not in manifest


def test_a_bad_url_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    done = tasuki(tmp_path, "github", "app-manifest", "--webhook-url", "tasuki.example.org")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "tasuki: error: the intake URL must be an http:// or https:// URL, not 'tasuki.example.org'")
    missing = tasuki(tmp_path, "github", "app-manifest")
    assert missing.returncode == 2
    assert "--webhook-url" in missing.stderr
    assert "Traceback" not in done.stderr + missing.stderr
