"""Tests for `streambatch.model.documents`: documents, stores and readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import streambatch as sb
from streambatch import DataError, Partition
from streambatch.errors import DuplicateIdError, PartitionError
from streambatch.read.jsonl import read_jsonl, read_records
from tests.strategies import documents


def test_partition_accepts_strings() -> None:
    """'train', 'validation', 'test' parse to the enum; anything else is a DataError."""
    assert Partition.TRAIN is Partition.parse("train")
    assert Partition.TEST is sb.Document("x", "test", [1]).partition
    with pytest.raises(DataError, match="partition='dev' is not one of 'train', 'validation', 'test'"):
        sb.Document("x", "dev", [1])


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1, True], r"token\[1\]=True is not an integer token id"),
        ([1, 2.0], r"token\[1\]=2.0 is not an integer token id"),
        ([1, "2"], r"token\[1\]='2' is not an integer token id"),
        ([-1], r"token\[0\]=-1 is outside \[0, 2\*\*32\)"),
        ([2**32], r"token\[0\]=4294967296 is outside \[0, 2\*\*32\)"),
        ([2**70], r"token\[0\]=1180591620717411303424 is outside"),
        (np.array([1.0]), "dtype float64"),
        (np.array([True]), "dtype bool"),
        ("abc", "is not a sequence"),
    ],
    ids=["bool", "float", "str", "negative", "too-big", "huge", "float-array", "bool-array", "string"],
)
def test_bad_tokens_name_the_document(tokens: object, message: str) -> None:
    """Token ids must be integers in [0, 2**32); bools and floats are not integers."""
    with pytest.raises(DataError, match=r"document id='doc-7'.*" + message):
        sb.Document("doc-7", "train", tokens)


def test_empty_id_is_rejected() -> None:
    """A document needs a non-empty string id."""
    with pytest.raises(DataError, match="id='' must be a non-empty string"):
        sb.Document("", "train", [1, 2])


def test_duplicate_ids_name_both_positions() -> None:
    """The second use of an id is rejected, naming where the first was."""
    docs = [sb.Document("a", "train", [1]), sb.Document("b", "train", [2]), sb.Document("a", "train", [3])]
    with pytest.raises(DuplicateIdError, match="id='a': first at document index 0, repeated at document index 2"):
        sb.DocumentStore.from_documents(docs)


@given(documents())
def test_store_round_trip(docs: list[sb.Document]) -> None:
    """Documents in equal documents out: ids, partitions, tokens; tokens are one flat uint32 array."""
    store = sb.DocumentStore.from_documents(docs)
    assert docs == list(store)
    assert np.uint32 == store.tokens.dtype
    assert sum(len(d) for d in docs) == store.tokens.size


def test_from_arrays_defaults_and_views() -> None:
    """Ids default to '0', '1', ...; partition is one for all or one per document."""
    store = sb.DocumentStore.from_arrays(np.arange(6, dtype=np.uint16), [0, 2, 2, 6], partition=["train", "test", "train"])
    assert store.ids == ("0", "1", "2")
    assert np.uint16 == store.tokens.dtype  # no widening copy
    assert store.select("train").lengths.tolist() == [2, 4]
    assert np.shares_memory(store.select("train").tokens, store.tokens)


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([1, 3], r"offsets\[0\]=1 must be 0"),
        ([0, 4, 2, 6], r"offsets\[2\]=2 is less than offsets\[1\]=4; offsets must be non-decreasing"),
        ([0, 5], r"offsets\[-1\]=5 but there are 6 tokens"),
        ([], "pass a 1-D integer array"),
        ([0.0, 6.0], "pass a 1-D integer array"),
    ],
    ids=["not-zero", "decreasing", "short", "empty", "float"],
)
def test_bad_offsets(offsets: list[float], message: str) -> None:
    """Offsets start at 0, never decrease and end at the token count."""
    with pytest.raises(DataError, match=message):
        sb.DocumentStore.from_arrays(np.arange(6), offsets)


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_read_jsonl_and_keep_one_partition(tmp_path: Path) -> None:
    """The JSONL reader builds a store; partition= keeps one partition."""
    path = _write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"id": "a", "partition": "train", "tokens": [0, 10, 11, 12, 1]},
            "",
            {"id": "v", "partition": "validation", "tokens": [5, 6]},
        ],
    )
    assert read_jsonl(path).ids == ("a", "v")
    assert read_jsonl(path, partition="validation").ids == ("v",)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"id": "a", "partition": "train", "tokens": [1]}', "{oops"], r"docs.jsonl:2: invalid JSON"),
        ([{"id": "a", "partition": "train"}], r"docs.jsonl:1: missing key\(s\) tokens"),
        ([[1, 2]], r"docs.jsonl:1: got list"),
        ([{"id": "a", "partition": "train", "tokens": [1, 2.5]}], r"docs.jsonl:1 \(document id='a'\): token\[1\]=2.5"),
        ([{"id": 3, "partition": "train", "tokens": [1]}], r"docs.jsonl:1: id=3 must be a non-empty string"),
        (
            [{"id": "a", "partition": "train", "tokens": [1]}, {"id": "a", "partition": "train", "tokens": [2]}],
            r"duplicate document id='a': first at .*docs.jsonl:1, repeated at .*docs.jsonl:2",
        ),
    ],
    ids=["json", "missing-key", "not-object", "float-token", "int-id", "duplicate"],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, rows: list[object], message: str) -> None:
    """Every reader error names the file and line number."""
    with pytest.raises(DataError, match=message):
        read_jsonl(_write_jsonl(tmp_path / "docs.jsonl", rows))


def test_missing_file_is_a_data_error(tmp_path: Path) -> None:
    """An unreadable path is a DataError, not an OSError traceback."""
    with pytest.raises(DataError, match="cannot open"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_read_records_from_any_iterable() -> None:
    """Any iterable of dicts works (a dataset's row iterator, a generator)."""
    rows = ({"id": f"r{i}", "partition": "train", "tokens": list(range(i))} for i in range(3))
    store = read_records(rows)
    assert store.lengths.tolist() == [0, 1, 2]


def test_partition_check_names_the_document() -> None:
    """A document outside the epoch's partition is named, with the fix."""
    store = sb.DocumentStore.from_documents([sb.Document("a", "train", [1]), sb.Document("v", "validation", [1])])
    with pytest.raises(
        PartitionError, match=r"id='v' \(document index 1\) is in partition 'validation', not the epoch's 'train'"
    ):
        sb.windows(store, context_length=1)
