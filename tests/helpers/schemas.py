"""Validation of context directories against the project's own JSON schemas (``contexts/schemas``).

Format checking is on: ``date-time`` and ``uuid`` are checked.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]

from contexts.schemas import load_schema

JSONL_SCHEMAS = {
    "messages.jsonl": ("message", "seq"),
    "summaries.jsonl": ("summary", "summary_id"),
    "tools.jsonl": ("tool", "seq"),
}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _rfc3339_date_time(instance: object) -> bool:
    if not isinstance(instance, str):
        return True  # formats only constrain strings; the type keyword handles the rest
    if not _RFC3339.match(instance):
        return False
    datetime.fromisoformat(instance.upper().replace("Z", "+00:00"))  # ValueError on 2024-02-30 etc.
    return True


@cache
def format_checker() -> FormatChecker:
    """Draft 2020-12's format checker; ``date-time`` is added when ``rfc3339-validator`` is not installed.

    jsonschema silently skips formats whose checker library is missing, which would let any string
    pass as a timestamp.
    """
    checker = Draft202012Validator.FORMAT_CHECKER
    if "date-time" in checker.checkers:
        return checker
    checker = copy.copy(checker)
    checker.checkers = dict(checker.checkers)
    checker.checks("date-time", raises=ValueError)(_rfc3339_date_time)
    return checker


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator of ``{name}.schema.json`` (``message``, ``state``, ``lock``...)."""
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=format_checker())


def validate_record(name: str, record: Any, where: str = "") -> None:
    """Raise ``AssertionError`` listing every schema violation of ``record``."""
    errors = sorted(validator(name).iter_errors(record), key=lambda e: list(e.absolute_path))
    if errors:
        detail = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)
        raise AssertionError(f"{where or name} violates {name}.schema.json: {detail}")


def read_jsonl_lines(path: Path, *, allow_torn_tail: bool = False) -> list[dict[str, Any]]:
    """Every line of a ``.jsonl`` or ``.jsonl.gz`` file, parsed strictly (a torn tail only if allowed)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a torn line
    if tail and not allow_torn_tail:
        raise AssertionError(f"{path}: torn last line {tail[:60]!r}")
    records = []
    for number, line in enumerate(lines, 1):
        record = json.loads(line)
        if not isinstance(record, dict):
            raise AssertionError(f"{path}: line {number} is not an object")
        records.append(record)
    return records


def validate_context_dir(path: Path, *, allow_torn_tail: bool = False) -> dict[str, int]:
    """Validate a context directory's files against the schemas and SPEC §3 rule 2 (ids 1, 2, 3...).

    Checks ``metadata.json``, ``state.json``, every line of the three JSONL files (plain or gzipped) and
    ``.lock`` when present.  Returns the number of records per JSONL file name (without ``.gz``).
    """
    path = Path(path)
    metadata = json.loads((path / "metadata.json").read_text(encoding="utf-8"))
    validate_record("metadata", metadata, f"{path}/metadata.json")
    if metadata["uuid"] != path.name:
        raise AssertionError(f"{path}: metadata uuid {metadata['uuid']} differs from the directory name")
    validate_record("state", json.loads((path / "state.json").read_text(encoding="utf-8")), f"{path}/state.json")
    lock = path / ".lock"
    if lock.exists():
        validate_record("lock", json.loads(lock.read_text(encoding="utf-8")), f"{path}/.lock")
    counts = {}
    for name, (schema, id_field) in JSONL_SCHEMAS.items():
        plain, zipped = path / name, path / f"{name}.gz"
        source = plain if plain.exists() else zipped
        if not source.exists():
            raise AssertionError(f"{path}: neither {name} nor {name}.gz exists")
        records = read_jsonl_lines(source, allow_torn_tail=allow_torn_tail)
        for number, record in enumerate(records, 1):
            validate_record(schema, record, f"{source} line {number}")
        ids = [record[id_field] for record in records]
        if ids != list(range(1, len(ids) + 1)):
            raise AssertionError(f"{source}: {id_field} is not 1..{len(ids)}: {ids[:20]}")
        counts[name] = len(records)
    return counts
