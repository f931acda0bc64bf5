"""Tests for streambatch/items/pack/rows.py and packed_batch.py: sb.pack, Rows as items, packed MiniBatch, the C gather."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.batch.minibatch import MiniBatch, SegmentProvenance
from streambatch.errors import ConfigError, DataError, OutOfRangeError, PartitionError
from streambatch.items.pack import rows as rows_module

needs_c = pytest.mark.skipif(not _kernels.available()["packed_gather"], reason="the C packed gather is not built")

DOCS = [
    sb.Document("a", "train", [0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 1]),  # 11 tokens: 10 targets
    sb.Document("one", "train", [5]),  # one token: no target, skipped
    sb.Document("c", "train", [0, 30, 31, 1]),  # 3 targets
    sb.Document("e", "train", []),  # empty
    sb.Document("f", "train", [0, 40, 1]),  # 2 targets
]


def _random_store(count: int = 40, T: int = 6, seed: int = 0, dtype: type = np.uint16) -> sb.DocumentStore:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5 * T, count)
    tokens = rng.integers(0, np.iinfo(dtype).max, int(lengths.sum()), dtype=np.int64).astype(dtype)
    return sb.DocumentStore.from_arrays(tokens, np.concatenate([[0], np.cumsum(lengths)]))


def test_worked_example() -> None:
    """T=4: a's two full pieces fill rows 0-1; a's tail (2), c (3), f (2) are packed best-fit decreasing."""
    rows = sb.pack(DOCS, context_length=4)
    r = rows.report
    assert (len(rows), r.full_rows, r.packed_rows, r.targets, r.skipped_pieces, r.pad_positions) == (4, 2, 2, 15, 1, 1)
    batch = sb.materialize(sb.chunk(rows, 4))[0]
    assert isinstance(batch, MiniBatch)
    assert batch.packed
    assert batch.shape == (4, 4)
    assert batch.inputs.tolist() == [[0, 10, 11, 12], [13, 14, 15, 16], [0, 30, 31, 0], [17, 18, 0, 40]]
    assert batch.targets.tolist() == [[10, 11, 12, 13], [14, 15, 16, 17], [30, 31, 1, 0], [18, 1, 40, 1]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, -1], [0, 0, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]
    assert batch.loss_mask.sum() == batch.target_count == batch.token_count == 15
    assert batch.pad_count == 1
    assert batch.cu_seqlens.tolist() == [0, 4, 8, 11, 12, 14, 16]
    assert batch.max_seqlen == 4
    assert batch.sequence_is_pad.tolist() == [False, False, False, True, False, False]
    assert [str(p) for p in batch.provenance] == ["a@0+4", "a@4+4", "c@0+3", "a@8+2", "f@0+2"]
    assert batch.provenance[3] == SegmentProvenance("a", 0, 8, sb.Partition.TRAIN, 0, 2, 3)
    assert batch.row_numbers.tolist() == [0, 1, 2, 3]
    assert batch.document_ids == ["a", "a", "c", "a", "f"]


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("T", [1, 3, 6, 64, 1500])  # 1500: tails longer than the copy's 1 KB chunk
def test_c_gather_equals_numpy_gather(dtype: type, T: int) -> None:
    """The C kernel and the numpy gather give the same arrays, ids, masks, cu_seqlens and provenance.

    The C side must be the C kernel: without the built extension this would compare numpy with numpy, so it fails.
    """
    if not _kernels.available()["packed_gather"]:
        pytest.fail("streambatch._row_gather is not built: run `python setup.py build_ext --inplace` (.ci/run builds it)")
    store = _random_store(T=T, dtype=dtype)
    rows = sb.shuffle(sb.pack(store, context_length=T, pad_id=7), seed=3)
    with _kernels.use("packed_gather", "python"):
        slow_batches = list(sb.materialize(sb.chunk(rows, 5)))
    with _kernels.use("packed_gather", "c"):
        fast_batches = list(sb.materialize(sb.chunk(rows, 5)))
    assert len(fast_batches) == len(slow_batches) > 0
    for fast, reference in zip(fast_batches, slow_batches, strict=True):
        assert fast == reference
        assert fast.inputs.dtype == np.dtype(dtype)
        assert fast.inputs.flags.c_contiguous
        assert fast.sequence_is_pad.tolist() == reference.sequence_is_pad.tolist()  # type: ignore[union-attr]
    assert isinstance(rows_module.packed_gatherer(rows.space), _kernels.built("packed_gather").Gatherer)  # C ran


def test_rows_are_items_for_every_stage() -> None:
    """shuffle, chunk (short final batch kept), share over workers, split_rows over ranks, materialize."""
    rows = sb.pack(_random_store(T=5), context_length=5)
    ordered = sb.shuffle(rows, seed=11)
    chunks = sb.chunk(ordered, 4)
    assert chunks.widths == [4] * (len(rows) // 4) + ([len(rows) % 4] if len(rows) % 4 else [])
    whole = [b.row_numbers.tolist() for b in sb.materialize(chunks)]
    assert [n for w in whole for n in w] == list(ordered)
    by_worker = {b.index: b.row_numbers.tolist() for k in range(3) for b in sb.materialize(sb.share(chunks, worker=k, workers=3))}
    assert [by_worker[i] for i in range(len(chunks))] == whole
    for index, batch in enumerate(whole):
        parts = [sb.materialize(sb.split_rows(chunks, r, 3))[index].row_numbers.tolist() for r in range(3)]
        assert [n for p in parts for n in p] == batch
    assert ordered[2:5].numbers().tolist() == list(ordered)[2:5]
    assert ordered[-1] == list(ordered)[-1]
    assert ordered[::2].numbers().tolist() == list(ordered)[::2]


def test_iterating_and_indexing_give_the_same_batches() -> None:
    """Batches' block iteration (row numbers read a block at a time) equals indexing one batch at a time."""
    rows = sb.shuffle(sb.pack(_random_store(count=80, T=4), context_length=4), seed=5)
    batches = sb.materialize(sb.chunk(rows, 3))
    assert list(batches) == [batches[i] for i in range(len(batches))]
    assert [b.index for b in batches[1::2]] == list(range(1, len(batches), 2))


