"""Tests for `streambatch.prepare` and ``streambatch prepare``: tokenizers, selection, skip-bad, workers, shards."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch._progress import FileProgress
from streambatch.cli import main
from streambatch.errors import StoreError
from streambatch.prepare import iter_files
from streambatch.read import inputs as _inputs
from streambatch.read.select import select_inputs
from streambatch.read.text.byte_tokens import byte_tokenize
from streambatch.read.text.tokenizers import ByteTokenizer, CallableTokenizer, HFTokenizer
from tests.read.test_read_tokenizers import CORPUS, train_bpe


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def _header(store: Path) -> dict[str, Any]:
    return json.loads((store / "header.json").read_text())


def _docs(store: sb.DocumentStore) -> list[tuple[str, str, list[int]]]:
    return [(d.id, d.partition.value, d.tokens.tolist()) for d in store]


def _corpus(root: Path) -> Path:
    """A folder of every format that needs no extra, with a file large enough to be read in several chunks."""
    (root / "sub").mkdir(parents=True)
    for i in range(12):
        (root / f"t{i:02d}.txt").write_text(CORPUS[i] * (i + 1))
    (root / "sub" / "lines.txt.gz").write_bytes(gzip.compress("\n".join(CORPUS).encode()))
    (root / "sub" / "rows.jsonl").write_text("".join(json.dumps({"text": t, "partition": "test"}) + "\n" for t in CORPUS))
    (root / "tokens.ndjson").write_text('{"id": "fixed", "tokens": [1, 2, 3]}\n')
    np.save(root / "arr.npy", np.arange(40, dtype=np.uint16) % 7)
    np.save(root / "arr.offsets.npy", np.array([0, 10, 25, 40]))
    (np.arange(60, dtype="<u2") % 9).tofile(root / "nano.bin")
    return root


def test_bpe_tokenizer_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--tokenizer tokenizer.json (a BPE trained here): eos from <|endoftext|>, recorded in the header, the store and inspect."""
    tok = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(CORPUS[0])
    (corpus / "b.txt").write_text(CORPUS[1])
    assert 0 == cli("prepare", str(corpus), "-o", str(tmp_path / "s"), "--tokenizer", str(tok), "--quiet")[0]
    store = sb.open_store(tmp_path / "s")
    hf = HFTokenizer.from_file(tok)
    assert [[*hf.encode(CORPUS[0]).tolist(), 0], [*hf.encode(CORPUS[1]).tolist(), 0]] == [d.tokens.tolist() for d in store]
    described = {"name": "tokenizer.json", "kind": "huggingface", "vocab_size": 300, "eos_id": 0, "bos_id": None}
    assert described.items() <= store.tokenizer.items()
    assert hf.file_hash == store.tokenizer["file_hash"] == _header(tmp_path / "s")["tokenizer"]["file_hash"]
    assert 1 == _header(tmp_path / "s")["version"]
    assert store.tokenizer == pickle.loads(pickle.dumps(store)).tokenizer
    assert store.tokenizer == store.select("train").tokenizer
    status, text = cli("inspect", str(tmp_path / "s"), "--json")
    assert (0, store.tokenizer) == (status, json.loads(text)["tokenizer"])
    assert 0 == cli("prepare", str(corpus), "-o", str(tmp_path / "n"), "--tokenizer", str(tok), "--eos-id", "none", "-q")[0]
    assert hf.encode(CORPUS[0]).tolist() == sb.open_store(tmp_path / "n").document(0).tokens.tolist()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], [104, 105]),
        (["--eos-id", "256"], [104, 105, 256]),
        (["--bos-id", "0x101"], [257, 104, 105]),
        (["--eos-id", "0", "--bos-id", "1"], [1, 104, 105, 0]),
    ],
    ids=["none", "eos", "bos-hex", "both"],
)
def test_eos_bos_flags(tmp_path: Path, flags: list[str], expected: list[int]) -> None:
    """--eos-id/--bos-id frame every text document, per line too; token inputs stay as given."""
    (tmp_path / "a.txt").write_text("hi\nhi\n")
    (tmp_path / "t.jsonl").write_text('{"tokens": [9]}\n')
    assert (
        0
        == cli(
            "prepare", str(tmp_path / "a.txt"), str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "s"), "--per-line", "-q", *flags
        )[0]
    )
    store = sb.open_store(tmp_path / "s")
    assert [expected, expected, [9]] == [d.tokens.tolist() for d in store]
    assert max(256, *(t + 1 for t in expected)) == store.tokenizer["vocab_size"]


