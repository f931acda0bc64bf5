"""Tests for `streambatch.io.formats.megatron` and ``prepare --format megatron``: Megatron-LM's ``.bin``/``.idx``."""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import DataError, StoreError
from streambatch.io.formats import FormatWriter, megatron, open_megatron, write_format
from tests.format_files import (
    MemoryFile,
    assert_same_epochs,
    builder_dtype,
    damage_sweep,
    megatron_files,
    memory_opener,
    write_jsonl,
    write_megatron,
)

INTEGER_DTYPES = ["uint8", "int8", "int16", "int32", "int64", "uint16"]


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


@st.composite
def split_documents(draw: st.DrawFn) -> tuple[str, list[list[list[int]]]]:
    """A dtype and documents of 0-3 sequences each, ids within the dtype's non-negative range."""
    dtype = draw(st.sampled_from(INTEGER_DTYPES))
    top = min(int(np.iinfo(dtype).max), 70_000)
    sequence = st.lists(st.integers(min_value=0, max_value=top), max_size=12)
    return dtype, draw(st.lists(st.lists(sequence, max_size=3), max_size=7))


@given(split_documents(), st.integers(1, 4), st.integers(1, 5), st.one_of(st.none(), st.integers(0, 2**32)))
def test_independent_files_read_as_the_same_documents_as_jsonl(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, list[list[list[int]]]], t: int, b: int, seed: int | None
) -> None:
    """Every Megatron document (its sequences, joined) is one document: the same windows and packed rows as JSONL."""
    dtype, documents = case
    folder = tmp_path_factory.mktemp("megatron")
    prefix = write_megatron(folder / "corpus", documents, dtype)
    joined = [[token for sequence in d for token in sequence] for d in documents]
    source = sb.open_source(prefix)
    assert source.kind == "megatron"
    store = source.store
    assert [d.tokens.tolist() for d in store] == joined
    assert store.ids == tuple(str(i) for i in range(len(documents)))
    if not any(joined):  # JSONL of no tokens at all: nothing to compare an epoch with
        return
    reference = sb.open_source(write_jsonl(folder / "corpus.jsonl", joined)).store
    assert_same_epochs(store, reference, context_length=t, batch_size=b, seed=seed)


@pytest.mark.parametrize("given_as", ["prefix", "idx", "bin"])
def test_a_prefix_or_either_file_opens_the_dataset(tmp_path: Path, given_as: str) -> None:
    """``open_source`` takes ``PREFIX``, ``PREFIX.idx`` or ``PREFIX.bin``."""
    prefix = write_megatron(tmp_path / "c", [[[0, 10, 11]], [[0, 20]]], "uint16")
    path = str(prefix) if given_as == "prefix" else f"{prefix}.{given_as}"
    assert [d.tokens.tolist() for d in sb.open_source(path).store] == [[0, 10, 11], [0, 20]]


@pytest.mark.parametrize(
    ("top", "vocab_size", "dtype"),
    [
        (65_498, None, "uint16"),
        (65_499, None, "int32"),
        (100, 50_257, "uint16"),
        (100, 128_256, "int32"),
        (70_000, None, "int32"),
    ],
)
def test_written_files_are_the_builders_bytes(tmp_path: Path, top: int, vocab_size: int | None, dtype: str) -> None:
    """``write_format`` writes what IndexedDatasetBuilder writes: uint16 below 65,500 ids (vocab or largest id + 1)."""
    documents = [[0, 5, top], [], [7, 8, 9, 1], [top]]
    store = write_format(tmp_path / "out", [sb.Document(f"d{i}", "train", d) for i, d in enumerate(documents)],
                         "megatron", vocab_size=vocab_size)  # fmt: skip
    expected = megatron_files([[d] for d in documents], builder_dtype(vocab_size if vocab_size else top + 1))
    assert ((tmp_path / "out.bin").read_bytes(), (tmp_path / "out.idx").read_bytes()) == expected
    assert builder_dtype(vocab_size if vocab_size else top + 1) == dtype
    assert [d.tokens.tolist() for d in store] == documents


