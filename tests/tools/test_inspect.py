"""Tests for `streambatch.tools.inspect`, `streambatch.read.open` and ``streambatch inspect``."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import PartitionError
from streambatch.read.open import open_source
from streambatch.tools.inspect import format_bytes, format_count, inspect_source, plan_bytes
from tests.strategies import configs, documents

LINES = (
    '{"id": "train-a", "partition": "train", "tokens": [0, 10, 11, 12, 1]}\n'
    '{"id": "train-b", "partition": "train", "tokens": [0, 20, 21, 1]}\n'
    '{"id": "train-c", "partition": "train", "tokens": [0, 40]}\n'
    '{"id": "val-a", "partition": "validation", "tokens": [0, 30, 31, 32, 1]}\n'
)


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text(LINES)
    return path


@pytest.fixture
def store(jsonl: Path, tmp_path: Path) -> Path:
    """The same documents as a store whose header records a tokenizer."""
    sb.prepare_store([jsonl], tmp_path / "store", quiet=True)
    header_path = tmp_path / "store" / "header.json"
    header = json.loads(header_path.read_text())
    header["tokenizer"] = {"name": "byte", "vocab_size": 256}  # outside the fingerprint: the store stays valid
    header_path.write_text(json.dumps(header))
    return tmp_path / "store"


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def test_inspect_text_corpus_only(store: Path) -> None:
    """Without -T: the corpus and each partition's documents and tokens; the tokenizer from the header."""
    fingerprint = sb.open_store(store).fingerprint
    expected = (
        f"source       {store} (store directory, memory-mapped)\n"
        "documents    4\n"
        "tokens       16 (uint16)\n"
        f"fingerprint  {fingerprint} (verified)\n"
        "tokenizer    byte (vocab_size=256)\n"
        "\n"
        "partition  train  validation\n"
        "documents      3           1\n"
        "tokens        11           5\n"
    )
    assert (0, expected) == run(["inspect", str(store)])


def test_inspect_text_with_windows_and_batches(jsonl: Path) -> None:
    """-T -B --stride: windows, short documents, tails, batches, the final denominator against capacity, plan bytes."""
    expected = (
        f"source     {jsonl} (JSONL file, read into memory)\n"
        "documents  4\n"
        "tokens     16 (uint32)\n"
        "\n"
        "T=2, stride=2, B=2                    train     validation\n"
        "documents                                 3              1\n"
        "tokens                                   11              5\n"
        "windows                                   3              2\n"
        "short documents (< 3 tokens)              1              0\n"
        "tail tokens                      3 (27.3 %)      0 (0.0 %)\n"
        "batches                                   2              1\n"
        "batch widths                  [2] x 1 + [1]        [2] x 1\n"
        "final batch                          [1, 2]         [2, 2]\n"
        "final denominator             2 of 4 tokens  4 of 4 tokens\n"
        "plan (shuffled)                        12 B            8 B\n"
    )
    assert (0, expected) == run(["inspect", str(jsonl), "-T", "2", "-B", "2", "--stride", "2"])


def test_inspect_json(store: Path) -> None:
    """--json: the same numbers for scripts, one partition with --partition."""
    status, text = run(["inspect", str(store), "-T", "2", "-B", "3", "--partition", "train", "--json", "--no-verify"])
    summary = json.loads(text)
    assert 0 == status
    assert {
        "path": str(store),
        "kind": "store",
        "verified": False,
        "documents": 4,
        "tokens": 16,
        "dtype": "uint16",
        "fingerprint": sb.open_store(store).fingerprint,
        "tokenizer": {"name": "byte", "vocab_size": 256},
        "context_length": 2,
        "stride": 1,
        "batch_size": 3,
        "partitions": {
            "train": {
                "documents": 3,
                "tokens": 11,
                "windows": 5,
                "short_documents": 1,
                "tail_tokens": 2,
                "tail_share": 2 / 11,
                "plan_bytes": 20,
                "batches": 2,
                "full_batches": 1,
                "final_batch": {"width": 2, "tokens": 4, "capacity_tokens": 6},
            }
        },
    } == summary


