"""Bounded, checked JSON: deep nesting and huge integers are refused quickly, in every decoder and file kind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.io.bounded_json import decode_json, decode_record, decode_string
from streambatch.read.jsonl import read_jsonl

from .hostile import DEEP, HUGE_INT


def test_msgspec_bounds_huge_integers_and_deep_nesting() -> None:
    """The two inputs that crash the stdlib decoder come back from _json as DataError with where and path."""
    with pytest.raises(sb.DataError, match=r"f:1: invalid JSON value at \$\.tokens\[0\] \(Integer value out of range\)"):
        decode_record(b'{"id": "a", "partition": "train", "tokens": [' + HUGE_INT + b"]}", "f:1")
    with pytest.raises(sb.DataError, match=r"f:2: invalid JSON \(nested too deeply\)"):
        decode_record(b'{"id": "a", "tokens": ' + DEEP + b"}", "f:2")
    with pytest.raises(StoreError, match=r"h: invalid JSON \(nested too deeply\); the header must be valid JSON"):
        decode_json(DEEP, "h", "the header", error=StoreError)
    with pytest.raises(sb.DataError, match=r"invalid JSON value at \$ \(Integer value out of range\)"):
        decode_json(b"-" + HUGE_INT, "h", "the header")
    with pytest.raises(sb.DataError, match=r"ids:3: invalid JSON value at \$ \(Expected `str`, got `int`\)"):
        decode_string(b"3", "ids:3", "a document id")


def test_jsonl_byte_order_mark_and_input_ids(tmp_path: Path) -> None:
    """A UTF-8 BOM at the start of a JSONL file is accepted; Hugging Face rows' input_ids stand in for tokens."""
    path = tmp_path / "docs.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"id": "a", "partition": "train", "tokens": [1, 2]}\n'
        b'{"id": "b", "partition": "train", "input_ids": [3], "attention_mask": [1], "text": "x"}\n'
    )
    store = read_jsonl(path)
    assert ("a", "b") == store.ids
    assert [3] == store.document(1).tokens.tolist()


def test_time_budget_sanity() -> None:
    """The hostile inputs above are refused quickly (bounded work, no quadratic blow-up)."""
    start = time.perf_counter()
    for _ in range(20):
        with pytest.raises(sb.DataError, match=r"x: invalid JSON \(nested too deeply\)"):
            decode_record(b'{"tokens": ' + DEEP + b"}", "x")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"format": "streambatch.corpus", "version": 1, "shards": [' + "9" * 5000 + "]}",
        "\xff",
    ],
    ids=["deep", "huge-int", "not-utf8"],
)
def test_hostile_corpus_manifest_is_a_store_error(tmp_path: Path, text: str) -> None:
    """A corpus manifest goes through the bounded JSON decoder too: a StoreError, never a RecursionError or ValueError."""
    path = tmp_path / "corpus.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff")
    with pytest.raises(StoreError, match=r"corpus\.json"):
        sb.open_corpus(path)


def test_hostile_plan_header_is_a_store_error(tmp_path: Path) -> None:
    """A plan file whose header is deeply nested JSON is refused as a StoreError."""
    from streambatch.order.plan import open_plan

    path = tmp_path / "x.plan"
    path.write_bytes(b"[" * 2000 + b"]" * 2000 + b" " * 96)
    with pytest.raises(StoreError, match=r"x\.plan"):
        open_plan(path, {})