def test_prepare_format_megatron_round_trips(tmp_path: Path) -> None:
    """``prepare --format megatron`` from JSONL: the builder's bytes, and the epoch of the JSONL it came from."""
    documents = [[0, 10, 11, 12, 1], [0, 20, 21, 1], [3, 4, 5, 6, 7, 8, 9]]
    jsonl = write_jsonl(tmp_path / "in.jsonl", documents)
    code, _ = cli("prepare", str(jsonl), "-o", str(tmp_path / "corpus"), "--format", "megatron", "-q")
    assert code == 0
    assert ((tmp_path / "corpus.bin").read_bytes(), (tmp_path / "corpus.idx").read_bytes()) == megatron_files(
        [[d] for d in documents], "uint16"
    )
    assert sorted(os.listdir(tmp_path)) == ["corpus.bin", "corpus.idx", "in.jsonl"]  # no temporaries left
    reference = sb.open_source(jsonl).store
    assert_same_epochs(sb.open_source(tmp_path / "corpus").store, reference, context_length=2, batch_size=2, seed=7)


def test_a_failed_prepare_leaves_the_previous_files(tmp_path: Path) -> None:
    """A bad input stops ``prepare --format``: the previous .bin/.idx stay as they were, no temporary is left."""
    write_megatron(tmp_path / "corpus", [[[1, 2, 3]]], "uint16")
    before = (tmp_path / "corpus.bin").read_bytes(), (tmp_path / "corpus.idx").read_bytes()
    good = write_jsonl(tmp_path / "a.jsonl", [[0, 1, 2]])
    (tmp_path / "b.jsonl").write_text('{"tokens": [1, -2]}\n')
    with pytest.raises(DataError, match=r"b\.jsonl"):
        sb.prepare_store([good, tmp_path / "b.jsonl"], tmp_path / "corpus", format="megatron", quiet=True)
    assert ((tmp_path / "corpus.bin").read_bytes(), (tmp_path / "corpus.idx").read_bytes()) == before
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "corpus.bin", "corpus.idx"]


def test_rollback_narrows_the_dtype_again(tmp_path: Path) -> None:
    """Documents rolled back (a skipped file) leave no trace: not their tokens, nor the wider dtype they needed."""
    with FormatWriter(tmp_path / "c", "megatron") as writer:
        writer.add_block(np.array([1, 2, 3]), [3], ["a"], "train")
        mark = writer.mark()
        writer.add_block(np.array([70_000, 4]), [1, 1], ["b", "c"], "train")
        writer.rollback(mark)
        writer.add_block(np.array([5]), [1], ["d"], "train")
        writer.commit()
    assert ((tmp_path / "c.bin").read_bytes(), (tmp_path / "c.idx").read_bytes()) == megatron_files(
        [[[1, 2, 3]], [[5]]], "uint16"
    )


def test_documents_outside_train_are_refused(tmp_path: Path) -> None:
    """The format holds no partitions: a validation document is refused by name, and nothing is written."""
    with pytest.raises(DataError, match=r"'v'.*partition 'validation'"):
        write_format(tmp_path / "c", [sb.Document("t", "train", [1]), sb.Document("v", "validation", [2])], "megatron")
    assert os.listdir(tmp_path) == []


def test_pickled_store_maps_the_files_again(tmp_path: Path) -> None:
    """A store pickles as its path (a DataLoader worker maps the files again) and refuses files replaced since."""
    prefix = write_megatron(tmp_path / "c", [[[0, 1], [2]], [[3, 4, 5]]], "int32")
    store = open_megatron(prefix)
    copy = pickle.loads(pickle.dumps(store))
    assert [d.tokens.tolist() for d in copy] == [[0, 1, 2], [3, 4, 5]]
    assert len(pickle.dumps(store)) < 1000
    data = pickle.dumps(store)
    os.unlink(f"{prefix}.bin")
    write_megatron(tmp_path / "c", [[[9, 9], [9]], [[9, 9, 9]]], "int32")
    with pytest.raises(StoreError, match="replaced"):
        pickle.loads(data)


# --- bad files: each a DataError naming the file and what is wrong ----------------------------------------------


def _idx(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + ".idx")


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


GOOD = [[[0, 10, 11], [12, 1]], [[0, 20, 21, 1]], [[5, 6]]]  # 4 sequences, 3 documents
LENGTHS, POINTERS, DOC_INDEX = 34, 34 + 16, 34 + 48  # where each array starts in the .idx of GOOD


