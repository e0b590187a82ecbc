"""A local repository as a task names it: its resolved real path is its identity, a work tree or a bare repository.

The command line (``tasuki submit --repo-path``) and the task API (``POST /api/tasks``) accept the same things
through :func:`local_repository`, so `../x`, its absolute path and a symlink to it are one repository for both
(one environment, one snapshot, one mirror, one operator entry).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contexts.errors import TasukiError


class NotARepositoryError(TasukiError):
    """A local path named as a task's repository is neither a work tree nor a bare repository."""


class OutsideRootsError(TasukiError):
    """A local path resolves outside every directory it was allowed under."""


def is_git_repository(path: Path) -> bool:
    """A work tree (its ``.git``) or a bare repository (``HEAD``, ``objects/`` and ``refs/`` at its top), told
    from the layout alone: no git runs under a configuration the repository controls."""
    if (path / ".git").exists():
        return True
    return (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()


def local_repository(path: str | Path, roots: Sequence[Path] | None = None) -> Path:
    """The resolved real path of the repository at ``path``; with ``roots``, it must lie under one of them (checked
    on the real path, so a symlink cannot lead out, and before the layout, so nothing outside is probed)."""
    real = Path(path).resolve()
    if roots is not None:
        allowed = [root.resolve() for root in roots]
        if not any(real.is_relative_to(root) for root in allowed):
            raise OutsideRootsError(f"{real} is not under an allowed root ({', '.join(map(str, allowed)) or 'none'})")
    if not is_git_repository(real):
        raise NotARepositoryError(f"{real} is not a git repository")
    return real