def test_default_tokenizer_is_recorded_only_when_it_tokenized(tmp_path: Path) -> None:
    """Bytes are recorded when text was tokenized; token-only stores record none; mixing ids >= 256 with byte text fails."""
    (tmp_path / "a.txt").write_text("hi")
    (tmp_path / "t.jsonl").write_text('{"tokens": [70000]}\n')
    assert "bytes" == sb.prepare_store([tmp_path / "a.txt"], tmp_path / "s1", quiet=True).tokenizer["name"]
    assert sb.prepare_store([tmp_path / "t.jsonl"], tmp_path / "s2", quiet=True).tokenizer is None
    assert "tokenizer" not in _header(tmp_path / "s2")
    with pytest.raises(sb.DataError, match=r"t.jsonl:1 .*: token\[0\]=70000 is outside the vocabulary of tokenizer 'bytes'"):
        sb.prepare_store([tmp_path / "a.txt", tmp_path / "t.jsonl"], tmp_path / "s3", quiet=True)
    assert not (tmp_path / "s3").exists()


def test_named_tokenizer_bounds_token_inputs(tmp_path: Path) -> None:
    """With a tokenizer named, token inputs beyond its vocabulary fail, naming the document and position."""
    tok = train_bpe(tmp_path / "tok.json", ["<|endoftext|>"])
    (tmp_path / "t.jsonl").write_text('{"id": "ok", "tokens": [299]}\n{"id": "big", "tokens": [5, 300]}\n')
    with pytest.raises(
        sb.DataError,
        match=r"t.jsonl:2 \(document id='big'\): token\[1\]=300 is outside the vocabulary of tokenizer 'tok.json' "
        r"\(vocab_size=300\)",
    ):
        sb.prepare_store([tmp_path / "t.jsonl"], tmp_path / "s", tokenizer=tok, quiet=True)


def test_include_exclude_and_ids_across_folders(tmp_path: Path) -> None:
    """Globs match paths relative to each input folder; with several inputs the folder name prefixes ids."""
    for folder in ("a", "b"):
        (tmp_path / folder / "deep").mkdir(parents=True)
        (tmp_path / folder / "x.txt").write_text(folder)
        (tmp_path / folder / "deep" / "y.md").write_text(folder)
        (tmp_path / folder / "skip.log").write_text(folder)
    inputs = [tmp_path / "a", tmp_path / "b"]
    assert ["a/deep/y.md", "a/x.txt", "b/deep/y.md", "b/x.txt"] == [
        f.name for f in select_inputs(inputs, include=["*.txt", "*.md"])
    ]
    assert ["a/skip.log", "a/x.txt", "b/skip.log", "b/x.txt"] == [f.name for f in select_inputs(inputs, exclude=["deep/*"])]
    assert ["x.txt"] == [f.name for f in select_inputs([tmp_path / "a"], include=["*.txt"], exclude=["deep/*"])]
    assert (
        0
        == cli(
            "prepare",
            *map(str, inputs),
            "-o",
            str(tmp_path / "s"),
            "--include",
            "*.txt",
            "--include",
            "*.md",
            "--exclude",
            "deep/*",
            "-q",
        )[0]
    )
    assert ("a/x.txt", "b/x.txt") == sb.open_store(tmp_path / "s").ids


