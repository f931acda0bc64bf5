"""Tests for the format readers (one module each): every file format, compressed inputs, dispatch by suffix, read errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.prepare import iter_files
from streambatch.read import bin as bin_format
from streambatch.read import inputs as _inputs
from streambatch.read.bin import iter_bin
from streambatch.read.columns.arrow import iter_arrow
from streambatch.read.columns.hf import iter_hf
from streambatch.read.columns.parquet import iter_parquet
from streambatch.read.npy import iter_npy
from streambatch.read.select import format_of
from streambatch.read.text.byte_tokens import byte_detokenize
from streambatch.read.text.tokenizers import ByteTokenizer

TEXT = "héllo world\r\nsecond line\n\n  \nlast line without newline"


def _compress(data: bytes, codec: str) -> bytes:
    if codec == "gz":
        return gzip.compress(data)
    if codec == "zst":
        zstandard = pytest.importorskip("zstandard")
        return bytes(zstandard.ZstdCompressor().compress(data))
    return data


def _ids_tokens(docs: Any) -> list[tuple[str, list[int]]]:
    return [(d.id, d.tokens.tolist()) for d in docs]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("DOCS.JSONL", "jsonl"),
        ("docs.NDJSON.GZ", "jsonl"),
        ("docs.jsonl.zst", "jsonl"),
        ("notes.txt", "text"),
        ("notes.TXT.ZST", "text"),
        ("README", "text"),
        ("data.json", "text"),
        ("part.Parquet", "parquet"),
        ("part.arrow", "arrow"),
        ("part.feather", "arrow"),
        ("t.npy", "npy"),
        ("t.offsets.npy", "offsets"),
        ("train.BIN", "bin"),
        ("t.npy.gz", "unsupported"),
        ("p.parquet.zst", "unsupported"),
    ],
)
def test_format_by_suffix(name: str, kind: str) -> None:
    """Suffixes decide the format in any case; .gz/.zst are looked through; token files never fall back to text."""
    assert kind == format_of(name)


@pytest.mark.parametrize("codec", ["", "gz", "zst"])
def test_text_plain_and_compressed(tmp_path: Path, codec: str) -> None:
    """Text files read the same compressed or not: per file, and per non-blank line (lines end at \\n)."""
    name = "notes.txt" + (f".{codec}" if codec else "")
    (tmp_path / name).write_bytes(_compress(TEXT.encode(), codec))
    (whole,) = sb.iter_text(tmp_path / name)
    assert TEXT == byte_detokenize(whole.tokens)
    lines = [(d.id, byte_detokenize(d.tokens)) for d in sb.iter_text(tmp_path / name, per_line=True)]
    expected = [("héllo world", 1), ("second line", 2), ("last line without newline", 5)]
    assert [(f"{tmp_path / name}:{n}", text) for text, n in expected] == lines


@pytest.mark.parametrize("codec", ["", "gz", "zst"])
def test_jsonl_plain_and_compressed(tmp_path: Path, codec: str) -> None:
    """JSONL token documents read the same compressed or not, through iter_jsonl and iter_files."""
    rows = [{"id": "a", "tokens": [1, 2, 3]}, {"input_ids": [4], "partition": "test"}]
    name = "docs.ndjson" + (f".{codec}" if codec else "")
    (tmp_path / name).write_bytes(_compress("".join(json.dumps(r) + "\n" for r in rows).encode(), codec))
    assert [("a", [1, 2, 3]), ("2", [4])] == _ids_tokens(sb.iter_jsonl(tmp_path / name))
    docs = list(iter_files([tmp_path]))
    assert [("a", [1, 2, 3]), (f"{name}:2", [4])] == _ids_tokens(docs)
    assert [sb.Partition.TRAIN, sb.Partition.TEST] == [d.partition for d in docs]


def test_jsonl_text_rows_are_tokenized(tmp_path: Path) -> None:
    """A JSONL row without tokens but with text (or --column) is tokenized, with eos; tokens rows stay as they are."""
    (tmp_path / "mix.jsonl").write_text('{"text": "hi"}\n{"tokens": [7]}\n')
    (tmp_path / "other.jsonl").write_text('{"body": "yo", "id": "b"}\n')
    assert [("mix.jsonl:1", [104, 105, 0]), ("mix.jsonl:2", [7])] == _ids_tokens(iter_files([tmp_path], eos_id=0, exclude=["o*"]))
    assert [("b", [121, 111])] == _ids_tokens(iter_files([tmp_path / "other.jsonl"], column="body"))
    with pytest.raises(sb.DataError, match=r"other.jsonl:1: missing key\(s\) tokens; .* or 'text' text to tokenize"):
        list(iter_files([tmp_path]))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30)
@given(st.lists(st.text(alphabet="ab é\r\n", max_size=12), max_size=12), st.integers(1, 40))
def test_line_chunks_change_nothing(tmp_path_factory: pytest.TempPathFactory, lines: list[str], chunk: int) -> None:
    """Reading lines in chunks of any size gives the same documents, ids and line numbers as one chunk."""
    folder = tmp_path_factory.mktemp("chunks")
    (folder / "t.txt").write_text("\n".join(lines), encoding="utf-8", newline="")
    (folder / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" if t.strip() else "\n" for t in lines))
    whole = list(iter_files([folder], per_line=True))
    saved = _inputs.LINE_CHUNK_BYTES
    _inputs.LINE_CHUNK_BYTES = chunk
    try:
        assert whole == list(iter_files([folder], per_line=True))
    finally:
        _inputs.LINE_CHUNK_BYTES = saved


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gzip.compress(b"line one\nline two\n" * 50)[:-9], r"cannot read \(Compressed file ended before"),
        (b"plain text, not gzip", r"cannot read \(Not a gzipped file"),
    ],
    ids=["truncated", "not-gzip"],
)
def test_broken_gzip_is_a_data_error(tmp_path: Path, data: bytes, message: str) -> None:
    """A damaged .gz is a DataError naming the file (so --skip-bad can leave it out)."""
    (tmp_path / "x.txt.gz").write_bytes(data)
    with pytest.raises(sb.DataError, match=r"x.txt.gz: " + message):
        list(sb.iter_text(tmp_path / "x.txt.gz"))


def test_broken_zstd_is_a_data_error(tmp_path: Path) -> None:
    """A truncated .zst (even one whose last frame is cut) is a DataError, not silently short."""
    data = _compress(b"a" * 1000 + b"\n", "zst") + _compress(b"second frame\n" * 100, "zst")
    (tmp_path / "x.txt.zst").write_bytes(data)
    assert [2301] == [len(d) for d in sb.iter_text(tmp_path / "x.txt.zst")]
    (tmp_path / "x.txt.zst").write_bytes(data[:-5])
    with pytest.raises(sb.DataError, match=r"x.txt.zst: cannot read \(compressed file ended"):
        list(sb.iter_text(tmp_path / "x.txt.zst"))
    (tmp_path / "y.txt.zst").write_bytes(b"garbage" * 10)
    with pytest.raises(sb.DataError, match=r"y.txt.zst: cannot read"):
        list(sb.iter_text(tmp_path / "y.txt.zst"))


def test_npy_one_document_or_split_by_offsets(tmp_path: Path) -> None:
    """A .npy is one document, or one per span of its X.offsets.npy; the offsets file is no input of its own."""
    np.save(tmp_path / "one.npy", np.array([3, 1, 4], dtype=np.int64))
    np.save(tmp_path / "many.npy", np.arange(6, dtype=np.uint32))
    np.save(tmp_path / "many.offsets.npy", np.array([0, 2, 2, 6]))
    assert [("one.npy", [3, 1, 4])] == _ids_tokens(iter_npy(tmp_path / "one.npy"))
    expected = [("many.npy:0", [0, 1]), ("many.npy:1", []), ("many.npy:2", [2, 3, 4, 5]), ("one.npy", [3, 1, 4])]
    assert expected == _ids_tokens(iter_files([tmp_path]))


@pytest.mark.parametrize(
    ("tokens", "offsets", "message"),
    [
        (np.array([1, -2]), None, r"token\[1\]=-2 is outside \[0, 2\*\*32\)"),
        (np.array([[1, 2]]), None, r"shape \(1, 2\); a token file must be a 1-D integer array"),
        (np.array([1.5]), None, r"float64 array .* must be a 1-D integer array"),
        (np.arange(4), np.array([0, 3, 2, 4]), r"t.offsets.npy: offsets\[2\]=2 is less than offsets\[1\]=3"),
        (np.arange(4), np.array([0, 5]), r"t.offsets.npy: offsets\[1\]=5 is outside \[0, 4\]"),
    ],
    ids=["negative", "2-d", "float", "falling-offsets", "offsets-beyond"],
)
def test_bad_npy(tmp_path: Path, tokens: Any, offsets: Any, message: str) -> None:
    """Bad token arrays and offsets are DataErrors naming the file (and document)."""
    np.save(tmp_path / "t.npy", tokens)
    if offsets is not None:
        np.save(tmp_path / "t.offsets.npy", offsets)
    with pytest.raises(sb.DataError, match=message):
        list(iter_npy(tmp_path / "t.npy"))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 9))
def test_bin_documents_rejoin_the_file(tmp_path: Path, tokens: list[int], block: int) -> None:
    """.bin documents end at each separator (kept), rejoin the file exactly, whatever the scan block size."""
    np.array(tokens, dtype="<u2").tofile(tmp_path / "t.bin")
    saved = bin_format.BLOCK_TOKENS
    bin_format.BLOCK_TOKENS = block
    try:
        docs = list(iter_bin(tmp_path / "t.bin", separator=0))
    finally:
        bin_format.BLOCK_TOKENS = saved
    assert tokens == [t for d in docs for t in d.tokens.tolist()]
    assert all(d.tokens.tolist().count(0) == 1 and d.tokens[-1] == 0 for d in docs[:-1])
    assert [f"t.bin:{k}" for k in range(len(docs))] == [d.id for d in docs]
    assert not docs or docs[-1].tokens.tolist().count(0) == (tokens[-1] == 0)


def test_bin_uint32_and_errors(tmp_path: Path) -> None:
    """--bin-dtype uint32 reads wide ids; an odd-sized file and a missing separator are errors."""
    np.array([70000, 9, 70000], dtype="<u4").tofile(tmp_path / "w.bin")
    assert [("w.bin:0", [70000, 9])] == _ids_tokens(iter_bin(tmp_path / "w.bin", separator=9, dtype="uint32"))[:1]
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(sb.DataError, match=r"odd.bin: 3 bytes is not a whole number of uint16 tokens"):
        list(iter_bin(tmp_path / "odd.bin", separator=0))
    with pytest.raises(sb.ConfigError, match=r"bin_separator=70000 must be a token id that fits uint16"):
        iter_bin(tmp_path / "w.bin", separator=70000)
    with pytest.raises(sb.ConfigError, match=r"w.bin: .bin files are split at a separator token, and none is set"):
        list(iter_files([tmp_path / "w.bin"]))


def _table(pa: Any, **columns: Any) -> Any:
    return pa.table(columns)


def test_parquet_token_and_text_columns(tmp_path: Path) -> None:
    """Parquet rows: a token-list column as is, a text column tokenized; id/partition columns used; --column picks."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(
        _table(pa, input_ids=[[1, 2], [], [3]], id=[10, 11, 12], partition=["train", "test", "train"], text=["x", "y", "z"]),
        tmp_path / "tokens.parquet",
        row_group_size=2,
    )
    pq.write_table(_table(pa, body=["hi", "yo"]), tmp_path / "text.parquet")
    docs = list(iter_parquet(tmp_path / "tokens.parquet"))
    assert [("10", [1, 2]), ("11", []), ("12", [3])] == _ids_tokens(docs)
    assert [sb.Partition.TRAIN, sb.Partition.TEST, sb.Partition.TRAIN] == [d.partition for d in docs]
    assert [("10", [120, 0])] == _ids_tokens(
        iter_parquet(tmp_path / "tokens.parquet", column="text", tokenizer=ByteTokenizer(eos_id=0))
    )[:1]
    assert [("text.parquet:0", [104, 105]), ("text.parquet:1", [121, 111])] == _ids_tokens(
        iter_parquet(tmp_path / "text.parquet", column="body")
    )
    with pytest.raises(
        sb.DataError, match=r"text.parquet: no column tokens or input_ids or text \(columns: body\); pass --column"
    ):
        list(iter_parquet(tmp_path / "text.parquet"))


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"tokens": [[1], None]}, r"bad.parquet row 1: tokens is null"),
        ({"tokens": [[1], [2, None]]}, r"bad.parquet row 1: tokens holds a null token id"),
        ({"tokens": [[1.5]]}, r"column 'tokens' has type list<.*double>; it must hold token ids"),
        ({"tokens": [[-1]]}, r"bad.parquet row 0 \(document id='bad.parquet:0'\): token\[0\]=-1 is outside"),
        ({"tokens": [[1]], "id": [None]}, r"bad.parquet row 0: id=None must be a non-empty string"),
        ({"tokens": [[1]], "partition": ["dev"]}, r"bad.parquet row 0: partition='dev' is not one of"),
    ],
    ids=["null-row", "null-id", "float", "negative", "null-doc-id", "partition"],
)
def test_bad_parquet_rows(tmp_path: Path, columns: dict[str, Any], message: str) -> None:
    """Bad rows are DataErrors naming file and row."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(columns), tmp_path / "bad.parquet")
    with pytest.raises(sb.DataError, match=message):
        list(iter_parquet(tmp_path / "bad.parquet"))


def test_not_parquet_is_a_data_error(tmp_path: Path) -> None:
    """A file named .parquet that is not one: DataError naming it."""
    pytest.importorskip("pyarrow")
    (tmp_path / "x.parquet").write_text("hello")
    with pytest.raises(sb.DataError, match=r"x.parquet: cannot read as Parquet"):
        list(iter_parquet(tmp_path / "x.parquet"))


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_arrow_ipc(tmp_path: Path, stream: bool) -> None:
    """Arrow IPC files in both layouts (``datasets`` writes the stream one)."""
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"tokens": pa.array([[5, 6], [7]], type=pa.list_(pa.uint16()))})
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as sink:
        writer = pa.ipc.new_stream(sink, table.schema) if stream else pa.ipc.new_file(sink, table.schema)
        writer.write_table(table, max_chunksize=1)
        writer.close()
    assert [("t.arrow:0", [5, 6]), ("t.arrow:1", [7])] == _ids_tokens(iter_arrow(tmp_path / "t.arrow"))


@pytest.mark.slow
def test_hugging_face_datasets(tmp_path: Path) -> None:
    """Dataset and IterableDataset rows: input_ids as they are, text through a tokenizer; a saved folder via iter_files."""
    datasets = pytest.importorskip("datasets")
    tokens = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]], "id": ["a", "b"]})
    assert [("a", [1, 2, 3]), ("b", [4])] == _ids_tokens(iter_hf(tokens))
    text = datasets.Dataset.from_dict({"text": ["hi", "", "yo"]})
    tok = ByteTokenizer(eos_id=256, bos_id=257)
    expected = [("0", [257, 104, 105, 256]), ("1", [257, 256]), ("2", [257, 121, 111, 256])]
    assert expected == _ids_tokens(iter_hf(text, tokenizer=tok, batch_size=2))
    assert expected == _ids_tokens(iter_hf(text.to_iterable_dataset(), tokenizer=tok))
    text.save_to_disk(str(tmp_path / "saved"))
    assert [(f"{tmp_path / 'saved'}:0", [257, 104, 105, 256])] == _ids_tokens(iter_files([tmp_path / "saved"], tokenizer=tok))[:1]


def test_hf_rows_without_datasets() -> None:
    """Any iterable of dicts works like a dataset (no datasets package needed)."""
    rows = [{"text": "ab"}, {"input_ids": [9], "id": "x"}]
    assert [("0", [97, 98]), ("x", [9])] == _ids_tokens(iter_hf(rows))
    with pytest.raises(sb.ConfigError, match=r"dataset='text' is not a dataset"):
        iter_hf("text")


def test_compressed_token_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A compressed .npy is a bad file (skippable), not text."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "t.npy.gz").write_bytes(gzip.compress(b"x"))
    (tmp_path / "c" / "a.txt").write_text("a")
    with pytest.raises(sb.DataError, match=r"t.npy.gz: compressed .npy files are not read; decompress it"):
        list(iter_files([tmp_path / "c"]))
    assert ("a.txt",) == sb.prepare_store([tmp_path / "c"], tmp_path / "s", skip_bad=True, quiet=True).ids
    assert "t.npy.gz" in capsys.readouterr().err
