"""The replay model's per-conversation trajectories (issue 39): a conversation follows the route whose needle its
task message quotes, others the default; the oracle's bash command really applies a gold patch; a routes file round
trips; and an eval row's bare remote holds only the history up to its base commit."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.prompts import task_message
from evals.remotes import base_repository, find_source, model_patch, task_remote
from replay import ReplayModel, turns_from_entries
from replay.oracle import apply_command, load_routes, oracle_entries, route_entries, routes_document
from tests.helpers.stack import git


@dataclass(frozen=True)
class Row:
    instance_id: str
    problem_statement: str
    patch: str | None


def conversation(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are Tasuki."}, {"role": "user", "content": task_message(prompt)}]


def first_call(model: ReplayModel, prompt: str) -> tuple[str, dict[str, object]]:
    answer = model.answer(conversation(prompt))
    assert answer.status == 200, answer.error
    _, name, arguments = answer.tool_calls[0]
    return name, arguments


def test_a_conversation_follows_the_route_its_task_quotes() -> None:
    rows = [Row("a", "Fix the adder.", "PATCH-A\n"), Row("b", "Fix the adder. Also </task> the </task> sub.", None),
            Row("c", "Unrelated", "PATCH-C\n")]
    routes = route_entries(rows, "mixed", chosen={"a", "b"})
    model = ReplayModel(turns_from_entries([{"content": "default", "tool_calls": [
        {"name": "bash", "arguments": {"command": "echo default"}}]}]),
        routes={needle: turns_from_entries(entries) for needle, entries in routes.items()})
    name, arguments = first_call(model, "Fix the adder.")
    assert (name, "PATCH-A" in str(arguments["command"])) == ("bash", True)
    # b quotes a's whole statement: the longer needle wins; b has no gold patch, so it gets the empty agent
    assert first_call(model, rows[1].problem_statement)[0] == "finish"
    assert first_call(model, "Unrelated")[0] == "finish"  # c was not chosen
    assert first_call(model, "Something else")[1] == {"command": "echo default"}


def test_oracle_command_applies_the_gold_patch(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # TASUKI_GOLD_PATCH\n")
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", "calc.py")
    command = oracle_entries(patch)[0]["tool_calls"][0]["arguments"]["command"]
    assert command == apply_command(patch)
    subprocess.run(["bash", "-c", command], cwd=repo, check=True)
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b  # TASUKI_GOLD_PATCH\n"


def test_routes_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(routes_document(route_entries([Row("a", "Do A", "P\n")], "oracle",
                                                             gates={"a": "hold"}))))
    default, routes = load_routes(path)
    assert [turn.tool_calls[0].name for turn in default] == ["finish", "finish"]
    assert list(routes) == ["Do A"]
    assert routes["Do A"][0].gate == "hold"
    assert [turn.tool_calls[0].name for turn in routes["Do A"]] == ["bash", "bash", "finish", "finish"]


def test_base_repository_holds_no_commit_after_the_base(tmp_path: Path) -> None:
    source = tmp_path / "repos" / "acme__calc"
    source.mkdir(parents=True)
    git(source, "init", "-q", "-b", "trunk")
    (source / "calc.py").write_text("one\n")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "base")
    base_commit = git(source, "rev-parse", "HEAD").strip()
    (source / "calc.py").write_text("gold\n")
    git(source, "commit", "-q", "-am", "gold")
    git(source, "tag", "v1")
    git(source, "branch", "feature")
    gold = git(source, "rev-parse", "HEAD").strip()
    assert find_source("acme/calc", tmp_path / "repos") == source
    base = base_repository(source, base_commit, tmp_path / "bases" / "row.git")
    remote = task_remote(base, tmp_path / "remotes" / "row" / "a.1.git")
    for repo in (base, remote):
        assert git(repo, "for-each-ref", "--format=%(refname) %(objectname)").split("\n")[:-1] == [
            f"refs/heads/main {base_commit}"]
        found = subprocess.run(["git", "cat-file", "-e", gold], cwd=repo, capture_output=True, check=False)
        assert found.returncode != 0
    remotes = subprocess.run(["git", "config", "--get-regexp", "^remote[.]"], cwd=remote, capture_output=True,
                             check=False)
    assert remotes.returncode == 1  # no remote: nothing names where the base came from
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(remote), str(clone))
    (clone / "calc.py").write_text("changed\n")
    git(clone, "checkout", "-q", "-b", "tasuki/x")
    git(clone, "commit", "-q", "-am", "work")
    git(clone, "push", "-q", "origin", "tasuki/x")
    assert "+changed" in model_patch(remote, base_commit, "tasuki/x")
    assert model_patch(remote, base_commit, None) == ""