def _bad_corpus(root: Path) -> dict[str, str]:
    """Good files and one bad file of each kind; returns bad file name -> what its error says."""
    root.mkdir()
    (root / "good.txt").write_text("good")
    (root / "good.jsonl").write_text('{"id": "g", "tokens": [1]}\n')
    (root / "bad-utf8.txt").write_bytes(b"ok\xff")
    (root / "bad-gzip.txt.gz").write_bytes(gzip.compress(b"x" * 1000)[:-10])
    (root / "bad-json.jsonl").write_text('{"tokens": [1]}\n' * 300 + "{broken\n")  # many chunks written, then rolled back
    (root / "later-dup.jsonl").write_text('{"id": "h", "tokens": [2]}\n{"id": "g", "tokens": [3]}\n')
    (root / "vocab.jsonl").write_text('{"tokens": [1]}\n{"tokens": [1000]}\n')
    np.save(root / "bad.npy", np.array([1.5]))
    return {
        "bad-gzip.txt.gz": "cannot read",
        "bad-json.jsonl": "bad-json.jsonl:301: invalid JSON",
        "bad-utf8.txt": "not UTF-8 text",
        "bad.npy": "must be a 1-D integer array",
        "later-dup.jsonl": "duplicate document id='g'",
        "vocab.jsonl": "token[0]=1000 is outside the vocabulary",
    }


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_skip_bad_leaves_out_whole_files(
    tmp_path: Path, workers: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--skip-bad: every bad file is left out whole (even after some of it was written), listed and counted on stderr."""
    monkeypatch.setattr(_inputs, "LINE_CHUNK_BYTES", 64)
    bad = _bad_corpus(tmp_path / "c")
    tok = CallableTokenizer(byte_tokenize, name="bytes-callable", vocab_size=256)
    args: dict[str, Any] = {"tokenizer": tok, "workers": workers}
    with pytest.raises(sb.DataError, match=r"bad-gzip.txt.gz: cannot read"):
        sb.prepare_store([tmp_path / "c"], tmp_path / "s", quiet=True, **args)
    assert not (tmp_path / "s").exists()
    store = sb.prepare_store([tmp_path / "c"], tmp_path / "s", skip_bad=True, **args)
    err = capsys.readouterr().err.splitlines()
    assert [("g", [1]), ("good.txt", [103, 111, 111, 100])] == [(d.id, d.tokens.tolist()) for d in store]
    assert len(bad) == len([line for line in err if line.startswith("prepare: skipped ")])
    for name, message in bad.items():
        assert any(name in line and message in line for line in err), name
    assert f"prepare: 2 files, 2 documents, 5 tokens, {len(bad)} skipped, " in err[-1]
    clean = sb.prepare_store([tmp_path / "c"], tmp_path / "clean", exclude=list(bad), quiet=True, **args)
    assert clean.fingerprint == store.fingerprint
    assert "uint16" == store.tokens.dtype.name


@pytest.mark.slow
def test_workers_make_the_same_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--workers 2 writes a store with the serial run's fingerprint (many chunks, every format, a BPE if installed)."""
    monkeypatch.setattr(_inputs, "LINE_CHUNK_BYTES", 256)
    corpus = _corpus(tmp_path / "c")
    tokenizer: Any = None
    if __import__("importlib").util.find_spec("tokenizers"):
        tokenizer = train_bpe(tmp_path / "tok.json", ["<|endoftext|>"])
    if __import__("importlib").util.find_spec("pyarrow"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": CORPUS[:40]}), corpus / "p.parquet", row_group_size=7)
    options: dict[str, Any] = {"tokenizer": tokenizer, "eos_id": 0 if tokenizer is None else "auto", "quiet": True}
    serial = sb.prepare_store([corpus], tmp_path / "serial", per_line=True, **options)
    parallel = sb.prepare_store([corpus], tmp_path / "parallel", per_line=True, workers=2, **options)
    assert serial.fingerprint == parallel.fingerprint
    assert _docs(serial) == _docs(parallel)
    assert len(serial) > 150
    assert list(iter_files([corpus], per_line=True, tokenizer=tokenizer, eos_id=options["eos_id"])) == list(serial)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 20])