def test_pack_follows_the_partition_rule() -> None:
    """Another partition's document is refused, or skipped with keep_partition."""
    docs = [*DOCS, sb.Document("v", "validation", [0, 1, 2, 3, 4])]
    with pytest.raises(PartitionError):
        sb.pack(docs, context_length=4)
    kept = sb.pack(docs, context_length=4, keep_partition=True)
    assert kept.report.targets == 15
    assert sb.pack(docs, context_length=4, partition="validation", keep_partition=True).report.targets == 4


def test_refusals() -> None:
    """Bad pad ids, strides in packed mode, windows passed with pack=True, rows out of range."""
    with pytest.raises(ConfigError, match="pad_id"):
        sb.pack(DOCS, context_length=4, pad_id=-1)
    with pytest.raises(ConfigError, match="stride"):
        sb.Epoch(DOCS, context_length=4, stride=2, batch_size=2, pack=True)
    with pytest.raises(ConfigError, match="pack=True"):
        sb.Epoch(sb.windows(DOCS, context_length=4), batch_size=2, pack=True)
    rows = sb.pack(DOCS, context_length=4)
    with pytest.raises(OutOfRangeError):
        rows[4]
    with pytest.raises(DataError, match="row"):
        rows_module.emit(rows.space, np.array([0, 9], dtype=np.int64), 0)


def test_corpus_and_memory_mapped_store(tmp_path: Path) -> None:
    """A corpus of two shards and a store read from disk give the batches of the same documents in memory."""
    store = _random_store(T=5, seed=4)
    docs = list(store)
    half = len(docs) // 2
    corpus = sb.Corpus([sb.DocumentStore.from_documents(docs[:half]), sb.DocumentStore.from_documents(docs[half:])])
    sb.write_store(tmp_path / "store", store)
    expected = list(sb.Epoch(store, context_length=5, batch_size=3, seed=2, pack=True))
    for source in (corpus, sb.open_store(tmp_path / "store")):
        got = list(sb.Epoch(source, context_length=5, batch_size=3, seed=2, pack=True))
        assert [b.inputs.tolist() for b in got] == [b.inputs.tolist() for b in expected]
        key = [[(p.document_id, p.document_index, p.start, p.length, p.row) for p in b.provenance] for b in expected]
        assert [[(p.document_id, p.document_index, p.start, p.length, p.row) for p in b.provenance] for b in got] == key
    packed = sb.Epoch(corpus, context_length=5, batch_size=3, seed=None, pack=True)
    assert {p.shard for b in packed for p in b.provenance} == {0, 1}


def test_rows_pickle_with_their_packing() -> None:
    """A worker process gets the same rows (and batches) from a pickled Rows."""
    rows = sb.shuffle(sb.pack(DOCS, context_length=3), seed=1)
    again = pickle.loads(pickle.dumps(rows))
    assert list(again) == list(rows)
    assert again.shuffle_state_after == rows.shuffle_state_after
    assert list(sb.materialize(sb.chunk(again, 2))) == list(sb.materialize(sb.chunk(rows, 2)))


def test_average_token_contributions_counts_real_targets_only() -> None:
    """One contribution per real target; padding is never a contribution."""
    batch = sb.materialize(sb.chunk(sb.pack(DOCS, context_length=4), 4))[0]
    contributions = [sb.TokenContribution(float(t), [1.0]) for t in batch.targets[batch.loss_mask]]
    mean = batch.average_token_contributions(contributions)
    assert mean.token_count == 15
    assert mean.mean_loss == pytest.approx(float(batch.targets[batch.loss_mask].mean()))
    with pytest.raises(sb.AccumulationError, match="real targets"):
        batch.average_token_contributions([*contributions, contributions[0]])


