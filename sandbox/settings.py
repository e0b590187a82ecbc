"""The sandbox's configuration sections: ``sandbox`` (where the agent's commands run) and ``environments``
(each repository's environment, SPEC §17)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from contexts.sections import GiB, HashableDict, PositiveInt, Section
from sandbox.egress import internal_range

# The package registries of the toolchains the worker image carries: the default egress allow-list.
DEFAULT_ALLOWED_HOSTS = (
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "proxy.golang.org",
    "sum.golang.org",
    "index.crates.io",
    "static.crates.io",
    "repo.maven.apache.org",
    "repo1.maven.org",
)
DEFAULT_EXCLUDE = (
    ".venv/",
    "venv/",
    "node_modules/",
    "__pycache__/",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".tox/",
    ".nox/",
    "*.egg-info/",
)


def _internal_network(text: str) -> str:
    internal_range(text)  # ValueError, which names the entry, when it is not a network
    return text.strip()


InternalNetwork = Annotated[str, AfterValidator(_internal_network)]


class SandboxLimits(Section):
    memory_bytes: PositiveInt | None = 8 * GiB
    """Memory of each tool call, all its processes together (its cgroup's memory.max); null: no limit."""
    processes: PositiveInt | None = 1024
    """Processes of each tool call (its cgroup's pids.max; RLIMIT_NPROC where no cgroup can be used); null: no
    limit."""
    file_size_bytes: PositiveInt | None = 2 * GiB
    """Largest file a tool call may write (RLIMIT_FSIZE); null: no limit."""
    tmpfs_bytes: PositiveInt | None = 1 * GiB
    """Size of each memory file system of a sandboxed call: its /tmp and its /dev/shm; null: half the host's memory."""


class SandboxSettings(Section):
    backend: Literal["bubblewrap", "none"] = "bubblewrap"
    """Where the agent's commands run: bubblewrap namespaces, or none (on the host, for trusted models only)."""
    network: Literal["full", "none", "allowlist"] = "full"
    """The agent's network, always a namespace of its own: full (any public host), allowlist (only
    sandbox.allowed_hosts), both through the task's egress proxy; or none (no way out)."""
    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    """Hosts (a leading "*." admits subdomains) the agent may reach with network: allowlist, through a proxy."""
    allowed_internal: tuple[InternalNetwork, ...] = ()
    """Non-public networks the egress proxy may connect to (CIDR, optionally :PORT: "10.1.2.0/24", "127.0.0.1/32:8080");
    every loopback, private, link-local and CGNAT address is refused otherwise, whatever name resolves to it."""
    read_only_paths: tuple[Path, ...] = ()
    """More host directories the sandbox sees read-only (the system and the tools on PATH always are)."""
    limits: SandboxLimits = SandboxLimits()
    """Resource limits of each tool call; CPU time is capped at the call's timeout."""
    user: str = "tasuki-sandbox"
    """The user a worker running as root runs its sandboxes as (never as root); a worker that is not root runs them
    as itself. Make it once: useradd --system --no-create-home tasuki-sandbox."""
    disk_bytes: PositiveInt | None = 16 * GiB
    """Disk a task's home and environment layers may take: a call that makes them grow past it is killed; null: no
    cap."""


class ServiceSettings(Section):
    command: str
    """The command that starts the service (bash, run in a sandbox of its own with the task's home)."""
    ready: str | None = None
    """A command that exits 0 once the service answers; null: ready as soon as it started."""
    ready_timeout_s: PositiveInt = 60
    """Seconds the service has to become ready before the task starts without it."""


class RepositoryEnvironment(Section):
    setup: str | None = None
    """The setup script (bash, run in the checkout) for a repository whose .tasuki/setup.sh the operator cannot add."""
    services: Annotated[dict[str, ServiceSettings], AfterValidator(HashableDict)] = Field(default_factory=HashableDict)
    """Services its tests need, by name: started for each task before its first step, stopped with it."""


class EnvironmentsSettings(Section):
    repositories: Annotated[dict[str, RepositoryEnvironment], AfterValidator(HashableDict)] = Field(
        default_factory=HashableDict
    )
    """Per repository ("owner/repo" or a local path): a setup and services the operator declares (SPEC §17)."""
    auto: bool = True
    """Without a declaration, install what the lockfiles at the top of the checkout name (docs/environments.md)."""
    key_files: tuple[str, ...] = ()
    """More globs (relative to the checkout) whose content is part of an environment's key, beside the lockfiles."""
    setup_network: Literal["full", "none", "allowlist"] = "full"
    """The setup's network: full, none, or allowlist (sandbox.allowed_hosts)."""
    setup_secrets: tuple[str, ...] = ()
    """Worker environment variables passed to the setup only (a private registry's token); never to the agent."""
    setup_timeout_s: PositiveInt = 1800
    """Seconds a setup may run; past them it is killed and the task starts without it."""
    snapshots_dir: Path | None = None
    """Where this host keeps environment snapshots; null: environments/ beside the git cache."""
    keep_per_repository: PositiveInt = 3
    """Snapshots kept per repository (the most recently used)."""
    keep_days: PositiveInt = 14
    """Days a snapshot is kept unused before the hourly sweep deletes it."""
    max_snapshot_bytes: PositiveInt = 4 * GiB
    """A larger environment is not kept as a snapshot (the task still uses it)."""
    restore: Literal["auto", "layers", "copy"] = "auto"
    """How a snapshot is restored: layers (its directories seen through overlayfs in the sandbox, nothing copied,
    docs/environments.md "Layers"), copy (a private copy, or the key's spare moved into place), or auto: layers where
    this host's probe says they work, else copy."""
    max_spares_bytes: Annotated[int, Field(ge=0)] = 8 * GiB
    """Disk (apparent size) all of this host's spares may take together (ready copies of snapshots that make a restore
    a few renames, docs/environments.md "Spares"): one that would go over is not made, the sweep drops the oldest
    first; 0: no spares (set it when snapshots_dir is on another file system than contexts.workspaces_dir)."""
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    """Paths never committed nor pushed, beside the repository's .gitignore and what a setup created."""
    max_file_bytes: PositiveInt = 5 * 1024 * 1024
    """A file larger than this is never committed nor pushed."""

    def for_repository(self, repository: str) -> RepositoryEnvironment | None:
        """The operator's entry for ``repository`` (``owner/repo``, or a local repository's resolved real path): a
        key written as a path matches by its own resolved path, so ``../x``, a symlink and the absolute path name one
        repository."""
        entry = self.repositories.get(repository)
        if entry is not None or not repository.startswith("/"):
            return entry
        for key, configured in self.repositories.items():
            if key.startswith(("/", "~")) and str(Path(key).expanduser().resolve()) == repository:
                return configured
        return None
