"""The corpus gather's shard lookup (issue 18, item 8): a bucket table, exact near shard ends, same rows and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.items.windows.gather import ShardedGather


def _corpus(sizes: list[int], seed: int) -> sb.Corpus:
    rng = np.random.default_rng(seed)
    shards = [
        sb.DocumentStore.from_arrays(rng.integers(0, 50, n).astype(np.uint16), [0, n], ids=[f"s{k}"]) for k, n in enumerate(sizes)
    ]
    return sb.Corpus(shards)


def _outcome(gather: ShardedGather, positions: np.ndarray, exact: bool) -> object:
    """The rows' records (or the DataError's message): by the table (`rows`) or the exact searchsorted path."""
    try:
        found = gather._checked(positions) if exact else gather.where(positions)
    except sb.DataError as error:
        return str(error)
    return found.tolist()


@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    context_length=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_table_lookup_equals_the_exact_path(sizes: list[int], context_length: int, seed: int, data: st.DataObject) -> None:
    """Valid and invalid positions (shard tails, empty shards, negative, past the end): same records, same refusal."""
    corpus = _corpus(sizes, seed)
    gather = ShardedGather(corpus.flat(), context_length)
    flat = corpus.flat_size
    positions = np.array(data.draw(st.lists(st.integers(-3, flat + 3), min_size=0, max_size=12)), dtype=np.intp)
    assert _outcome(gather, positions, exact=False) == _outcome(gather, positions, exact=True)
    valid = [
        p
        for b, e in zip(corpus.bases[:-1].tolist(), corpus.bases[1:].tolist(), strict=True)
        for p in range(b, e - context_length)
    ]
    if valid:  # every window start of every shard reads the right tokens
        inputs, targets = gather(np.array(valid, dtype=np.intp))
        expected = corpus.window_tokens(valid, context_length + 1)
        assert inputs.tolist() == expected[:, :-1].tolist()
        assert targets.tolist() == expected[:, 1:].tolist()


def test_rows_near_every_shard_end_take_the_exact_path() -> None:
    """Big shards, small buckets: positions on either side of each shard's last window start, and far outside."""
    corpus = _corpus([70_000, 5, 90_000, 0, 40_000], seed=3)
    gather = ShardedGather(corpus.flat(), context_length=7)
    assert gather._table is not None  # the spanning view, looked up by buckets
    ends = corpus.bases[1:].tolist()
    for end in ends:
        for p in (end - 9, end - 8):  # the last window start, and the one before it
            if p >= 0 and any(b <= p <= e - 8 for b, e in zip(corpus.bases[:-1].tolist(), ends, strict=True)):
                assert gather(np.array([p], dtype=np.intp))[0].tolist() == [corpus.window_tokens([p], 7)[0].tolist()]
    for bad in (ends[0] - 7, ends[0] - 1, ends[2] - 3, ends[-1], -1, -(2**40), 2**40):
        with pytest.raises(sb.DataError, match=f"row 1: position {bad} is not a window start inside a shard"):
            gather(np.array([0, bad, 1], dtype=np.intp))


def test_a_block_of_batches_is_mapped_once_and_sliced() -> None:
    """Epoch iteration maps each block's positions once (rows), then takes slices: equal to gathering each batch alone."""
    corpus = _corpus([300, 41, 257], seed=5)
    epoch = sb.Epoch(corpus, context_length=4, stride=3, batch_size=7, seed=11)
    gather = ShardedGather(corpus.flat(), 4)
    for batch in epoch:
        inputs, targets = gather(batch.positions)
        assert np.array_equal(batch.inputs, inputs)
        assert np.array_equal(batch.targets, targets)


@given(
    sizes=st.lists(st.integers(0, 30), min_size=2, max_size=40),
    wide=st.data(),
    context_length=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_per_shard_path_with_mixed_dtypes(sizes: list[int], wide: st.DataObject, context_length: int, seed: int) -> None:
    """uint16 and uint32 shards (no spanning view): each row from its own shard, widened, grouped per batch."""
    rng = np.random.default_rng(seed)
    dtypes = wide.draw(st.lists(st.sampled_from([np.uint16, np.uint32]), min_size=len(sizes), max_size=len(sizes)))
    dtypes[0] = np.uint32  # at least one wide shard: the corpus is uint32
    shards = [
        sb.DocumentStore.from_arrays(rng.integers(0, 60_000, n).astype(dtype), [0, n], ids=[f"s{k}"])
        for k, (n, dtype) in enumerate(zip(sizes, dtypes, strict=True))
    ]
    corpus = sb.Corpus(shards)
    gather = ShardedGather(corpus.flat(), context_length)
    valid = [
        p
        for b, e in zip(corpus.bases[:-1].tolist(), corpus.bases[1:].tolist(), strict=True)
        for p in range(b, e - context_length)
    ]
    if len(set(dtypes)) > 1:
        assert gather._table is None  # mixed dtypes: the per-shard path
    positions = np.array(rng.permutation(valid) if valid else [], dtype=np.intp)
    inputs, targets = gather(positions)
    assert inputs.dtype == np.uint32
    if valid:
        expected = corpus.window_tokens(positions, context_length + 1)
        assert inputs.tolist() == expected[:, :-1].tolist()
        assert targets.tolist() == expected[:, 1:].tolist()
    for lo in range(0, positions.size, 5):  # batches of 5 rows, as a block is sliced
        part_in, part_out = gather.take(gather.where(positions)[lo : lo + 5])
        assert part_in.tolist() == inputs[lo : lo + 5].tolist()
        assert part_out.tolist() == targets[lo : lo + 5].tolist()
