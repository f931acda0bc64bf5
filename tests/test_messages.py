"""Messages and formats (issue 18, item 6): inspect names a manifest as one, dictionary-encoded Parquet text is read.

Each through the API and the command line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.read.columns.parquet import iter_parquet
from streambatch.tools.inspect import format_summary, inspect_source

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # the arrow extra: only the Parquet tests need it
    pa = pq = None

needs_arrow = pytest.mark.skipif(pa is None, reason="pyarrow is not installed (the arrow extra)")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    docs = [sb.Document("a", "train", [0, 10, 11, 12, 1]), sb.Document("b", "train", [0, 20, 21, 1])]
    sb.write_store(tmp_path / "s0", docs[:1])
    sb.write_store(tmp_path / "s1", docs[1:])
    sb.write_corpus(tmp_path / "corpus.json", [tmp_path / "s0", tmp_path / "s1"])
    return tmp_path / "corpus.json"


def test_inspect_names_a_manifest_a_manifest(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inspect corpus.json` says corpus manifest (and how many stores), never "JSONL file"."""
    summary = inspect_source(sb.open_source(corpus))
    assert summary["kind"] == "corpus"
    assert len(summary["shards"]) == 2
    assert f"{corpus} (corpus manifest of 2 stores, memory-mapped)" in format_summary(summary)
    status, out, _ = run(["inspect", str(corpus)], capsys)
    assert status == 0
    assert out.splitlines()[0].split(None, 1) == ["source", f"{corpus} (corpus manifest of 2 stores, memory-mapped)"]
    assert "JSONL" not in out
    status, out, _ = run(["inspect", str(corpus), "--json"], capsys)
    assert json.loads(out)["kind"] == "corpus"


def test_inspect_names_stores_and_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store directory and a JSONL file keep their own words."""
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"id": "a", "tokens": [1, 2, 3]}\n')
    sb.write_store(tmp_path / "store", [sb.Document("a", "train", [1, 2, 3])])
    assert run(["inspect", str(jsonl)], capsys)[1].splitlines()[0].endswith("(JSONL file, read into memory)")
    assert run(["inspect", str(tmp_path / "store")], capsys)[1].splitlines()[0].endswith("(store directory, memory-mapped)")


def _dictionary_table() -> Any:
    texts = pa.chunked_array(
        [pa.array(["hello", "world", "hello"]).dictionary_encode(), pa.array(["world", "again"]).dictionary_encode()]
    )
    ids = pa.array(["d0", "d1", "d2", "d3", "d4"]).dictionary_encode()
    parts = pa.array(["train", "train", "test", "train", "validation"]).dictionary_encode()
    return pa.table({"id": ids, "text": texts, "partition": parts})


@needs_arrow
def test_dictionary_encoded_parquet_text_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dictionary-encoded text, id and partition columns (what Parquet writes for repeated values) read as their values."""
    path = tmp_path / "dict.parquet"
    table = _dictionary_table()
    pq.write_table(table, path)
    assert pa.types.is_dictionary(pq.read_table(path).schema.field("text").type)
    plain = tmp_path / "plain.parquet"
    pq.write_table(table.cast(pa.schema([("id", pa.string()), ("text", pa.string()), ("partition", pa.string())])), plain)
    assert not pa.types.is_dictionary(pq.read_table(plain).schema.field("text").type)
    docs = list(iter_parquet(path))
    assert docs == list(iter_parquet(plain))
    assert [(d.id, d.partition.value, bytes(d.tokens.astype("uint8")).decode()) for d in docs] == [
        ("d0", "train", "hello"),
        ("d1", "train", "world"),
        ("d2", "test", "hello"),
        ("d3", "train", "world"),
        ("d4", "validation", "again"),
    ]
    store = tmp_path / "store"
    status, _, err = run(["prepare", str(path), "-o", str(store), "--eos-id", "none", "--bos-id", "none", "--quiet"], capsys)
    assert (status, err) == (0, "")
    written = sb.open_store(store)
    assert [written.document(i) for i in range(len(written))] == docs


@needs_arrow
def test_a_null_in_a_dictionary_column_is_still_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Decoding keeps nulls: a null text row is refused, naming the file and row (API and CLI, exit 2)."""
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": pa.array(["a", None]).dictionary_encode()}), nulls)
    with pytest.raises(sb.DataError, match=r"nulls\.parquet row 1: text is null"):
        list(iter_parquet(nulls))
    status, out, err = run(["prepare", str(nulls), "-o", str(tmp_path / "store"), "--quiet"], capsys)
    assert (status, out) == (2, "")
    assert "nulls.parquet row 1: text is null" in err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("tokens", ["{}", '{"1": 2}', '"abc"'])
def test_a_mapping_is_no_token_list_on_the_command_line(tokens: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSONL `tokens` holding an object (or a string) is refused by `prepare` and `epoch`, naming file:line; no store."""
    path = tmp_path / "docs.jsonl"
    path.write_text(f'{{"id": "a", "tokens": [1, 2, 3]}}\n{{"id": "b", "tokens": {tokens}}}\n')
    with pytest.raises(sb.DataError, match=r"docs\.jsonl:2"):
        list(sb.iter_jsonl(path))
    status, out, err = run(["prepare", str(path), "-o", str(tmp_path / "store")], capsys)
    assert (status, out) == (2, "")
    assert f"{path}:2" in err
    assert not (tmp_path / "store").exists()
    status, out, err = run(["epoch", str(path), "-T", "1", "-B", "1", "--seed", "7"], capsys)
    assert (status, out) == (2, "")
    assert f"{path}:2" in err
