"""The dependency arrows point one way: contexts, memory <- fleet, sandbox, agent <- worker <- evals <- scheduler,
webhooks, console <- cli.

No exemptions: the roof (``cli/``) may import every package and nothing imports it.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "contexts", "memory", "fleet", "sandbox", "agent", "worker", "evals", "scheduler", "webhooks", "console", "replay",
    "cli",
)
BROKERS = {"celery", "kombu", "redis", "billiard"}
DRIVERS = {"psycopg", "psycopg_pool", "pgvector"}  # the fleet store's (fleet/): the pure rooms name no database

# What each package must not import (top-level names). A package absent from the tree checks nothing.
FORBIDDEN: dict[str, set[str]] = {
    "contexts": BROKERS
    | DRIVERS
    | {"memory", "fleet", "sandbox", "agent", "worker", "evals", "scheduler", "webhooks", "console", "replay", "cli"},
    "memory": BROKERS | DRIVERS | {"fleet", "sandbox", "agent", "worker", "evals", "scheduler", "webhooks", "console",
                                   "replay", "cli"},
    "fleet": BROKERS | {"sandbox", "agent", "worker", "evals", "scheduler", "webhooks", "console", "replay", "cli"},
    "sandbox": BROKERS | DRIVERS | {"fleet", "agent", "worker", "evals", "scheduler", "webhooks", "console", "replay",
                                    "cli"},
    # the agent loop, its tools, prompts and providers: Celery, Redis and the database are the worker's
    "agent": BROKERS | DRIVERS | {"fleet", "worker", "evals", "scheduler", "webhooks", "console", "replay", "cli"},
    "worker": {"evals", "scheduler", "webhooks", "console", "replay", "cli"},
    # the eval harness runs tasks through the fleet like any submitter; the console shows its reports
    "evals": {"scheduler", "webhooks", "console", "replay", "cli"},
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


# -- names are compared only in their registries (issue 38) ----------------------------------------------------------

# A registered name that is also a word of other vocabularies ("none" is a backend, a network mode, a reasoning effort
# and an environment's outcome) is that registry's name only where the other side of the comparison reads what the
# registry names: these are the words that say so, per registry.
SHARED_WORDS = {"none"}
SUBJECTS = {"providers": ("provider",), "sandbox backends": ("backend", "sandbox.name"), "forges": ("source", "forge")}


def registries() -> dict[str, tuple[Path, frozenset[str]]]:
    """Each registry: its module's file and the names it registers, read from it."""
    from agent.llm import registry
    from sandbox import jail
    from worker import forges

    return {
        "providers": (Path(registry.__file__), frozenset(registry.names())),
        "sandbox backends": (Path(jail.__file__), frozenset(jail.BACKENDS)),
        "forges": (Path(forges.__file__), frozenset(forges.FORGES)),
    }


def compared_names(source: str, names: frozenset[str], subjects: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, name) of each of ``names`` that a comparison (==, !=, in, not in, is) or a match case tests for."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides: list[ast.AST] = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            sides = [node.subject, *(case.pattern for case in node.cases)]
        else:
            continue
        constants = [c.value for side in sides for c in ast.walk(side) if isinstance(c, ast.Constant)]
        read = " ".join(ast.unparse(side) for side in sides)
        for name in (c for c in constants if c in names):
            if name not in SHARED_WORDS or any(subject in read for subject in subjects):
                found.append((node.lineno, name))
    return found


def checked_modules() -> list[Path]:
    """Every module but the tests': the rooms and the benchmarks."""
    return [path for package in (*PACKAGES, "bench") for path in sorted((ROOT / package).rglob("*.py"))]


@pytest.mark.parametrize("kind", ["providers", "sandbox backends", "forges"])
def test_a_registered_name_is_compared_only_in_its_registry(kind: str) -> None:
    """A provider, sandbox backend or forge is looked up in its registry for what it is (an entry's property),
    never recognised by its name elsewhere: a new one is a module and a line in the registry."""
    home, names = registries()[kind]
    offenders = {
        f"{path.relative_to(ROOT)}:{line}": name
        for path in checked_modules()
        if path != home
        for line, name in compared_names(path.read_text(), names, SUBJECTS[kind])
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "code",
    [
        'if spec.provider == "ollama": pass',
        'ok = provider in ("openai", "anthropic")',
        'ok = "gitea" != task_key["task_source"]',
        'ok = source not in {"gitlab"}',
        'match source:\n    case "github" | "gitea": pass',
        'ok = settings.sandbox.backend == "none"',
        'ok = sandbox.name != "bubblewrap"',
    ],
)
def test_the_name_check_sees_every_form_of_comparison(code: str) -> None:
    found = [
        name for kind, (_, names) in registries().items() for _, name in compared_names(code, names, SUBJECTS[kind])
    ]
    assert found