def _bad(kind: str, prefix: Path) -> None:
    idx = _idx(prefix)
    bin_path = prefix.with_name(prefix.name + ".bin")
    if kind == "magic":
        _patch(idx, 0, b"MMIDIDY")
    elif kind == "version":
        _patch(idx, 9, struct.pack("<Q", 2))
    elif kind == "dtype code":
        _patch(idx, 17, bytes([9]))
    elif kind == "float dtype":
        _patch(idx, 17, bytes([7]))
    elif kind == "truncated idx":
        idx.write_bytes(idx.read_bytes()[:-8])
    elif kind == "truncated header":
        idx.write_bytes(idx.read_bytes()[:20])
    elif kind == "truncated bin":
        bin_path.write_bytes(bin_path.read_bytes()[:-4])
    elif kind == "half token":
        bin_path.write_bytes(bin_path.read_bytes()[:-1])
    elif kind == "pointers not monotone":
        _patch(idx, POINTERS + 16, struct.pack("<q", 4))  # sequence 2 (document 1) starts before sequence 1
    elif kind == "pointer out of range":
        _patch(idx, POINTERS + 24, struct.pack("<q", 400))
    elif kind == "pointer not a token offset":
        _patch(idx, POINTERS + 24, struct.pack("<q", 37))
    elif kind == "gap in a document":
        _patch(idx, POINTERS + 8, struct.pack("<q", 16))  # sequence 1 of document 0 does not follow sequence 0
    elif kind == "doc indices not monotone":
        _patch(idx, DOC_INDEX + 8, struct.pack("<q", 3))
        _patch(idx, DOC_INDEX + 16, struct.pack("<q", 2))
    elif kind == "doc indices not from 0":
        _patch(idx, DOC_INDEX, struct.pack("<q", 1))
    elif kind == "negative length":
        _patch(idx, LENGTHS, struct.pack("<i", -1))
    elif kind == "negative id":
        _patch(bin_path, 4, struct.pack("<i", -7))


BAD = {
    "magic": "not a Megatron index",
    "version": "version 2",
    "dtype code": "dtype code 9 is not one of 1-8",
    "float dtype": r"float32\) holds floats",
    "truncated idx": "truncated",
    "truncated header": "shorter than the 34-byte header: truncated",
    "truncated bin": r"past the end of .*c\.bin.*out of range",
    "half token": "not a whole number of int32 tokens: truncated",
    "pointers not monotone": "pointers are not monotone",
    "pointer out of range": "out of range",
    "pointer not a token offset": "pointer 37 of sequence 3 is not a int32 offset",
    "gap in a document": "sequence 1 does not start where sequence 0 of the same document ends",
    "doc indices not monotone": "document indices are not monotone",
    "doc indices not from 0": "document indices run from 1",
    "negative length": "sequence 0 has a negative length -1",
    "negative id": "token 1 is the negative id -7",
}


@pytest.mark.parametrize("step", [None, 1, 3])
def test_checks_in_blocks_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int | None) -> None:
    """The index is checked in blocks; a block boundary inside a document changes nothing."""
    if step is not None:
        monkeypatch.setattr(megatron, "_STEP", step)
    documents = [[[0, 10, 11], [12, 1]], [], [[0, 20, 21, 1]], [[5], [], [6, 7], [8]], [[9]]]
    store = sb.open_source(write_megatron(tmp_path / "c", documents, "uint16")).store
    assert [d.tokens.tolist() for d in store] == [[t for s in d for t in s] for d in documents]


@pytest.mark.parametrize("step", [None, 1, 3])
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_files_are_data_errors_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, step: int | None
) -> None:
    """Each broken index or data file is a `DataError` naming the file and the rule, at open or at first use."""
    if step is not None:  # the checks run in blocks of this many entries
        monkeypatch.setattr(megatron, "_STEP", step)
    prefix = write_megatron(tmp_path / "c", GOOD, "int32")
    _bad(kind, prefix)
    with pytest.raises(DataError, match=BAD[kind]) as raised:
        _used(prefix)
    assert "c.idx" in str(raised.value) or "c.bin" in str(raised.value)


