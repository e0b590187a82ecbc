"""The dependency arrows point one way: contexts <- worker <- scheduler, webhooks (STYLE.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The `tasuki` command is the roof: it may reach every room, and nothing imports it.
ROOF = {"worker/cli.py", "worker/commands.py", "worker/up.py"}


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


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("contexts", {"celery", "kombu", "redis", "worker", "scheduler", "webhooks"}),
        ("worker", {"scheduler", "webhooks"}),
    ],
)
def test_imports_point_one_way(package: str, forbidden: set[str]) -> None:
    offenders = {
        module: sorted(names & forbidden)
        for module, names in top_levels(package).items()
        if names & forbidden and module not in ROOF
    }
    assert offenders == {}


def test_importing_contexts_loads_neither_celery_nor_redis() -> None:
    code = "import sys, contexts, contexts.queries, contexts.retention; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'redis')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