@needs_c
@pytest.mark.kernels
@pytest.mark.parametrize("mixed", [False, True])
def test_corpus_gather_equals_numpy(mixed: bool) -> None:
    """A corpus of shards: the C gather reads one span over them (mixed dtypes: numpy); the same batches."""
    stores = [_random_store(count=15, T=4, seed=s, dtype=np.uint32 if mixed and s == 1 else np.uint16) for s in range(3)]
    shards = [
        sb.DocumentStore.from_arrays(
            s.tokens, np.concatenate([[0], np.cumsum(s.lengths)]), ids=[f"{k}-{i}" for i in range(len(s))]
        )
        for k, s in enumerate(stores)
    ]
    corpus = sb.Corpus(shards)
    rows = sb.shuffle(sb.pack(corpus, context_length=4), seed=6)
    with _kernels.use("packed_gather", "python"):
        slow = list(sb.materialize(sb.chunk(rows, 3)))
    assert list(sb.materialize(sb.chunk(rows, 3))) == slow
    assert (rows_module.packed_gatherer(rows.space) is not False) == (not mixed)  # mixed dtypes: numpy


def test_numpy_gather_refuses_foreign_rows_as_the_c_gather_does() -> None:
    """A row number past the packing is a DataError on either gather backend."""
    rows = sb.pack(DOCS, context_length=4)
    with _kernels.use("packed_gather", "python"):  # the numpy gather, as without the C extension
        with pytest.raises(DataError, match="do not belong to this packing"):
            rows_module.emit(rows.space, np.array([0, 9], dtype=np.int64), 0)
        assert rows_module.emit(rows.space, np.array([0], dtype=np.int64), 0).target_count > 0


@needs_c
@pytest.mark.kernels
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(2, 9), keep=st.floats(0.0, 1.0))
def test_the_c_gather_refuses_exactly_the_rows_reaching_past_its_tokens(seed: int, T: int, keep: float) -> None:
    """The gatherer checks every piece and tail once, when it is made: over tokens cut short (a packing that does
    not belong to them), each row whose segments all lie inside them gathers as over the whole tokens, and each
    other row is refused (one of several rows refuses the batch), never read past the end."""
    store = _random_store(count=30, T=T, seed=seed)
    rows = sb.pack(store, context_length=T)
    whole = rows_module.packed_gatherer(rows.space)
    packing, cut = rows.packing, int(store.tokens.size * keep)
    full_docs, full_ends = packing.index.full_pieces()
    args = (store.tokens[:cut], store.starts, packing.index.lengths, full_docs, full_ends, packing.offsets, packing.tails)
    short = _kernels.built("packed_gather").Gatherer(*(np.ascontiguousarray(a) for a in args), T, packing.full_rows, 0, None)
    for r in range(len(rows)):
        number = np.array([r], dtype=np.int64)
        expected = whole.gather(number)
        segments = expected[6]
        inside = bool(np.all(store.starts[segments[1]] + segments[2] + segments[3] < cut))
        if inside:
            got = short.gather(number)
            for a, b in zip(got[:7], expected[:7], strict=True):
                np.testing.assert_array_equal(a, b)
            assert got[7:] == expected[7:]
        else:
            with pytest.raises(ValueError, match="outside the source's tokens"):
                short.gather(number)
            with pytest.raises(ValueError, match="outside the source's tokens"):
                short.gather_tokens(np.array([r, 0], dtype=np.int64) if len(rows) > 1 else number)


@needs_c
@pytest.mark.kernels
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 40), data=st.data())
def test_the_next_batch_hint_changes_nothing(seed: int, T: int, data: st.DataObject) -> None:
    """``gather_tokens(rows, next)`` (and ``gather``) ask for the next batch's look-ups and first tokens along the
    copy: every array is the one of a call without the hint, for any next (rows of the packing, out of range,
    negative, empty, None), and a row the call refuses is refused the same way."""
    rows = sb.pack(_random_store(count=30, T=T, seed=seed), context_length=T)
    gatherer = rows_module.packed_gatherer(rows.space)
    n = len(rows)
    numbers = np.array(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20)) if n else [], dtype=np.int64)
    hint = data.draw(st.one_of(st.none(), st.lists(st.integers(-(2**62), 2**62) | st.integers(0, n + 2), max_size=20)))
    next_rows = None if hint is None else np.array(hint, dtype=np.int64)
    for call in (gatherer.gather_tokens, gatherer.gather):
        plain, hinted = call(numbers), call(numbers, next_rows)
        assert [a.tolist() if isinstance(a, np.ndarray) else a for a in plain] == [
            a.tolist() if isinstance(a, np.ndarray) else a for a in hinted
        ]
    bad = np.array([n], dtype=np.int64)
    for args in ((bad,), (bad, numbers)):
        with pytest.raises(ValueError, match="row 0 of the batch: row number out of range"):
            gatherer.gather_tokens(*args)