def test_inspect_an_empty_partition(jsonl: Path) -> None:
    """A partition without documents: zeros and no final batch."""
    test = inspect_source(open_source(jsonl), context_length=2, batch_size=3, partition="test")["partitions"]
    assert {"test": {"documents": 0, "tokens": 0, "windows": 0, "short_documents": 0, "tail_tokens": 0, "tail_share": 0.0,
                     "plan_bytes": 0, "batches": 0, "full_batches": 0, "final_batch": None}} == test  # fmt: skip
    status, text = run(["inspect", str(jsonl), "-T", "2", "-B", "3", "--partition", "test"])
    assert (0, "final denominator                  none") == (status, text.splitlines()[-2])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "{file}", "-T", "0"], "context_length=0 must be a positive int"),
        (["inspect", "{file}", "--stride", "2"], "--stride 2 needs --context-length"),
        (["inspect", "{file}", "-B", "2"], "batch_size=2 needs a context_length"),
        (["inspect", "{file}", "-T", "2", "--stride", "0"], "stride=0 must be a positive int"),
        (["inspect", "{missing}"], "cannot open"),
        (["inspect", "{dir}"], "not a streambatch store"),
    ],
    ids=["T0", "stride-without-T", "B-without-T", "stride0", "missing", "not-a-store"],
)
def test_inspect_bad_input_exits_2(
    argv: list[str], message: str, jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: exit 2, one line on stderr, nothing on stdout."""
    (tmp_path / "empty").mkdir()
    filled = [a.format(file=jsonl, missing=tmp_path / "nope.jsonl", dir=tmp_path / "empty") for a in argv]
    status, text = run(filled)
    err = capsys.readouterr().err
    assert (2, "") == (status, text)
    assert 1 == len(err.splitlines())
    assert re.search(re.escape(message), err)


@given(documents(), configs)
def test_inspect_agrees_with_the_epoch(docs: list[sb.Document], config: dict[str, int]) -> None:
    """Property: windows, batches, final width and plan bytes are what the epoch then has."""
    train = inspect_source(docs, **config, partition="train")["partitions"]["train"]
    epoch = sb.Epoch(docs, seed=3, **config)
    assert epoch.window_count == train["windows"]
    assert epoch.batch_count == train["batches"]
    assert epoch.plan_nbytes == train["plan_bytes"]
    if epoch.batch_count:
        T = config["context_length"]
        final = epoch[epoch.batch_count - 1]
        assert {"width": final.width, "tokens": final.token_count, "capacity_tokens": config["batch_size"] * T} == (
            train["final_batch"]
        )
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    assert int((lengths < config["context_length"] + 1).sum()) == train["short_documents"]


def test_formatting_helpers() -> None:
    """Counts and bytes for people; plan bytes double only beyond 2**32 tokens and windows."""
    assert ["0", "9999", "10.0 k", "1.2 M", "100 M", "3.4 G"] == [
        format_count(n) for n in (0, 9_999, 10_000, 1_234_567, 100_000_000, 3_400_000_000)
    ]
    assert ["999 B", "4.0 kB", "400 MB"] == [format_bytes(n) for n in (999, 4_000, 400_000_000)]
    assert (400_000_000, 8 * 2**32) == (plan_bytes(100_000_000, 10**9), plan_bytes(2**32, 2**33))


def test_open_source_and_header(store: Path, jsonl: Path) -> None:
    """A directory opens as a memory-mapped store with its header's tokenizer; a file as JSONL, without one."""
    source = open_source(store, verify=False)
    assert ("store", False, "byte") == (source.kind, source.verified, source.store.tokenizer["name"])
    assert open_source(jsonl).store.tokenizer is None


def test_keep_partition_reads_one_partition_of_a_mixed_source(jsonl: Path) -> None:
    """With keep_partition a mixed source gives each partition its own epoch; without it the source is refused."""
    source = open_source(jsonl)
    assert [5, 3] == [
        sb.Epoch(source, context_length=2, batch_size=4, partition=p, keep_partition=True, seed=None).window_count
        for p in ("train", "validation")
    ]
    with pytest.raises(PartitionError):
        sb.Epoch(source.store, context_length=2, batch_size=4, seed=None)
