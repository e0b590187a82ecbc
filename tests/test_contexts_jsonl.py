"""JSONL files: torn last lines, reading backwards in blocks, gzip, and the round trip through a context."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contexts import ContextStore, CorruptRecordError, jsonl
from contexts.masking import mask
from contexts.retention import gzip_context
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)
from tests.helpers.schemas import validate_context_dir

# Secrets as they appear in real output, and the part of each that must never reach a file.
SECRETS = [
    ("ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "A1b2C3d4E5f6G7h8I9j0"),
    ("github_pat_11ABCDEFG0123456789abc_" + "x" * 59, "11ABCDEFG0123456789abc"),
    ("sk-proj-" + "Zy9" * 15, "Zy9Zy9Zy9Zy9"),
    ("glpat-" + "Q" * 20, "QQQQQQQQQQQQQQQQ"),
    ("https://bob:hunter2-secret@git.example.com/o/r.git", "hunter2-secret"),
    ("alice.smith@example.co.jp", "alice.smith"),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "b3BlbnNzaC1rZXktdjEAAAAA",
    ),
]
SEPARATORS = [" ", "\n", "=", ": ", '"', "'", "(", ")", ",", "\t"]

text_with_secrets = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.text(alphabet="日本語のテキスト。改行\n", max_size=20),
        st.sampled_from([s for s, _ in SECRETS]),
    ),
    max_size=5,
).flatmap(lambda parts: st.sampled_from(SEPARATORS).map(lambda sep: sep + sep.join(parts) + sep))


def write_records(path: Path, contents: list[str], **writer: Any) -> jsonl.JsonlWriter:
    out = jsonl.JsonlWriter(path, **writer)
    for content in contents:
        out.append({"role": "user", "content": content})
    return out


def test_torn_last_line_is_ignored_by_readers_and_cut_on_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    write_records(path, ["one", "two", "three"]).close()
    whole = path.stat().st_size
    with open(path, "ab") as handle:
        handle.write(b'{"seq":4,"role":"assistant","content":"half a li')

    assert [r["seq"] for r in jsonl.iter_records(path)] == [1, 2, 3]
    assert [r["seq"] for r in jsonl.iter_records_reversed(path)] == [3, 2, 1]
    assert jsonl.last_record(path)["seq"] == 3  # type: ignore[index]
    assert [r["seq"] for r in jsonl.read_head(path, 10)] == [1, 2, 3]

    writer = jsonl.JsonlWriter(path)  # a resumed writer
    assert writer.last_id == 3
    assert path.stat().st_size == whole
    assert writer.append({"role": "assistant", "content": "whole again"}) == 4
    writer.close()
    assert path.read_bytes().endswith(b"\n")
    assert [r["seq"] for r in jsonl.iter_records(path)] == [1, 2, 3, 4]


def test_a_complete_record_missing_only_its_newline_counts_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    write_records(path, ["one"]).close()
    with open(path, "ab") as handle:
        handle.write(json.dumps({"seq": 2, "role": "user", "content": "no newline"}).encode())

    assert [r["seq"] for r in jsonl.iter_records(path)] == [1]
    assert [r["seq"] for r in jsonl.iter_records_reversed(path)] == [1]
    writer = jsonl.JsonlWriter(path)
    assert writer.append({"role": "user", "content": "again"}) == 2
    writer.close()
    assert [r["content"] for r in jsonl.iter_records(path)] == ["one", "again"]


def test_a_file_holding_only_a_torn_line_reads_empty_and_restarts_at_one(tmp_path: Path) -> None:
    path = tmp_path / "tools.jsonl"
    path.write_bytes(b'{"seq":1,"tool_na')
    assert list(jsonl.iter_records(path)) == []
    assert list(jsonl.iter_records_reversed(path)) == []
    assert jsonl.last_record(path) is None
    writer = jsonl.JsonlWriter(path)
    assert (writer.last_id, path.stat().st_size) == (0, 0)
    assert writer.append({"tool_name": "bash"}) == 1
    writer.close()


def test_a_corrupt_line_before_the_last_is_an_error_not_silently_skipped(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    path.write_bytes(b'{"seq":1}\n{"seq":2, oops\n{"seq":3}\n')
    with pytest.raises(CorruptRecordError):
        list(jsonl.iter_records(path))
    with pytest.raises(CorruptRecordError):
        list(jsonl.iter_records_reversed(path))


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    assert list(jsonl.iter_records(tmp_path / "nothing.jsonl")) == []
    assert list(jsonl.iter_records_reversed(tmp_path / "nothing.jsonl")) == []
    assert jsonl.last_record(tmp_path / "nothing.jsonl") is None


def test_reading_backwards_handles_lines_bigger_than_a_block_and_many_blocks(tmp_path: Path) -> None:
    block = 64 * 1024
    sizes = [1, block * 3 + 17, 5, block - 40, block, block + 1, 200_000, 0, 3] + [90] * 3000
    path = tmp_path / "messages.jsonl"
    write_records(path, ["é" * (n // 2) + "x" * (n % 2) for n in sizes]).close()
    assert path.stat().st_size > 14 * block

    forward = list(jsonl.iter_records(path))
    backward = list(jsonl.iter_records_reversed(path))

    assert backward == forward[::-1]
    assert [r["seq"] for r in forward] == list(range(1, len(sizes) + 1))
    assert jsonl.last_record(path) == forward[-1]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=120), max_size=30),
    block=st.integers(min_value=1, max_value=64),
    torn=st.binary(max_size=30).filter(lambda b: b"\n" not in b),
)
def test_reading_backwards_equals_reading_forwards_for_any_block_size(
    sizes: list[int], block: int, torn: bytes
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "messages.jsonl"
        write_records(path, ["ü" * n for n in sizes]).close()
        with open(path, "ab") as handle:
            handle.write(torn)
        forward = list(jsonl.iter_records(path))
        with mock.patch.object(jsonl, "_BLOCK", block):
            backward = list(jsonl.iter_records_reversed(path))
            writer = jsonl.JsonlWriter(path)
            writer.close()
        assert backward == forward[::-1]
        assert writer.last_id == len(sizes)
        assert [r["seq"] for r in forward] == list(range(1, len(sizes) + 1))


def test_gzipped_files_read_transparently(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, fsync="never")
    ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
    for n in range(50):
        ctx.append_message("user" if n % 2 else "assistant", f"message {n} " + "z" * n)
    ctx.append_tool("bash", {"command": "ls"}, "success", 2, result="a\nb")
    path = ctx.finish("completed")
    plain = list(jsonl.iter_records(path / "messages.jsonl"))

    gzip_context(path)

    assert not (path / "messages.jsonl").exists()
    assert (path / "messages.jsonl.gz").exists()
    assert list(jsonl.iter_records(path / "messages.jsonl")) == plain
    assert list(jsonl.iter_records_reversed(path / "messages.jsonl")) == plain[::-1]
    assert jsonl.last_record(path / "messages.jsonl") == plain[-1]
    assert jsonl.read_head(path / "messages.jsonl", 2) == plain[:2]
    assert jsonl.last_record(path / "tools.jsonl")["result"] == "a\nb"  # type: ignore[index]
    assert validate_context_dir(path) == {"messages.jsonl": 50, "summaries.jsonl": 0, "tools.jsonl": 1}


Op = tuple[str, str]
operations = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["user", "assistant"]), text_with_secrets),
        st.tuples(st.just("tool"), text_with_secrets),
        st.tuples(st.just("tear"), st.sampled_from(["messages.jsonl", "tools.jsonl"])),
        st.tuples(st.just("resume"), st.just("")),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_round_trip_masks_secrets_and_keeps_seq_continuous_across_torn_lines_and_resumes(ops: list[Op]) -> None:
    base = Path(tempfile.mkdtemp())
    try:
        store = ContextStore(base, fsync="never")
        ctx = store.create(TASK_KEY, CONFIG, heartbeat=False)
        messages: list[tuple[str, str]] = []
        tools: list[str] = []
        resumes = 0
        for kind, text in ops:
            if kind in ("user", "assistant"):
                assert ctx.append_message(kind, text) == len(messages) + 1
                messages.append((kind, mask(text)))
            elif kind == "tool":
                assert ctx.append_tool("bash", {"command": text}, "success", 1, result=text) == len(tools) + 1
                tools.append(mask(text))
            else:
                ctx.release()
                if kind == "tear":  # a crash mid-write: part of one more line
                    with open(ctx.path / text, "ab") as handle:
                        handle.write(b'{"seq":999,"role":"user","content":"' + b"torn" * len(messages))
                    assert [r["seq"] for r in jsonl.iter_records(ctx.path / text)] == list(
                        range(1, (len(messages) if text == "messages.jsonl" else len(tools)) + 1)
                    )
                ctx = store.open(ctx.uuid, heartbeat=False)
                resumes += 1
        ctx.release()

        read = list(jsonl.iter_records(ctx.path / "messages.jsonl"))
        assert [(r["seq"], r["role"], r["content"]) for r in read] == [
            (n, role, content) for n, (role, content) in enumerate(messages, 1)
        ]
        read_tools = list(jsonl.iter_records(ctx.path / "tools.jsonl"))
        assert [(r["seq"], r["result"], r["arguments"]["command"]) for r in read_tools] == [
            (n, text, text) for n, text in enumerate(tools, 1)
        ]
        assert ctx.read_state()["attempt"] == 1 + resumes
        validate_context_dir(ctx.path)
        on_disk = b"".join(p.read_bytes() for p in ctx.path.iterdir() if p.is_file())
        for _secret, fragment in SECRETS:
            assert fragment.encode() not in on_disk
    finally:
        shutil.rmtree(base)


def test_records_are_written_one_line_per_record_with_unicode_kept(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    write_records(path, ["日本語\nの改行", "\u2028 line separator", 'quote " and \\']).close()
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 4
    assert lines[-1] == b""
    assert "日本語".encode() in lines[0]
    assert [r["content"] for r in jsonl.iter_records(path)] == [
        "日本語\nの改行",
        "\u2028 line separator",
        'quote " and \\',
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(st.text(max_size=40), min_size=0, max_size=60),
    first=st.integers(min_value=-2, max_value=70),
    torn=st.binary(max_size=12).filter(lambda b: b"\n" not in b),
    block=st.sampled_from([1, 7, 64, 64 * 1024]),
)
def test_reading_from_an_id_finds_exactly_the_records_a_full_scan_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, texts: list[str], first: int, torn: bytes, block: int
) -> None:
    monkeypatch.setattr(jsonl, "_BLOCK", block)  # small blocks make even a short file a real binary search
    path = tmp_path / f"from-id-{uuid.uuid4().hex}.jsonl"
    writer = jsonl.JsonlWriter(path, fsync="never")
    for text in texts:
        writer.append({"text": text})
    writer.close()
    with path.open("ab") as handle:
        handle.write(torn)  # a crash mid-write: readers ignore it

    expected = [r for r in jsonl.iter_records(path) if r["seq"] >= first]

    assert list(jsonl.iter_from_id(path, first)) == expected