def test_shards_read_together_are_the_whole(tmp_path: Path, count: int) -> None:
    """--part i/n stores, read in order, hold exactly the whole store's documents; read as a corpus, the same epoch."""
    corpus = _corpus(tmp_path / "c")
    tok = ByteTokenizer(eos_id=0)  # named, so that every shard records it (token-only shards too)
    whole = sb.prepare_store([corpus], tmp_path / "whole", tokenizer=tok, quiet=True)
    shards = [
        sb.prepare_store([corpus], tmp_path / f"p{i}", tokenizer=tok, part=f"{i}/{count}", quiet=True) for i in range(count)
    ]
    assert _docs(whole) == [doc for shard in shards for doc in _docs(shard)]
    assert {"index": count - 1, "count": count} == _header(tmp_path / f"p{count - 1}")["shard"]
    assert all(s.tokenizer == whole.tokenizer for s in shards)
    corpus_epoch = sb.Epoch(sb.open_corpus(shards), context_length=3, batch_size=4, seed=7, keep_partition=True)
    whole_epoch = sb.Epoch(whole, context_length=3, batch_size=4, seed=7, keep_partition=True)
    assert len(whole_epoch) > 1
    assert [(b.inputs.tolist(), b.targets.tolist(), b.document_ids) for b in corpus_epoch] == [
        (b.inputs.tolist(), b.targets.tolist(), b.document_ids) for b in whole_epoch
    ]


def test_shard_through_the_cli(tmp_path: Path) -> None:
    """The Slurm recipe's command line: each array task writes its part."""
    corpus = _corpus(tmp_path / "c")
    for i in range(3):
        assert (
            0
            == cli("prepare", str(corpus), "-o", str(tmp_path / f"part-{i}"), "--part", f"{i}/3", "--bin-separator", "0", "-q")[0]
        )
    assert 0 == cli("prepare", str(corpus), "-o", str(tmp_path / "whole"), "--bin-separator", "0", "-q")[0]
    parts = [_docs(sb.open_store(tmp_path / f"part-{i}")) for i in range(3)]
    assert _docs(sb.open_store(tmp_path / "whole")) == [d for p in parts for d in p]


