"""Mixtures behave as documented: broken mixture files, a default length too large, one store twice, repeated sources,
and parts with different tokenizers (mixtures and corpora alike).  Each case through the API and the CLI."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import ConfigError, DataError
from streambatch.io.manifest import open_corpus, write_corpus

BYTES = {"name": "bytes", "kind": "bytes", "file_hash": None, "vocab_size": 256, "eos_id": None, "bos_id": None}
BPE = {"name": "bpe.json", "kind": "huggingface", "file_hash": "blake2b-256:00", "vocab_size": 8192}
ARGS = ["-T", "4", "-B", "2", "--seed", "1"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


def refused(status: int, err: str, *words: str) -> None:
    """Exit 2, one line on stderr naming *words*, no traceback."""
    assert status == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith("streambatch: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    sb.write_store(tmp_path / "big", [sb.Document("b", "train", np.arange(400) % 200)], tokenizer=BYTES)
    sb.write_store(tmp_path / "small", [sb.Document("s", "train", np.arange(40) % 200)], tokenizer=BYTES)
    sb.write_store(tmp_path / "bpe", [sb.Document("p", "train", np.arange(40) % 8000)], tokenizer=BPE)
    return tmp_path


def mixture(folder: Path, text: str, name: str = "mixture.json") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def entry(name: str, path: str, weight: str = "1") -> str:
    return f'{{"name": "{name}", "path": "{path}", "weight": {weight}}}'


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ('{"sources": [' + entry("a", "big", "NaN") + "]}", "invalid JSON"),
        ('{"sources": [' + entry("a", "big", "Infinity") + "]}", "invalid JSON"),
        ('{"sources": [' + entry("a", "big", "1e309") + "]}", "Number out of range"),
        ('{"sources": [' + entry("a", "big") + ",]}", "trailing comma"),
        (
            '{"sources": [' + entry("a", "big") + '], "pad": "' + "x" * (1 << 20) + '"}',
            "more than a mixture file may have (1 MiB)",
        ),
    ],
    ids=["nan", "infinity", "1e309", "trailing-comma", "over-1-mib"],
)
def test_a_broken_mixture_file_is_refused_as_a_mixture_file(
    folder: Path, text: str, rule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named as a mixture file, with the rule and the limit; never a corpus manifest, never sb.write_corpus."""
    path = mixture(folder, text)
    with pytest.raises(ConfigError) as caught:
        sb.open_source(path)
    message = str(caught.value)
    for word in ("mixture.json", "mixture file", rule, "strict JSON", "1 MiB"):
        assert word in message
    assert "corpus" not in message
    assert "write_corpus" not in message
    out = folder / "out.jsonl"
    status, _, err = run(["epoch", str(path), *ARGS, "-o", str(out)], capsys)
    refused(status, err, "mixture.json", "mixture file", rule)
    assert "corpus" not in err
    assert not out.exists()


def test_a_mixture_file_that_is_not_a_regular_file(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = folder / "mixture.json"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match=r"mixture\.json: not a regular file; a mixture file is strict JSON"):
        sb.open_source(path)
    status, _, err = run(["inspect", str(path)], capsys)
    refused(status, err, "not a regular file", "mixture file")