def _used(prefix: Path) -> None:
    """Open *prefix* and use every array (they are checked at first use)."""
    store = sb.open_source(prefix).store
    assert isinstance(store, sb.DocumentStore)
    assert store.lengths.size + store.tokens.size >= 0


def test_bad_file_is_one_line_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``streambatch epoch`` on a broken index: exit 2 and one line naming it, no traceback."""
    prefix = write_megatron(tmp_path / "c", GOOD, "int32")
    _bad("magic", prefix)
    code, _ = cli("epoch", f"{prefix}.idx", "--context-length", "2", "--batch-size", "2", "--sequential")
    err = capsys.readouterr().err
    assert code == 2
    assert "c.idx" in err
    assert "not a Megatron index" in err
    assert "Traceback" not in err


def test_readers_read_only_through_the_opener(tmp_path: Path) -> None:
    """Every byte comes through the opener's `ByteSource`: only the 34-byte header as bytes, the rest as arrays."""
    documents = [[[0, 10, 11], [12, 1]], [[0, 20, 21, 1]]]
    data, idx = megatron_files(documents, "int32")
    opened: dict[str, MemoryFile] = {}
    store = open_megatron("remote/c", opener=memory_opener({"remote/c.bin": data, "remote/c.idx": idx}, opened))
    assert [d.tokens.tolist() for d in store] == [[0, 10, 11, 12, 1], [0, 20, 21, 1]]
    assert opened["remote/c.idx"].reads == [(0, 34)]
    assert opened["remote/c.bin"].reads == []


@given(st.lists(st.lists(st.integers(0, 70_000), max_size=10), max_size=8), st.one_of(st.none(), st.integers(1, 200_000)))
def test_written_bytes_equal_the_builders_for_any_documents(
    tmp_path_factory: pytest.TempPathFactory, documents: list[list[int]], vocab: int | None
) -> None:
    """For any documents and vocabulary: the builder's bytes (one sequence per document), read back as written."""
    top = max((t for d in documents for t in d), default=-1)
    vocab = None if vocab is None else max(vocab, top + 1)
    folder = tmp_path_factory.mktemp("write")
    docs = [sb.Document(f"d{i}", "train", d) for i, d in enumerate(documents)]
    store = write_format(folder / "c", docs, "megatron", vocab_size=vocab)
    expected = megatron_files([[d] for d in documents], builder_dtype(vocab if vocab is not None else top + 1))
    assert ((folder / "c.bin").read_bytes(), (folder / "c.idx").read_bytes()) == expected
    assert [d.tokens.tolist() for d in store] == documents


def test_a_folder_of_datasets_is_one_corpus(tmp_path: Path) -> None:
    """A folder of Megatron datasets opens as one corpus, in name order, ids ``PREFIX:d``; a store folder stays a store."""
    write_megatron(tmp_path / "b", [[[5, 6, 7]]], "uint16")
    write_megatron(tmp_path / "a", [[[1, 2]], [[3], [4, 9]]], "int32")
    source = sb.open_source(tmp_path)
    assert source.kind == "megatron"
    assert source.store.ids == ("a:0", "a:1", "b:0")
    assert [d.tokens.tolist() for d in source.store] == [[1, 2], [3, 4, 9], [5, 6, 7]]
    reference = write_jsonl(tmp_path / "docs.txt", [[1, 2], [3, 4, 9], [5, 6, 7]], ["a:0", "a:1", "b:0"])
    assert_same_epochs(source.store, sb.open_source(reference).store, context_length=1, batch_size=2, seed=3)
    sb.write_store(tmp_path / "store", [sb.Document("x", "train", [1, 2])])
    assert sb.open_source(tmp_path / "store").kind == "store"


def test_ids_beyond_int32_are_refused(tmp_path: Path) -> None:
    """Megatron's widest token dtype here is int32: an id >= 2**31 is refused by document, nothing is written."""
    docs = [sb.Document("a", "train", [1, 2]), sb.Document("b", "train", [3, 2**31])]
    with pytest.raises(DataError, match=r"document id='b'.*token id 2147483648 does not fit megatron"):
        write_format(tmp_path / "c", docs, "megatron")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("given_as", ["idx", "bin", "folder"])