def test_the_old_shard_flag_is_refused_with_its_new_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--shard`` (0.3) clashed with a corpus's shards: refused in one line that names ``--part``, nothing written."""
    corpus = _corpus(tmp_path / "c")
    assert 2 == cli("prepare", str(corpus), "-o", str(tmp_path / "p"), "--shard", "0/3", "-q")[0]
    err = capsys.readouterr().err
    assert "--shard 0/3 is now --part 0/3" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_summary_line_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One summary line on stderr (documents, tokens, skipped, seconds) unless quiet."""
    (tmp_path / "a.txt").write_text("hello")
    sb.prepare_store([tmp_path / "a.txt"], tmp_path / "s")
    err = capsys.readouterr().err
    assert err.startswith("prepare: 1 file, 1 document, 5 tokens, 0 skipped, ")
    assert err.endswith(" tokens/s)\n")
    sb.prepare_store([tmp_path / "a.txt"], tmp_path / "s", quiet=True)
    assert "" == capsys.readouterr().err


def test_progress_bar_shows_documents_tokens_and_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar counts files and shows documents, tokens and tokens/s."""
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    progress = FileProgress(3, progress=None)
    progress.add(2, 1234)
    progress.file_done(True)
    assert (1, 3) == (progress.bar.n, progress.bar.total)
    assert "2 docs, 1,234 tokens, " in progress.bar.postfix
    assert progress.bar.postfix.endswith(" tokens/s")
    progress.close()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"workers": 0}, sb.ConfigError, r"workers=0 must be a positive int"),
        ({"part": "3/3"}, sb.ConfigError, r"part='3/3' must be i/n with 0 <= i < n"),
        ({"part": "x"}, sb.ConfigError, r"part='x' must be i/n"),
        ({"shard": "0/2"}, sb.ConfigError, r"shard='0/2' is now part='0/2'"),
        ({"format": "megatron", "output": "s3://bucket/store"}, sb.ConfigError, r"format='megatron' writes local files"),
        ({"format": "parquet", "output": "s3://bucket/store"}, sb.ConfigError, r"format='parquet' is not one of"),
        ({"column": ""}, sb.ConfigError, r"column='' must be a non-empty column name"),
        ({"bin_dtype": "int8"}, sb.ConfigError, r"bin_dtype='int8' must be 'uint16' or 'uint32'"),
        (
            {"workers": 2, "tokenizer": lambda s: [1]},
            sb.ConfigError,
            r"workers=2 needs a tokenizer that can be sent .* cannot be pickled",
        ),
    ],
    ids=[
        "workers",
        "part-range",
        "part-text",
        "shard-renamed",
        "remote-format",
        "unknown-format",
        "column",
        "bin-dtype",
        "unpicklable",
    ],
)
def test_bad_options(tmp_path: Path, options: dict[str, Any], error: type[Exception], message: str) -> None:
    """Bad options are ConfigErrors, and no store is left behind."""
    (tmp_path / "a.txt").write_text("hello")
    options = dict(options)
    output = options.pop("output", tmp_path / "s")  # an address: refused before any request
    with pytest.raises(error, match=message):
        sb.prepare_store([tmp_path / "a.txt"], output, quiet=True, **options)
    assert not (tmp_path / "s").exists()


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad input through the CLI: exit 2, one line, no store."""
    (tmp_path / "bad.txt").write_bytes(b"\xff")
    assert (2, "") == cli("prepare", str(tmp_path / "bad.txt"), "-o", str(tmp_path / "s"))
    assert 1 == len(capsys.readouterr().err.splitlines())
    assert (2, "") == cli(
        "prepare", str(tmp_path / "bad.txt"), "-o", str(tmp_path / "s"), "--tokenizer", str(tmp_path / "no.json")
    )
    assert "tokenizer" in capsys.readouterr().err  # cannot read it, or the tokenizers extra is missing
    assert not (tmp_path / "s").exists()


def test_stores_without_a_tokenizer_entry_stay_valid(tmp_path: Path) -> None:
    """A version-1 header without ``tokenizer`` opens (tokenizer None); a malformed entry is a StoreError."""
    sb.write_store(tmp_path / "s", [sb.Document("a", "train", [1, 2])])
    assert sb.open_store(tmp_path / "s").tokenizer is None
    header = _header(tmp_path / "s")
    header["tokenizer"] = "bytes"
    (tmp_path / "s" / "header.json").write_text(json.dumps(header))
    with pytest.raises(StoreError, match=r"tokenizer='bytes' must be an object"):
        sb.open_store(tmp_path / "s")


def test_write_store_records_and_enforces_a_tokenizer(tmp_path: Path) -> None:
    """write_store(tokenizer=...) records it, and rejects tokens beyond its vocabulary."""
    store = sb.write_store(tmp_path / "s", sb.iter_text([], tokenizer=None), tokenizer=ByteTokenizer(eos_id=256))
    assert 257 == store.tokenizer["vocab_size"]
    with pytest.raises(sb.DataError, match=r"document index 0: token\[1\]=300 is outside the vocabulary of tokenizer 'bytes'"):
        sb.write_store(tmp_path / "t", [sb.Document("a", "train", [1, 300])], tokenizer=ByteTokenizer())
