"""Task sets in SWE-bench's format, with Tasuki's own optional fields (issue 39).

A set is a JSON array of rows or JSONL, one row a line. A row is SWE-bench's (``instance_id``, ``repo``,
``base_commit``, ``problem_statement``, ``test_patch``, ``patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``; the two test
lists as lists or as the JSON-encoded strings SWE-bench ships) plus Tasuki's ``setup`` (a bash script that builds the
environment in place of the repository's declaration), ``test_command`` (a template with ``{files}``) and
``test_parser``. Other fields (``version``, ``created_at``, ``hints_text`` ...) are read and ignored, so an official
set loads as it is. A bad row is named with its line and the reason; the rest load.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from evals.rundir import EvalError
from sandbox.test_results import PARSERS

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.][A-Za-z0-9_.-]*$")


class Row(BaseModel):
    """One task: a repository at a base commit, the problem, and the tests held back to grade the fix."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str
    repo: str
    """``owner/name``: the forge's repository, and the environment cache's key."""
    base_commit: str
    problem_statement: str
    test_patch: str
    patch: str | None = None
    """The gold patch (optional: a set made to be graded elsewhere may leave it out)."""
    FAIL_TO_PASS: list[str]  # SWE-bench's names, as a row ships
    PASS_TO_PASS: list[str] = []
    setup: str | None = None
    """A bash script that builds the environment (network on), in place of the repository's declaration."""
    test_command: str | None = None
    """The command that runs the test files, ``{files}`` replaced by them; default: the parser's own."""
    test_parser: str = "pytest"
    version: str | None = None

    @field_validator("instance_id", "base_commit", "problem_statement", "test_patch")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("repo")
    @classmethod
    def _owner_name(cls, value: str) -> str:
        if not _REPO.match(value):
            raise ValueError(f"{value!r} is not owner/name")
        return value

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _test_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # SWE-bench ships the lists JSON-encoded
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"neither a list nor a JSON-encoded list ({exc.msg})") from None
        return value

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _some_test_to_fix(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("no test to fix: a row without FAIL_TO_PASS grades nothing")
        return value

    @field_validator("test_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        if value not in PARSERS:
            raise ValueError(f"unknown test parser {value!r} (known: {', '.join(sorted(PARSERS))})")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return None if value is None else str(value)  # SWE-bench's "0.12" sometimes arrives as a number

    def to_json(self) -> dict[str, Any]:
        """The row as a set file holds it: SWE-bench's fields, Tasuki's only when set."""
        return self.model_dump(exclude_none=True)


@dataclass(frozen=True)
class RowError:
    """A row that did not load: where it is in the file, its id when it had one, and why."""

    line: int
    instance_id: str | None
    reason: str

    def __str__(self) -> str:
        named = f" ({self.instance_id})" if self.instance_id else ""
        return f"line {self.line}{named}: {self.reason}"


@dataclass(frozen=True)
class LoadedSet:
    """The rows that loaded, in the file's order, and the ones that did not."""

    rows: list[Row]
    errors: list[RowError]


class SetFileError(EvalError):
    """The file as a whole is no set (a JSON array that does not parse): no row can be named."""


def _reason(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _jsonl_items(text: str) -> Iterator[tuple[int, Any | json.JSONDecodeError]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, exc


def _array_items(text: str) -> Iterator[tuple[int, Any]]:
    """Each element of a JSON array with the line it starts on (so a bad row in an array is named too)."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    whitespace = re.compile(r"\s*")
    while True:
        position = whitespace.match(text, position).end()  # type: ignore[union-attr]
        if text.startswith("]", position):
            if text[position + 1:].strip():
                raise SetFileError(f"text after the array's end (line {text.count(chr(10), 0, position) + 1})")
            return
        line = text.count("\n", 0, position) + 1
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise SetFileError(f"not a JSON array: {exc}") from None
        yield line, item
        position = whitespace.match(text, position).end()  # type: ignore[union-attr]
        if text.startswith(",", position):
            position += 1
        elif not text.startswith("]", position):
            raise SetFileError(f"not a JSON array: ',' or ']' expected at line {text.count(chr(10), 0, position) + 1}")


def parse_set(text: str) -> LoadedSet:
    """The rows of a set's text (a JSON array, else JSONL); duplicate ids after the first are errors."""
    items: Iterable[tuple[int, Any]] = _array_items(text) if text.lstrip().startswith("[") else _jsonl_items(text)
    rows: list[Row] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    for line, item in items:
        if isinstance(item, json.JSONDecodeError):
            errors.append(RowError(line, None, f"not JSON ({item.msg}, column {item.colno})"))
            continue
        if not isinstance(item, dict):
            errors.append(RowError(line, None, f"a row is a JSON object, not {type(item).__name__}"))
            continue
        named = item.get("instance_id") if isinstance(item.get("instance_id"), str) else None
        try:
            row = Row.model_validate(item)
        except ValidationError as exc:
            errors.append(RowError(line, named, _reason(exc)))
            continue
        if row.instance_id in seen:
            errors.append(RowError(line, row.instance_id, f"instance_id already on line {seen[row.instance_id]}"))
            continue
        seen[row.instance_id] = line
        rows.append(row)
    return LoadedSet(rows, errors)


def load_set(path: Path) -> LoadedSet:
    """The rows of a set file; an unreadable file raises OSError, a broken JSON array :class:`SetFileError`."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return parse_set(text)
    except SetFileError as exc:
        raise SetFileError(f"{path}: {exc}") from None


def dump_set(rows: Iterable[Row], path: Path) -> Path:
    """Write ``rows`` as JSONL (the test lists as lists: ``load_set`` reads both forms)."""
    Path(path).write_text("".join(json.dumps(row.to_json(), sort_keys=True) + "\n" for row in rows),
                          encoding="utf-8")
    return Path(path)
