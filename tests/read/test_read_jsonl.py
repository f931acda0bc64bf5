"""Tests for `streambatch.read.jsonl`: lazy readers yield Documents; errors name where."""

from __future__ import annotations

from pathlib import Path

import pytest

import streambatch as sb
from streambatch.read.jsonl import iter_records, read_jsonl, read_records


def test_iter_jsonl_is_lazy(tmp_path: Path) -> None:
    """The reader yields line by line: a bad line later does not stop the first documents."""
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "tokens": [1, 2]}\n\n{"id": "b", "tokens": [3]}\nnot json\n')
    docs = sb.iter_jsonl(path)
    assert [next(docs).id, next(docs).id] == ["a", "b"]
    with pytest.raises(sb.DataError, match=r"docs.jsonl:4: invalid JSON"):
        next(docs)


def test_iter_jsonl_partition_filter_and_defaults(tmp_path: Path) -> None:
    """partition= keeps one partition; id defaults to the line number, partition to train."""
    path = tmp_path / "docs.jsonl"
    path.write_text('{"tokens": [1]}\n{"id": "v", "partition": "validation", "input_ids": [2]}\n')
    assert [(d.id, d.partition.value) for d in sb.iter_jsonl(path)] == [("1", "train"), ("v", "validation")]
    assert [d.id for d in sb.iter_jsonl(path, partition="validation")] == ["v"]
    assert read_jsonl(path).ids == ("1", "v")


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark at the start of a JSONL file is not part of the first record."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "tokens": [1, 2]}\n')
    assert [d.id for d in sb.iter_jsonl(path)] == ["a"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"id": "a"}], r"record 0: missing key\(s\) tokens"),
        ([[1, 2]], "record 0: got list"),
        ([{"tokens": [1.5]}], r"record 0.*token\[0\]=1.5"),
        ([{"tokens": [1]}, {"tokens": [2], "id": "0"}], "duplicate document id='0': first at record 0, repeated at record 1"),
    ],
)
def test_iter_records_errors(rows: list[object], message: str) -> None:
    """Each bad row is named by its row number."""
    with pytest.raises(sb.DataError, match=message):
        read_records(rows)  # type: ignore[arg-type]


def test_iter_records_rejects_what_is_not_rows() -> None:
    """A number or a single dict is not an iterable of rows."""
    for bad in (5, {"tokens": [1]}, "abc"):
        with pytest.raises(sb.ConfigError, match="is not an iterable of rows"):
            iter_records(bad)  # type: ignore[arg-type]


def test_iter_records_hugging_face_rows() -> None:
    """Rows with input_ids (and extra columns) become documents named by their row number."""
    rows = [{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}, {"input_ids": [4]}]
    docs = list(iter_records(rows, default_partition="validation"))
    assert [(d.id, d.partition.value, d.tokens.tolist()) for d in docs] == [
        ("0", "validation", [1, 2, 3]),
        ("1", "validation", [4]),
    ]


def test_iter_text_per_file_and_per_line(tmp_path: Path) -> None:
    """iter_text: one document per file (id relative to the folder) or per non-blank line."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("hi\n\nyo\n")
    (tmp_path / "corpus" / ".hidden").write_text("skip")
    assert [(d.id, d.tokens.tolist()) for d in sb.iter_text(tmp_path / "corpus")] == [("a.txt", list(b"hi\n\nyo\n"))]
    lines = sb.iter_text([tmp_path / "corpus"], per_line=True, tokenizer=lambda s: [len(s)])
    assert [(d.id, d.tokens.tolist()) for d in lines] == [("a.txt:1", [2]), ("a.txt:3", [2])]


def test_iter_text_reports_a_failing_tokenizer(tmp_path: Path) -> None:
    """A tokenizer that raises is reported with the file it failed on."""
    (tmp_path / "a.txt").write_text("x")

    def broken(text: str) -> list[int]:
        raise RuntimeError("boom")

    with pytest.raises(sb.DataError, match=r"a.txt.*: the tokenizer raised RuntimeError: boom"):
        list(sb.iter_text(tmp_path / "a.txt", tokenizer=broken))