@pytest.mark.parametrize("code", ['ok = settings.network == "none"', 'ok = report.outcome != "none"'])
def test_a_shared_word_is_a_backend_only_beside_a_backend(code: str) -> None:
    _, names = registries()["sandbox backends"]
    assert compared_names(code, names, SUBJECTS["sandbox backends"]) == []


def test_settings_accept_exactly_the_registered_backends() -> None:
    from typing import get_args

    from sandbox.jail import BACKENDS
    from sandbox.settings import SandboxSettings

    assert set(get_args(SandboxSettings.model_fields["backend"].annotation)) == set(BACKENDS)


def test_each_backend_makes_a_sandbox_that_answers_to_its_name() -> None:
    """A sandbox's ``name`` is how code finds its entry (``backend(sandbox.name).confines``)."""
    from sandbox.jail import BACKENDS
    from sandbox.settings import SandboxSettings

    made = {name: entry.make(SandboxSettings.model_validate({"backend": name})) for name, entry in BACKENDS.items()}
    assert {name: sandbox.name for name, sandbox in made.items()} == {name: name for name in BACKENDS}


def source_choices(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """The choices of every ``--source`` option of ``parser`` and its subcommands."""
    found = []
    for action in parser._actions:  # argparse keeps its options there and offers no public listing
        if "--source" in action.option_strings and action.choices is not None:
            found.append(tuple(action.choices))
        if isinstance(action, argparse._SubParsersAction):
            found += [c for sub in action.choices.values() for c in source_choices(sub)]
    return found


def test_every_list_of_forge_names_is_the_registrys() -> None:
    """Where a forge's name must be listed (the command line's and the API's choices), the list is the registry's."""
    from typing import get_args

    from cli.main import build_parser
    from webhooks.api import Submission
    from worker.forges import FORGES

    choices = source_choices(build_parser())
    assert len(choices) >= 3  # submit, and the memory commands
    assert {frozenset(c) for c in choices} == {frozenset(FORGES)}
    assert set(get_args(Submission.model_fields["source"].annotation)) == set(FORGES)


def test_the_intake_has_a_webhook_route_for_every_forge() -> None:
    from webhooks.routes import HOOKS
    from worker.forges import FORGES

    assert set(HOOKS) == set(FORGES)


# -- each tool declares what it touches --------------------------------------------------------------------------


def test_every_registered_tool_declares_whether_it_changes_the_checkout() -> None:
    """The loop checkpoints after, and never repeats on resume, a call of a tool that changes the checkout: the tool
    says so itself, on its class, not in a list elsewhere."""
    from agent.tools import TOOLS

    undeclared = [name for name, tool in TOOLS.items() if not isinstance(getattr(tool, "changes_checkout", None), bool)]
    assert undeclared == []


def declares_changes_checkout(node: ast.ClassDef) -> bool:
    """Whether the class sets ``changes_checkout`` in its body, as a property, or on ``self`` in a method."""
    for statement in ast.walk(node):
        targets = statement.targets if isinstance(statement, ast.Assign) else (
            [statement.target] if isinstance(statement, ast.AnnAssign) else [])
        for target in targets:
            if getattr(target, "id", None) == "changes_checkout" or getattr(target, "attr", None) == "changes_checkout":
                return True
        if isinstance(statement, ast.FunctionDef) and statement.name == "changes_checkout":
            return True
    return False


def is_tool(node: ast.ClassDef) -> bool:
    """A class with the Tool Protocol's ``run(workspace, arguments, options)``."""
    return any(
        isinstance(s, ast.FunctionDef) and s.name == "run"
        and [a.arg for a in s.args.args[1:4]] == ["workspace", "arguments", "options"]
        for s in node.body
    )


def test_every_tool_class_in_the_tools_room_declares_whether_it_changes_the_checkout() -> None:
    """Also the tools outside the fixed registry (made at run time): any class with the Protocol's ``run``."""
    tools = [
        (path, node)
        for path in sorted((ROOT / "agent" / "tools").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and is_tool(node)
    ]
    undeclared = [f"{path.relative_to(ROOT)}:{t.name}" for path, t in tools if not declares_changes_checkout(t)]
    assert len(tools) >= 6
    assert undeclared == []
