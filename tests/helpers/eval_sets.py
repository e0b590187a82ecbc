"""A small synthetic task set over a local repository, for the eval runner's tests and benchmark (issue 39).

The repository ``acme/calc`` has a base commit with ``rows`` modules, each with a bug (``fN(x)`` should return
``x + N``), and a passing test; after the base, one commit per row fixes its module and adds its test (the gold patch
and the test patch), so the source holds the answers and a task's remote must not. Tests run with ``python3 -m
unittest`` (the sandbox has no pytest), ids ``test_modN.ModTest.test_fix`` (FAIL_TO_PASS) and
``test_modN.ModTest.test_callable`` (PASS_TO_PASS: only the test patch's files are run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay import ReplayModel, ReplayServer, serve, turns_from_entries
from replay.oracle import route_entries
from tests.helpers.stack import git

BASE_TEST = ("import unittest\n\n\nclass BaseTest(unittest.TestCase):\n    def test_ok(self):\n"
             "        self.assertTrue(True)\n")


def _module(n: int, fixed: bool) -> str:
    return f"def f{n}(x):\n    return x {'+' if fixed else '-'} {n}\n"


def _test(n: int) -> str:
    return (f"import unittest\n\nfrom mod{n} import f{n}\n\n\nclass ModTest(unittest.TestCase):\n"
            f"    def test_fix(self):\n        self.assertEqual(f{n}(10), {10 + n})\n\n"
            f"    def test_callable(self):\n        self.assertTrue(callable(f{n}))\n")


@dataclass(frozen=True)
class SetRow:
    """A row as the runner reads it (``evals.tasksets.Row``'s fields)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    test_parser: str = "unittest"
    setup: str | None = None
    test_command: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
                "problem_statement": self.problem_statement, "test_patch": self.test_patch, "patch": self.patch,
                "FAIL_TO_PASS": json.dumps(self.FAIL_TO_PASS), "PASS_TO_PASS": json.dumps(self.PASS_TO_PASS),
                "test_parser": self.test_parser}


@dataclass(frozen=True)
class SyntheticSet:
    repos_dir: Path
    source: Path
    rows: list[SetRow]
    gold_commits: list[str]

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(row.to_json()) + "\n" for row in self.rows))
        return path


def make_set(root: Path, rows: int = 4) -> SyntheticSet:
    """The repository under ``root/repos/acme/calc`` and its ``rows`` rows."""
    source = root / "repos" / "acme" / "calc"
    source.mkdir(parents=True)
    git(source, "init", "-q", "-b", "main")
    for n in range(1, rows + 1):
        (source / f"mod{n}.py").write_text(_module(n, fixed=False))
    (source / "test_base.py").write_text(BASE_TEST)
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "base")
    base = git(source, "rev-parse", "HEAD").strip()
    made: list[SetRow] = []
    gold_commits = []
    for n in range(1, rows + 1):
        (source / f"mod{n}.py").write_text(_module(n, fixed=True))
        patch = git(source, "diff")
        (source / f"test_mod{n}.py").write_text(_test(n))
        git(source, "add", "-A")
        test_patch = git(source, "diff", "--cached", "--", f"test_mod{n}.py")
        git(source, "commit", "-q", "-m", f"fix f{n}")
        gold_commits.append(git(source, "rev-parse", "HEAD").strip())
        made.append(SetRow(
            instance_id=f"acme__calc-{n}", repo="acme/calc", base_commit=base,
            problem_statement=f"Row {n}: f{n}(10) returns {10 - n}; it should return {10 + n}.",
            test_patch=test_patch, patch=patch, FAIL_TO_PASS=[f"test_mod{n}.ModTest.test_fix"],
            PASS_TO_PASS=[f"test_mod{n}.ModTest.test_callable"]))
    return SyntheticSet(root / "repos", source, made, gold_commits)


def profiles_env(models: dict[str, ReplayServer]) -> dict[str, str]:
    """Settings with one model profile per replay model, named as in ``models``."""
    profiles = {name: {"provider": "openai", "model": f"replay-{name}", "base_url": server.openai_base_url,
                       "context_length": 32768} for name, server in models.items()}
    return {"TASUKI__LLM__MODELS": json.dumps(profiles)}


def scripted(rows: Any, kind: str, **options: Any) -> ReplayServer:
    """A replay model in this process answering each row with the ``kind`` agent of replay/oracle.py."""
    routes = route_entries(rows, kind, **options)
    return serve(ReplayModel([], routes={needle: turns_from_entries(entries) for needle, entries in routes.items()}))
