"""The dependency arrows point one way: contexts, memory <- fleet, sandbox, agent <- worker <- scheduler,
webhooks, console <- cli.

No exemptions: the roof (``cli/``) may import every package and nothing imports it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "contexts", "memory", "fleet", "sandbox", "agent", "worker", "scheduler", "webhooks", "console", "replay", "cli",
)
BROKERS = {"celery", "kombu", "redis", "billiard"}
DRIVERS = {"psycopg", "psycopg_pool", "pgvector"}  # the fleet store's (fleet/): the pure rooms name no database

# What each package must not import (top-level names). A package absent from the tree checks nothing.
FORBIDDEN: dict[str, set[str]] = {
    "contexts": BROKERS
    | DRIVERS
    | {"memory", "fleet", "sandbox", "agent", "worker", "scheduler", "webhooks", "console", "replay", "cli"},
    "memory": BROKERS | DRIVERS | {"fleet", "sandbox", "agent", "worker", "scheduler", "webhooks", "console", "replay",
                                   "cli"},
    "fleet": BROKERS | {"sandbox", "agent", "worker", "scheduler", "webhooks", "console", "replay", "cli"},
    "sandbox": BROKERS | DRIVERS | {"fleet", "agent", "worker", "scheduler", "webhooks", "console", "replay", "cli"},
    # the agent loop, its tools, prompts and providers: Celery, Redis and the database are the worker's
    "agent": BROKERS | DRIVERS | {"fleet", "worker", "scheduler", "webhooks", "console", "replay", "cli"},
    "worker": {"scheduler", "webhooks", "console", "replay", "cli"},
    "scheduler": {"webhooks", "console", "replay", "cli"},
    "webhooks": {"scheduler", "replay", "cli"},  # the intake may mount the console
    "console": {"scheduler", "webhooks", "replay", "cli"},
    "replay": BROKERS | {"scheduler", "webhooks", "console", "cli"},
    "cli": set(),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def top_levels(package: str) -> dict[str, set[str]]:
    return {
        str(path.relative_to(ROOT)): {name.split(".")[0] for name in imported_modules(path)}
        for path in sorted((ROOT / package).rglob("*.py"))
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package: str) -> None:
    forbidden = FORBIDDEN[package]
    offenders = {
        module: sorted(names & forbidden) for module, names in top_levels(package).items() if names & forbidden
    }
    assert offenders == {}


def test_every_package_is_checked() -> None:
    on_disk = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert on_disk <= set(PACKAGES)


@pytest.mark.parametrize(
    "module",
    [
        "contexts, contexts.queries, contexts.retention, contexts.schemas",
        "memory, memory.sqlite, memory.search",
        "agent, agent.loop, agent.tools, agent.llm.registry",
        "fleet, fleet.store",
        "replay",
    ],
)
def test_importing_pure_packages_loads_neither_celery_nor_redis(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(BROKERS)!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nothing_reads_a_path_outside_the_repository() -> None:
    """The repository stands alone: no code, test or CI script reaches for the shared folder beside it."""
    beside = ".." + "/shared"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    if not tracked:
        pytest.skip("not a git checkout")
    offenders = [
        name
        for name in tracked.splitlines()
        if not name.endswith(".md")
        and (ROOT / name).is_file()
        and beside in (ROOT / name).read_text(encoding="utf-8", errors="replace")
    ]
    assert offenders == []
