"""Tests for `streambatch.io.formats.datatrove` and ``prepare --format datatrove``: ``.ds``, ``.ds.index``, ``.ds.loss``."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import DataError
from streambatch.io.formats import IndexedStore, open_datatrove, write_format
from tests.format_files import (
    MemoryFile,
    assert_same_epochs,
    damage_sweep,
    datatrove_files,
    memory_opener,
    write_datatrove,
    write_jsonl,
)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


@st.composite
def token_files(draw: st.DrawFn) -> tuple[int, list[list[int]], list[list[bool]]]:
    """A token size (2 or 4), documents with ids that fit it, and one loss bool per token."""
    size = draw(st.sampled_from([2, 4]))
    top = 65_535 if size == 2 else 2**32 - 1
    documents = draw(st.lists(st.lists(st.integers(0, top), max_size=14), max_size=7))
    masks = [draw(st.lists(st.booleans(), min_size=len(d), max_size=len(d))) for d in documents]
    return size, documents, masks


@given(token_files(), st.integers(1, 4), st.integers(1, 5), st.one_of(st.none(), st.integers(0, 2**32)))
def test_independent_files_read_as_the_same_documents_as_jsonl(
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[int, list[list[int]], list[list[bool]]],
    t: int,
    b: int,
    seed: int | None,
) -> None:
    """Each document of the index is one document: the same windows and packed rows as JSONL; the loss bytes are the mask."""
    size, documents, masks = case
    folder = tmp_path_factory.mktemp("datatrove")
    path = write_datatrove(folder / "000_shuffled.ds", documents, size, masks)
    source = sb.open_source(path)
    assert source.kind == "datatrove"
    store = source.store
    assert [d.tokens.tolist() for d in store] == documents
    assert store.tokens.dtype.itemsize == (size if any(documents) else 2)
    assert store.file_loss_mask is not None
    assert store.file_loss_mask.tolist() == [m for mask in masks for m in mask]
    if not any(documents):
        return
    flat = [m for mask in masks for m in mask]
    offsets = np.cumsum([0, *map(len, documents)])
    tokens = np.array([x for d in documents for x in d], dtype=np.uint32)
    reference = sb.DocumentStore.from_arrays(tokens, offsets, loss_mask=flat)  # a document may train nothing here
    assert store.has_loss_mask
    assert [d.loss_mask.tolist() for d in store] == [d.loss_mask.tolist() for d in reference]
    assert_same_epochs(store, reference, context_length=t, batch_size=b, seed=seed)


def test_end_offsets_are_tokens_not_bytes(tmp_path: Path) -> None:
    """``.ds.index`` counts tokens (datatrove's ``TokenizedFile.write_bytes`` adds ``len(bytes) // token_size``)."""
    (tmp_path / "a.ds").write_bytes(struct.pack("<5I", 1, 2, 3, 70_000, 5))
    (tmp_path / "a.ds.index").write_bytes(struct.pack("<2Q", 3, 5))
    store = open_datatrove(tmp_path / "a.ds")
    assert [d.tokens.tolist() for d in store] == [[1, 2, 3], [70_000, 5]]
    assert store.file_loss_mask is None


def test_a_folder_of_files_is_one_corpus(tmp_path: Path) -> None:
    """A folder of ``.ds`` files opens as one corpus, in name order, ids ``NAME.ds:i``."""
    write_datatrove(tmp_path / "001.ds", [[5, 6, 7]])
    write_datatrove(tmp_path / "000.ds", [[1, 2], [3, 4, 9]])
    source = sb.open_source(tmp_path)
    assert source.kind == "datatrove"
    assert source.store.ids == ("000.ds:0", "000.ds:1", "001.ds:0")
    assert [d.tokens.tolist() for d in source.store] == [[1, 2], [3, 4, 9], [5, 6, 7]]
    reference = sb.open_source(
        write_jsonl(tmp_path / "docs.txt", [[1, 2], [3, 4, 9], [5, 6, 7]], ["000.ds:0", "000.ds:1", "001.ds:0"])
    )
    assert_same_epochs(source.store, reference.store, context_length=1, batch_size=2, seed=3)


@pytest.mark.parametrize(("top", "size"), [(65_535, 2), (65_536, 4)])
def test_written_files_are_datatroves_bytes(tmp_path: Path, top: int, size: int) -> None:
    """``write_format(..., "datatrove")`` writes the bytes ``TokenizedFile`` writes; 2-byte tokens up to 65,536 ids."""
    documents = [[0, 5, top], [], [7, 8, 9, 1]]
    masks = [[True, False, True], [], [False, True, True, True]]
    flat = np.array([m for mask in masks for m in mask])
    docs = [sb.Document(f"d{i}", "train", d) for i, d in enumerate(documents)]
    write_format(tmp_path / "out.ds", docs, "datatrove", loss_mask=flat)
    expected = datatrove_files(documents, size, masks)
    assert ((tmp_path / "out.ds").read_bytes(), (tmp_path / "out.ds.index").read_bytes(),
            (tmp_path / "out.ds.loss").read_bytes()) == expected  # fmt: skip


def test_prepare_format_datatrove_round_trips(tmp_path: Path) -> None:
    """``prepare --format datatrove`` from JSONL: datatrove's bytes, and the epoch of the JSONL it came from."""
    documents = [[0, 10, 11, 12, 1], [0, 20, 21, 1], [3, 4, 5, 6, 7, 8, 9]]
    jsonl = write_jsonl(tmp_path / "in.jsonl", documents)
    code, _ = cli("prepare", str(jsonl), "-o", str(tmp_path / "corpus"), "--format", "datatrove", "-q")
    assert code == 0
    tokens, index, _ = datatrove_files(documents, 2)
    assert ((tmp_path / "corpus.ds").read_bytes(), (tmp_path / "corpus.ds.index").read_bytes()) == (tokens, index)
    assert sorted(os.listdir(tmp_path)) == ["corpus.ds", "corpus.ds.index", "in.jsonl"]
    assert_same_epochs(sb.open_source(tmp_path / "corpus.ds").store, sb.open_source(jsonl).store,
                       context_length=3, batch_size=2, seed=None)  # fmt: skip


def test_rewriting_without_a_mask_removes_the_old_one(tmp_path: Path) -> None:
    """A ``.ds.loss`` left from an earlier write would describe other tokens: writing without masks removes it."""
    write_datatrove(tmp_path / "c.ds", [[1, 2]], 2, [[True, True]])
    write_format(tmp_path / "c.ds", [sb.Document("a", "train", [1, 2, 3])], "datatrove")
    assert not (tmp_path / "c.ds.loss").exists()
    assert open_datatrove(tmp_path / "c.ds").file_loss_mask is None


def test_pickled_store_maps_the_files_again(tmp_path: Path) -> None:
    """A store pickles as its path, not its tokens."""
    path = write_datatrove(tmp_path / "c.ds", [list(range(1000)), [1, 2]], 2, [[True] * 1000, [False, True]])
    store = open_datatrove(path)
    data = pickle.dumps(store)
    assert len(data) < 1000
    copy = pickle.loads(data)
    assert copy.lengths.tolist() == [1000, 2]
    assert copy.file_loss_mask is not None
    assert copy.file_loss_mask[-2:].tolist() == [False, True]


BAD = {
    "index not whole": (lambda p: _cut(Path(f"{p}.index"), 3), r"c\.ds\.index.*not a whole number of uint64"),
    "ends not monotone": (lambda p: _write(Path(f"{p}.index"), struct.pack("<3Q", 3, 2, 6)), "ends are not monotone"),
    "tokens truncated": (lambda p: _cut(p, 4), r"c\.ds.*neither 2 nor 4 bytes per token"),
    "tokens longer": (lambda p: _write(Path(f"{p}.index"), struct.pack("<3Q", 2, 3, 5)), "neither 2 nor 4"),
    "loss wrong size": (lambda p: _cut(Path(f"{p}.loss"), 1), r"c\.ds\.loss.*5 bytes, but .* holds 6 tokens"),
    "loss not a bool": (lambda p: _write(Path(f"{p}.loss"), bytes([1, 0, 2, 1, 1, 1])), "byte 2 is 2; a loss byte is 0 or 1"),
    "index missing": (lambda p: os.unlink(f"{p}.index"), r"c\.ds\.index: missing"),
}


def _cut(path: Path, count: int) -> None:
    path.write_bytes(path.read_bytes()[:-count])


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_files_are_data_errors_naming_the_file(tmp_path: Path, kind: str) -> None:
    """Each broken file is a `DataError` naming it and the rule, at open or at first use."""
    path = write_datatrove(tmp_path / "c.ds", [[1, 2, 3], [4], [5, 6]], 2, [[True] * 3, [True], [False, True]])
    damage, message = BAD[kind]
    damage(path)
    with pytest.raises(DataError, match=message):
        _used(path)


def _used(path: Path) -> None:
    """Open *path* and use every array (they are checked at first use)."""
    store = sb.open_source(path).store
    assert isinstance(store, IndexedStore)
    assert store.lengths.size + store.tokens.size + (0 if store.file_loss_mask is None else store.file_loss_mask.size) >= 0


def test_dtype_can_be_given(tmp_path: Path) -> None:
    """The token size found from the sizes can be overridden; one that does not divide the file is refused."""
    (tmp_path / "a.ds").write_bytes(struct.pack("<4H", 1, 0, 2, 0))
    (tmp_path / "a.ds.index").write_bytes(struct.pack("<Q", 4))
    assert open_datatrove(tmp_path / "a.ds").lengths.tolist() == [4]
    with pytest.raises(DataError, match=r"2 uint32 tokens, but .* ends at token 4"):
        open_datatrove(tmp_path / "a.ds", dtype="uint32")


def test_readers_read_only_through_the_opener() -> None:
    """Every byte comes through the opener's `ByteSource` as arrays (the three files' contents are never read whole)."""
    tokens, index, loss = datatrove_files([[1, 2, 3], [4, 5]], 4, [[False, True, True], [True, True]])
    assert loss is not None
    opened: dict[str, MemoryFile] = {}
    files = {"s3/a.ds": tokens, "s3/a.ds.index": index, "s3/a.ds.loss": loss}
    store = open_datatrove("s3/a.ds", opener=memory_opener(files, opened))
    assert [d.tokens.tolist() for d in store] == [[1, 2, 3], [4, 5]]
    assert store.file_loss_mask is not None
    assert store.file_loss_mask.tolist() == [False, True, True, True, True]
    assert all(f.reads == [] for f in opened.values())


@given(token_files())
def test_written_bytes_equal_datatroves_for_any_documents(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[int, list[list[int]], list[list[bool]]]
) -> None:
    """For any documents and masks: ``TokenizedFile``'s bytes, 2-byte tokens when every id is below 65,536."""
    _, documents, masks = case
    top = max((t for d in documents for t in d), default=-1)
    folder = tmp_path_factory.mktemp("write")
    flat = np.array([m for mask in masks for m in mask], dtype=bool)
    docs = [sb.Document(f"d{i}", "train", d) for i, d in enumerate(documents)]
    write_format(folder / "c.ds", docs, "datatrove", loss_mask=flat)
    tokens, index, loss = datatrove_files(documents, 2 if top < 65_536 else 4, masks)
    assert (folder / "c.ds").read_bytes() == tokens
    assert (folder / "c.ds.index").read_bytes() == index
    assert (folder / "c.ds.loss").read_bytes() == loss


def test_prepare_reads_ds_files_with_their_index(tmp_path: Path) -> None:
    """``prepare`` of a folder reads each ``.ds`` by its ``.ds.index`` (the index and loss files are not inputs)."""
    data = tmp_path / "data"
    data.mkdir()
    write_datatrove(data / "a.ds", [[1, 2], [3]], 2, [[True, True], [False]])
    (data / "notes.txt").write_text("hi")
    store = sb.prepare_store([data], tmp_path / "store", quiet=True, eos_id=None, bos_id=None)
    assert [(d.id, d.tokens.tolist()) for d in store] == [("a.ds:0", [1, 2]), ("a.ds:1", [3]), ("notes.txt", [104, 105])]
    with pytest.raises(DataError, match=r"a\.ds\.index: part of datatrove's files; pass the \.ds file"):
        sb.prepare_store([data / "a.ds.index"], tmp_path / "other", quiet=True)


def test_any_damage_is_a_data_error_or_reads(tmp_path: Path) -> None:
    """Bytes of any of the three files overwritten or cut anywhere: the files read, or a `DataError` names the file."""

    def make(folder: Path, rng: random.Random) -> tuple[Path, Path]:
        masks = [[True] * 3, [True], [False, True]]
        path = write_datatrove(folder / "c.ds", [[1, 2, 3], [4], [5, 6]], rng.choice([2, 4]), masks)
        return path, Path(str(path) + rng.choice(["", ".index", ".loss"]))

    def read(path: Path) -> None:
        store = open_datatrove(path)
        assert [len(d) for d in store] == store.lengths.tolist()
        assert store.file_loss_mask is None or store.file_loss_mask.size == store.tokens.size

    damage_sweep(1, make, read, tmp_path)


def test_a_mixture_file_names_megatron_and_datatrove_sources(tmp_path: Path) -> None:
    """``mixture.json`` sources may be Megatron or datatrove files: the blend equals the same blend of stores."""
    from tests.format_files import write_megatron

    web = [[1, 2, 3, 4], [5, 6, 7]]
    code = [[8, 9, 10], [11, 12, 13, 14, 15]]
    write_datatrove(tmp_path / "web.ds", web)
    write_megatron(tmp_path / "code", [[d] for d in code], "uint16")
    sb.write_store(tmp_path / "web", [sb.Document(str(i), "train", d) for i, d in enumerate(web)])
    sb.write_store(tmp_path / "code_store", [sb.Document(str(i), "train", d) for i, d in enumerate(code)])
    for name, paths in (("files.json", ("web.ds", "code.idx")), ("stores.json", ("web", "code_store"))):
        sources = [{"name": "web", "path": paths[0], "weight": 0.6}, {"name": "code", "path": paths[1], "weight": 0.4}]
        (tmp_path / name).write_text(json.dumps({"sources": sources}))
    files = sb.Epoch(sb.open_source(tmp_path / "files.json"), context_length=2, batch_size=3, seed=5)
    stores = sb.Epoch(sb.open_source(tmp_path / "stores.json"), context_length=2, batch_size=3, seed=5)
    batches = list(zip(files, stores, strict=True))
    assert batches
    for a, b in batches:
        assert a.inputs.tolist() == b.inputs.tolist()
        assert a.targets.tolist() == b.targets.tolist()


@pytest.mark.parametrize("suffix", ["", ".index", ".loss"])
def test_any_of_the_three_files_opens_them(tmp_path: Path, suffix: str) -> None:
    """``open_source`` takes the ``.ds`` file or either of its companions."""
    path = write_datatrove(tmp_path / "c.ds", [[1, 2], [3]], 2, [[True, False], [True]])
    assert [d.tokens.tolist() for d in sb.open_source(f"{path}{suffix}").store] == [[1, 2], [3]]


@given(
    st.lists(st.lists(st.integers(0, 500), min_size=2, max_size=12), min_size=1, max_size=5).flatmap(
        lambda docs: st.tuples(
            st.just(docs),
            st.tuples(*(st.lists(st.booleans(), min_size=len(d) - 1, max_size=len(d) - 1) for d in docs)).filter(
                lambda masks: all(any(m) for m in masks)  # JSONL refuses a document that trains nothing
            ),
        )
    ),
    st.integers(1, 4),
    st.integers(1, 4),
    st.booleans(),
)
def test_a_ds_loss_epoch_counts_what_its_jsonl_loss_mask_counts(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[list[int]], tuple[list[bool], ...]], t: int, b: int, pack: bool
) -> None:
    """``.ds.loss`` is the store's loss mask: an epoch over it keeps, masks and counts what JSONL ``loss_mask`` does."""
    documents, tails = case
    masks = [[False, *tail] for tail in tails]  # position 0 is never a target: JSONL and .ds.loss agree there
    folder = tmp_path_factory.mktemp("counted")
    store = sb.open_source(write_datatrove(folder / "a.ds", documents, 2, masks)).store
    reference = sb.open_source(write_jsonl(folder / "a.jsonl", documents, masks=masks)).store
    assert store.has_loss_mask
    assert reference.has_loss_mask
    mine = sb.Epoch(store, context_length=t, batch_size=b, seed=5, pack=pack)
    theirs = sb.Epoch(reference, context_length=t, batch_size=b, seed=5, pack=pack)
    counts = [(x.token_count, y.token_count) for x, y in zip(mine, theirs, strict=True)]
    assert [x for x, _ in counts] == [y for _, y in counts]
    assert mine.items.counted_targets() == theirs.items.counted_targets() == sum(x for x, _ in counts)
    for x, y in zip(mine, theirs, strict=True):
        assert x.loss_mask is not None
        assert np.array_equal(x.loss_mask, y.loss_mask)
        assert int(x.loss_mask.sum()) == x.token_count


def test_megatron_files_hold_no_loss_bits(tmp_path: Path) -> None:
    """A Megatron store has no loss mask: every target counts."""
    from tests.format_files import write_megatron

    store = sb.open_source(write_megatron(tmp_path / "m", [[[1, 2, 3, 4]]], "uint16")).store
    assert store.loss_bits is None
    assert not store.has_loss_mask
    assert next(iter(sb.Epoch(store, context_length=2, batch_size=4, seed=None))).token_count == 2 * 2
