"""The sandbox's configuration sections: ``sandbox`` (where the agent's commands run)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from contexts.sections import GiB, PositiveInt, Section


class SandboxLimits(Section):
    memory_bytes: PositiveInt | None = 8 * GiB
    """Address space of each process of a tool call (RLIMIT_AS); null: no limit."""
    processes: PositiveInt | None = 1024
    """Processes of the worker's user (RLIMIT_NPROC; not enforced for root); null: no limit."""
    file_size_bytes: PositiveInt | None = 2 * GiB
    """Largest file a tool call may write (RLIMIT_FSIZE); null: no limit."""


class SandboxSettings(Section):
    backend: Literal["bubblewrap", "none"] = "bubblewrap"
    """Where the agent's commands run: bubblewrap namespaces, or none (on the host, for trusted models only)."""
    network: Literal["full", "none"] = "full"
    """The sandbox's network: full, or none (its own empty network namespace)."""
    read_only_paths: tuple[Path, ...] = ()
    """More host directories the sandbox sees read-only (the system and the tools on PATH always are)."""
    limits: SandboxLimits = SandboxLimits()
    """Resource limits of each tool call; CPU time is capped at the call's timeout."""
