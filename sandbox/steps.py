"""What a repository's environment declaration comes down to (SPEC §17): named bash steps run in the checkout.

The types live here, below :mod:`sandbox.declarations` (which finds a declaration) and
:mod:`sandbox.conventions` (which reads the peers' files), so that both can build them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from contexts.errors import TasukiError


class DeclarationError(TasukiError):
    """A declaration file of the repository cannot be read: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class SetupStep:
    """One bash script, run with ``env`` over the setup's environment in ``working_directory`` of the checkout."""

    name: str
    script: str
    env: Mapping[str, str] = field(default_factory=dict)
    working_directory: str = "."  # relative to the checkout

    def canonical(self) -> dict[str, object]:
        return {
            "name": self.name,
            "script": self.script,
            "env": dict(sorted(self.env.items())),
            "working_directory": self.working_directory,
        }


@dataclass(frozen=True)
class Declaration:
    """Where a repository's setup comes from, its steps in order, and what of its file is not honoured."""

    source: str  # ".tasuki/setup.sh", "environments.repositories[owner/repo]", "auto (uv.lock)", ...
    steps: tuple[SetupStep, ...]
    notes: tuple[str, ...] = ()  # what is not honoured (a devcontainer's image, a workflow's `uses:` steps)
    github_files: bool = False  # the steps also see $GITHUB_ENV and $GITHUB_PATH (copilot-setup-steps)

    def content(self) -> str:
        """Canonical text of what runs (source, steps, their env and directories): part of the environment's key.

        The notes are left out: they say what is not run, so they cannot change the environment.
        """
        return json.dumps(
            {
                "source": self.source,
                "github_files": self.github_files,
                "steps": [step.canonical() for step in self.steps],
            },
            sort_keys=True,
            indent=1,
            ensure_ascii=False,
        )


def read_inside(checkout: Path, relative: str) -> bytes | None:
    """The bytes of the regular file ``relative`` of the checkout; None when there is none.

    The repository is untrusted: a symlink that leads out of the checkout (to a file of the worker's host)
    is an error, never read.
    """
    path = checkout / relative
    if not path.exists() and not path.is_symlink():
        return None
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise DeclarationError(f"{relative}: cannot be read ({exc.__class__.__name__})") from exc
    if not resolved.is_relative_to(checkout.resolve()):
        raise DeclarationError(f"{relative}: a symlink leading outside the checkout")
    if not resolved.is_file():
        raise DeclarationError(f"{relative}: not a regular file")
    return resolved.read_bytes()


def decode(relative: str, data: bytes) -> str:
    """The file's text (UTF-8, a byte-order mark dropped); a DeclarationError when it is not text."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DeclarationError(f"{relative}: not UTF-8 text (byte {exc.start})") from exc
