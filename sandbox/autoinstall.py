"""``environments.auto``: the usual install for the lockfiles and manifests at the top of a checkout (SPEC §17).

:data:`AUTO_INSTALLS` is the documented table (docs/environments.md, "Declarations"). For each toolchain the
first row whose names match a file at the top of the checkout wins; several toolchains give several steps.
Python installs into ``/workspace/.venv`` with the ``python3`` found on the setup's ``PATH`` (never Tasuki's
own interpreter); Node into ``node_modules``; Go's and Rust's caches land in the home.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from sandbox.steps import Declaration, SetupStep

VENV = "python3 -m venv .venv && .venv/bin/pip install"


@dataclass(frozen=True)
class AutoInstall:
    """One row: a toolchain, the file names (globs) that select it, and the bash that installs.

    ``{found}`` in the script is replaced by the matched names, each written as ``argument`` (shell-quoted).
    """

    toolchain: str
    names: tuple[str, ...]
    script: str
    argument: str = "{}"


def _with(tool: str, command: str, otherwise: str) -> str:
    return f"if command -v {tool} >/dev/null 2>&1; then {command}; else {otherwise}; fi"


AUTO_INSTALLS: tuple[AutoInstall, ...] = (
    AutoInstall("python", ("uv.lock",), _with("uv", "uv sync --frozen", f"{VENV} -e .")),
    AutoInstall(
        "python",
        ("poetry.lock",),
        _with("poetry", "POETRY_VIRTUALENVS_IN_PROJECT=true poetry install --no-interaction", f"{VENV} -e ."),
    ),
    AutoInstall("python", ("requirements*.txt",), VENV + " {found}", argument="-r {}"),
    AutoInstall("python", ("pyproject.toml", "setup.py"), f"{VENV} -e ."),
    AutoInstall("node", ("package-lock.json",), "npm ci"),
    AutoInstall(
        "node",
        ("pnpm-lock.yaml",),
        _with("pnpm", "pnpm install --frozen-lockfile", "npx --yes pnpm install --frozen-lockfile"),
    ),
    AutoInstall("node", ("yarn.lock",), _with("yarn", "yarn install", "npx --yes yarn install")),
    AutoInstall("node", ("package.json",), "npm install"),
    # The build cache (GOCACHE, in the home the snapshot keeps) is filled too: compiling the standard library and
    # the module's packages once here, not in every task's first "go test" (go-cmp's: 25 s cold, 1.3 s warm). A
    # package that does not compile at the base leaves the rest cached, and the setup still succeeds.
    AutoInstall(
        "go",
        ("go.mod",),
        "go mod download && { go test -count=1 -run '^$' ./... >/dev/null"
        " || echo 'go: the warm-up build failed; the build cache keeps what compiled' >&2; }",
    ),
    AutoInstall("rust", ("Cargo.lock", "Cargo.toml"), "cargo fetch"),
)


def top_files(checkout: Path, pattern: str) -> list[str]:
    """Names of the regular files (not symlinks) at the top of the checkout that match ``pattern``, sorted."""
    return sorted(path.name for path in checkout.glob(pattern) if path.is_file() and not path.is_symlink())


def auto_declaration(checkout: Path) -> Declaration | None:
    """One step per toolchain whose lockfile or manifest is at the top of the checkout; None when there is none."""
    steps: list[SetupStep] = []
    found_names: list[str] = []
    chosen: set[str] = set()
    for row in AUTO_INSTALLS:
        if row.toolchain in chosen:
            continue
        found = [name for pattern in row.names for name in top_files(checkout, pattern)]
        if not found:
            continue
        chosen.add(row.toolchain)
        found_names.extend(found)
        arguments = " ".join(row.argument.format(shlex.quote(name)) for name in found)
        script = row.script.replace("{found}", arguments)
        steps.append(SetupStep(name=f"{row.toolchain} ({', '.join(found)})", script=script))
    if not steps:
        return None
    return Declaration(source=f"auto ({', '.join(found_names)})", steps=tuple(steps))
