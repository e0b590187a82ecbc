"""The labelled recall sets (issue 38): a held-out split of at least 100 paraphrases over at least three real
histories, apart from the tuning split, with labels that exist and queries that do not copy their commits."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from bench.bench_recall_quality import FIXTURES, HELD_OUT, SETS, TUNING

ROOT = Path(__file__).resolve().parents[1]


def labelled(name: str) -> tuple[dict[str, str], list[dict[str, object]]]:
    rows = [json.loads(line) for line in (FIXTURES / f"{name}_history.jsonl").read_text().splitlines()]
    return {r["commit"]: r["message"] for r in rows}, json.loads((FIXTURES / f"{name}_queries.json").read_text())[
        "queries"]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def longest_shared_run(query: str, message: str) -> int:
    """The most consecutive words ``query`` shares with ``message``'s first line."""
    q, subject = words(query), " " + " ".join(words(message.splitlines()[0])) + " "
    for n in range(len(q), 0, -1):
        if any(" " + " ".join(q[i : i + n]) + " " in subject for i in range(len(q) - n + 1)):
            return n
    return 0


def test_the_held_out_split_is_large_enough_and_apart_from_the_tuning_split() -> None:
    assert not set(HELD_OUT) & set(TUNING)
    assert set(HELD_OUT) | set(TUNING) == set(SETS)
    assert len({SETS[name] for name in HELD_OUT}) >= 3  # three repositories' histories
    assert sum(len(labelled(name)[1]) for name in HELD_OUT) >= 100
    for name in (*HELD_OUT, *TUNING):
        assert (FIXTURES / f"{name}_LICENSE.txt").stat().st_size > 500, name  # each history with its licence


def test_every_label_names_a_commit_of_its_history() -> None:
    for name in SETS:
        history, queries = labelled(name)
        for query in queries:
            relevant = query["relevant"]
            assert isinstance(relevant, list)
            assert relevant, query
            assert set(relevant) <= history.keys(), (name, query)


def test_held_out_queries_are_paraphrases_not_copies_of_their_commits() -> None:
    for name in HELD_OUT:
        history, queries = labelled(name)
        for query in queries:
            assert query["kind"] == "paraphrase"
            runs = [longest_shared_run(str(query["query"]), history[str(c)]) for c in query["relevant"]]  # type: ignore[attr-defined]
            assert max(runs) <= 2, (name, query["query"])  # never three words in a row of the commit's subject


def test_the_tuning_grid_never_reads_a_held_out_set() -> None:
    tree = ast.parse((ROOT / "bench" / "recall_tuning.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "TUNING" in imported
    assert not {"HELD_OUT", "SETS"} & (imported | names)
    assert not any(isinstance(node, ast.Constant) and node.value in HELD_OUT for node in ast.walk(tree))
