"""Task sets (issue 39): SWE-bench's rows as JSON or JSONL, the test lists in both forms, a bad row named by its line
while the others load, and a written set reading back the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.tasksets import Row, SetFileError, dump_set, load_set, parse_set


def row(n: int = 1, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "instance_id": f"acme__calc-{n}", "repo": "acme/calc", "base_commit": "a" * 40,
        "problem_statement": "f(10) should be 11", "test_patch": "diff --git a/t.py b/t.py\n", "patch": "diff\n",
        "FAIL_TO_PASS": ["t.py::test_fix"], "PASS_TO_PASS": ["t.py::test_ok"],
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def jsonl(*rows: dict[str, Any] | str) -> str:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in rows)


def test_swe_bench_row_with_json_encoded_lists_and_extra_fields_loads() -> None:
    shipped = row(FAIL_TO_PASS=json.dumps(["a::x", "a::y"]), PASS_TO_PASS="[]", version=0.12,
                  created_at="2023-01-01T00:00:00Z", hints_text="", environment_setup_commit="b" * 40)
    loaded = parse_set(jsonl(shipped))
    assert loaded.errors == []
    (only,) = loaded.rows
    assert only.FAIL_TO_PASS == ["a::x", "a::y"]
    assert only.PASS_TO_PASS == []
    assert only.version == "0.12"
    assert only.test_parser == "pytest"
    assert only.setup is None


def test_tasuki_fields_are_kept() -> None:
    loaded = parse_set(jsonl(row(setup="python3 -m venv .venv", test_command="make test T={files}",
                                 test_parser="unittest")))
    (only,) = loaded.rows
    assert (only.setup, only.test_command, only.test_parser) == ("python3 -m venv .venv", "make test T={files}",
                                                                 "unittest")


def test_bad_rows_are_named_by_line_and_reason_and_the_rest_load() -> None:
    text = jsonl(row(1), "{not json", "", row(3, repo="no-slash"), row(4, FAIL_TO_PASS="[]"), row(5),
                 row(6, test_parser="nose"), '["a list"]', row(5), row(9, FAIL_TO_PASS="[broken"),
                 row(10, problem_statement=None))
    loaded = parse_set(text)
    assert [r.instance_id for r in loaded.rows] == ["acme__calc-1", "acme__calc-5"]
    errors = {error.line: (error.instance_id, error.reason) for error in loaded.errors}
    assert sorted(errors) == [2, 4, 5, 7, 8, 9, 10, 11]
    assert errors[2][0] is None
    assert "not JSON" in errors[2][1]
    assert errors[4] == ("acme__calc-3", "repo: 'no-slash' is not owner/name")
    assert "no test to fix" in errors[5][1]
    assert "unknown test parser 'nose'" in errors[7][1]
    assert "JSON object" in errors[8][1]
    assert errors[9] == ("acme__calc-5", "instance_id already on line 6")
    assert "FAIL_TO_PASS: neither a list nor a JSON-encoded list" in errors[10][1]
    assert errors[11] == ("acme__calc-10", "problem_statement: Field required")
    assert str(loaded.errors[1]) == "line 4 (acme__calc-3): repo: 'no-slash' is not owner/name"


def test_json_array_rows_are_named_by_the_line_they_start_on() -> None:
    text = "[\n" + ",\n".join(json.dumps(item, indent=1) for item in [row(1), row(2, base_commit=""), row(3)]) + "\n]\n"
    loaded = parse_set(text)
    assert [r.instance_id for r in loaded.rows] == ["acme__calc-1", "acme__calc-3"]
    (error,) = loaded.errors
    second_start = text.splitlines().index("{", 2) + 1
    assert (error.line, error.instance_id, error.reason) == (second_start, "acme__calc-2",
                                                             "base_commit: must not be empty")


@pytest.mark.parametrize("text", ["[{\"instance_id\": 1", "[{}] trailing", "[{} {}]"])
def test_a_broken_json_array_is_one_error_for_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "set.json"
    path.write_text(text)
    with pytest.raises(SetFileError, match=r"set\.json: "):
        load_set(path)


def test_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_set(tmp_path / "nothing.jsonl")


def test_dump_then_load_gives_the_same_rows(tmp_path: Path) -> None:
    rows = [Row.model_validate(row(1, setup="make env")), Row.model_validate(row(2, patch=None))]
    path = dump_set(rows, tmp_path / "set.jsonl")
    assert load_set(path).rows == rows
    assert "patch" not in json.loads(path.read_text().splitlines()[1])
    array = tmp_path / "set.json"
    array.write_text(json.dumps([r.to_json() for r in rows], indent=2))
    assert load_set(array).rows == rows