def test_prepare_reads_a_dataset_through_its_index(tmp_path: Path, given_as: str) -> None:
    """``prepare`` reads a Megatron dataset by its index (never its .bin as separator-split tokens), ids ``NAME:d``."""
    data = tmp_path / "data"
    data.mkdir()
    write_megatron(data / "c", [[[0, 10, 11], [12, 1]], [[0, 20, 21, 1]], []], "int32")
    given = {"idx": data / "c.idx", "bin": data / "c.bin", "folder": data}[given_as]
    store = sb.prepare_store([given], tmp_path / "store", quiet=True)
    name = "c.idx" if given_as == "folder" else str(given)  # a file given directly: its path as given
    assert [(d.id, d.tokens.tolist()) for d in store] == [
        (f"{name}:0", [0, 10, 11, 12, 1]),
        (f"{name}:1", [0, 20, 21, 1]),
        (f"{name}:2", []),
    ]
    again = sb.prepare_store([given], tmp_path / "again", format="datatrove", quiet=True)
    assert [d.tokens.tolist() for d in again] == [[0, 10, 11, 12, 1], [0, 20, 21, 1], []]


def test_any_damage_is_a_data_error_or_reads(tmp_path: Path) -> None:
    """Bytes of the .idx or .bin overwritten or cut anywhere: the files read, or a `DataError` names the file."""

    def make(folder: Path, rng: random.Random) -> tuple[Path, Path]:
        prefix = write_megatron(folder / "c", GOOD, rng.choice(["int32", "uint16", "int8"]))
        return prefix, prefix.with_name(prefix.name + rng.choice([".idx", ".bin"]))

    def read(prefix: Path) -> None:
        store = sb.open_source(prefix).store
        assert [len(d) for d in store] == store.lengths.tolist()

    damage_sweep(2, make, read, tmp_path)


def test_a_killed_writers_temporaries_are_removed(tmp_path: Path) -> None:
    """The temporaries a killed writer left (its pid no longer runs) are removed by the next write of the same files."""
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = int(child.stdout)
    for name in ("c.bin", "c.idx"):
        (tmp_path / f".{name}.partial-{dead}-0123abcd").write_bytes(b"half")
    write_format(tmp_path / "c", [sb.Document("a", "train", [1, 2])], "megatron")
    assert sorted(os.listdir(tmp_path)) == ["c.bin", "c.idx"]


def test_skip_bad_leaves_a_bad_file_out_of_the_files(tmp_path: Path) -> None:
    """``--skip-bad`` with ``--format``: a bad file's documents (even those before its bad line) leave no trace."""
    write_jsonl(tmp_path / "a.jsonl", [[1, 2, 3]])
    (tmp_path / "b.jsonl").write_text('{"tokens": [70000, 1]}\n{"tokens": [1, -2]}\n')
    write_jsonl(tmp_path / "c.jsonl", [[4, 5]])
    inputs = [tmp_path / n for n in ("a.jsonl", "b.jsonl", "c.jsonl")]
    sb.prepare_store(inputs, tmp_path / "out", format="megatron", skip_bad=True, quiet=True)
    expected = megatron_files([[[1, 2, 3]], [[4, 5]]], "uint16")  # and b's id 70000 does not widen the dtype
    assert ((tmp_path / "out.bin").read_bytes(), (tmp_path / "out.idx").read_bytes()) == expected


def test_content_fingerprint_equals_the_same_documents_in_memory(tmp_path: Path) -> None:
    """The same documents (ids "0", "1", ...) have one content fingerprint, so plan files are shared with JSONL."""
    documents = [[0, 10, 11, 12, 1], [0, 20, 21, 1], [70_000, 3]]
    prefix = write_megatron(tmp_path / "c", [[d[:2], d[2:]] for d in documents], "int32")
    reference = sb.open_source(write_jsonl(tmp_path / "c.jsonl", documents)).store
    assert sb.open_source(prefix).store.content_fingerprint() == reference.content_fingerprint()