def test_a_default_length_too_large_names_the_file_and_the_weights(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The largest source at a tiny weight: the file, the source and the weights, never a length= nobody passed."""
    path = mixture(folder, '{"sources": [' + entry("big", "big", "1e-12") + ", " + entry("small", "small") + "]}")
    source = sb.open_source(path)
    with pytest.raises(ConfigError) as caught:
        sb.Epoch(source, context_length=4, batch_size=2, seed=1)
    message = str(caught.value)
    assert "mixture.json: the default length passes the largest source 'big' (396 items) once" in message
    assert "{'big': 1e-12, 'small': 1}" in message
    assert "give the mixture a length" in message
    assert "length=" not in message
    out = folder / "out.jsonl"
    status, _, err = run(["epoch", str(path), *ARGS, "-o", str(out)], capsys)
    refused(status, err, "mixture.json", "'big': 1e-12", "give the mixture a length")
    assert not out.exists()
    windows = [sb.windows(sb.open_store(folder / n), context_length=4) for n in ("big", "small")]
    with pytest.raises(ConfigError, match="largest source 'source-0'"):
        sb.mix(windows, [1e-12, 1], seed=1)


def test_one_store_under_two_names_is_refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every window would come twice per pass: refused, naming both sources (API, file, CLI)."""
    store = sb.open_store(folder / "big")
    with pytest.raises(ConfigError, match="sources 'a' and 'b' are the same store"):
        sb.mix([sb.windows(store, context_length=4), sb.windows(store, context_length=4)], [1, 1], seed=1, names=["a", "b"])
    again = sb.open_store(folder / "big")  # opened twice: the same fingerprint
    with pytest.raises(ConfigError, match="same store"):
        sb.mix([sb.windows(store, context_length=4), sb.windows(again, context_length=4)], [1, 1], seed=1)
    path = mixture(folder, '{"sources": [' + entry("web", "big") + ", " + entry("copy", "./big") + "]}")
    out = folder / "out.jsonl"
    status, _, err = run(["epoch", str(path), *ARGS, "-o", str(out)], capsys)
    refused(status, err, "mixture.json", "sources 'web' and 'copy' are the same store", "list it once")
    assert not out.exists()
    status, _, err = run(["inspect", str(path), "-T", "4"], capsys)
    refused(status, err, "same store")


def test_a_repeated_source_is_said_by_inspect_and_epoch(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default length passes 'big' once; 'small' (36 windows against 396) repeats about 11 times: both commands say so."""
    path = mixture(folder, '{"sources": [' + entry("big", "big") + ", " + entry("small", "small") + "]}")
    status, text, _ = run(["inspect", str(path), "-T", "4"], capsys)
    assert status == 0
    assert "note: source 'small' repeats: 10.972 source epochs per pass of the mixture" in text
    assert "the default length passes the largest source once" in text
    assert "'big' repeats" not in text
    status, text, _ = run(["inspect", str(path), "-T", "4", "--json"], capsys)
    assert status == 0
    assert len(json.loads(text)["notes"]) == 1
    status, _, err = run(["epoch", str(path), *ARGS, "-o", str(folder / "out.jsonl")], capsys)
    assert status == 0
    assert err.startswith("streambatch: note: ")
    assert "mixture.json: source 'small' repeats: 10.972 source epochs" in err
    once = mixture(folder, '{"sources": [' + entry("big", "big") + ", " + entry("small", "small") + '], "length": 20}', "m2.json")
    status, text, _ = run(["inspect", str(once), "-T", "4"], capsys)
    assert status == 0
    assert "note:" not in text


def test_parts_with_different_tokenizers_are_refused(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A BPE store of 8,192 ids and a byte store of 256: refused in a corpus and in a mixture, naming both."""
    both = "was tokenized by 'bpe.json' (huggingface, vocab_size=8192) but shard 0"
    with pytest.raises(DataError, match=r"shard 1 \(.*bpe\) was tokenized by 'bpe.json' \(huggingface, vocab_size=8192\)"):
        write_corpus(folder / "corpus.json", [folder / "big", folder / "bpe"])
    assert not (folder / "corpus.json").exists()
    (folder / "corpus.json").write_text(json.dumps({"format": "streambatch.corpus", "version": 1, "shards": ["big", "bpe"]}))
    with pytest.raises(DataError, match=re.escape(both)):
        open_corpus(folder / "corpus.json")
    status, _, err = run(["inspect", str(folder / "corpus.json")], capsys)
    refused(status, err, "bpe.json", "bytes", "the same --tokenizer")
    parts = [sb.windows(sb.open_store(folder / n), context_length=4) for n in ("big", "bpe")]
    with pytest.raises(DataError, match=r"source 'bpe' was tokenized by 'bpe\.json'.* but source 'big' by 'bytes'"):
        sb.mix(parts, [1, 1], seed=1, names=["big", "bpe"])
    path = mixture(folder, '{"sources": [' + entry("big", "big") + ", " + entry("bpe", "bpe") + "]}")
    out = folder / "out.jsonl"
    status, _, err = run(["epoch", str(path), *ARGS, "-o", str(out)], capsys)
    refused(status, err, "mixture.json", "source 'bpe' was tokenized by 'bpe.json'", "vocab_size=256")
    assert not out.exists()


def test_a_corpus_reports_its_tokenizer(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Shards of one tokenizer (or none recorded): the corpus, and inspect, report it."""
    sb.write_store(folder / "plain", [sb.Document("q", "train", [1, 2, 3])])  # token ids: no tokenizer recorded
    corpus = write_corpus(folder / "corpus.json", [folder / "big", folder / "plain", folder / "small"])
    assert json.loads((folder / "corpus.json").read_text())["tokenizer"] == BYTES
    assert corpus.tokenizer is not None
    assert corpus.tokenizer["name"] == "bytes"
    status, text, _ = run(["inspect", str(folder / "corpus.json")], capsys)
    assert status == 0
    assert "tokenizer" in text
    assert "bytes" in text