_KILL_AT_FILE_STEP = """
import os, sys
import streambatch as sb
from streambatch.io.formats import write_format
target, kill_at, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps = [0]
for name in ("replace", "unlink"):
    real = getattr(os, name)
    def step(*args, _real=real, **kwargs):
        if steps[0] == kill_at:
            os._exit(9)  # killed: nothing of the writer's cleanup runs
        steps[0] += 1
        return _real(*args, **kwargs)
    setattr(os, name, step)
write_format(target, [sb.Document("n", "train", [4, 5, 6, 7, 8]), sb.Document("m", "train", [9, 10])], kind)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["megatron", "datatrove", "datatrove, the old one masked"])
def test_a_replace_killed_at_every_rename_never_pairs_an_old_index_with_new_data(tmp_path: Path, kind: str) -> None:
    """A write over existing files killed before each of its renames and removals: the files are the old ones, the
    new ones, or the new data with no index (opening names what is missing); never an old index over new data, nor
    an old dataset without its loss mask.  The next write over them succeeds and leaves no temporary."""
    import subprocess
    import sys

    from tests.hostile import ENV

    fmt = kind.split(",")[0]
    data, index = ("c.bin", "c.idx") if fmt == "megatron" else ("c.ds", "c.ds.index")
    old_docs = [sb.Document("o", "train", [1, 2, 3])]
    old_mask = np.array([False, True, True]) if "masked" in kind else None
    new_docs = [sb.Document("n", "train", [4, 5, 6, 7, 8]), sb.Document("m", "train", [9, 10])]

    def files(folder: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in folder.iterdir() if ".partial-" not in p.name}

    write_format(tmp_path / "old" / "c", old_docs, fmt, loss_mask=old_mask)
    write_format(tmp_path / "new" / "c", new_docs, fmt)
    old, new = files(tmp_path / "old"), files(tmp_path / "new")
    target = tmp_path / "t"
    target.mkdir()
    seen = set()
    for kill_at in range(6):
        write_format(target / "c", old_docs, fmt, loss_mask=old_mask)
        done = subprocess.run([sys.executable, "-c", _KILL_AT_FILE_STEP, str(target / "c"), str(kill_at), fmt], env=ENV)
        assert done.returncode in (0, 9)
        got = files(target)
        if index not in got:
            assert got[data] in (old[data], new[data]), kill_at
            with pytest.raises(DataError, match=re.escape(index) + r"\b.*missing"):
                sb.open_source(target / data)
            seen.add("no index")
        else:
            assert got in (old, new), f"killed at step {kill_at}: files of two writes, {sorted(got)}"
            seen.add("old" if got == old else "new")
        write_format(target / "c", new_docs, fmt)  # the next writer: whole, and it removes what the dead one left
        assert files(target) == new
        assert sorted(os.listdir(target)) == sorted(new)
    assert {"old", "new", "no index"} <= seen


@pytest.mark.parametrize("kind", ["megatron", "datatrove"])
def test_a_replace_whose_data_rename_fails_leaves_the_old_files(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data file's rename fails (not a kill): a StoreError, and the old files (index and mask too) stand as they
    were, with no temporary left."""
    data = "c.bin" if kind == "megatron" else "c.ds"
    mask = np.array([False, True, True]) if kind == "datatrove" else None
    write_format(tmp_path / "c", [sb.Document("o", "train", [1, 2, 3])], kind, loss_mask=mask)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = os.replace

    def failing(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(target).endswith(os.sep + data):
            raise PermissionError(1, "Operation not permitted")
        real(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(StoreError, match="cannot write"):
        write_format(tmp_path / "c", [sb.Document("n", "train", [4, 5, 6, 7])], kind)
    monkeypatch.setattr(os, "replace", real)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert sb.open_source(tmp_path / data).store.flat_size == 3


def test_a_folder_holding_a_bin_without_its_index_is_refused(tmp_path: Path) -> None:
    """A .bin whose .idx is missing (a replace killed part way) is named, never silently left out of the folder's
    corpus; its prefix and its path name the missing index too."""
    folder = tmp_path / "d"
    folder.mkdir()
    write_format(folder / "a", [sb.Document("a", "train", [1, 2, 3])], "megatron")
    write_format(folder / "b", [sb.Document("b", "train", [4, 5])], "megatron")
    assert len(sb.open_source(folder).store) == 2
    os.unlink(folder / "b.idx")
    for named in (folder, folder / "b", folder / "b.bin"):
        with pytest.raises(DataError, match=r"b\.idx\b.*missing"):
            sb.open_source(named)
