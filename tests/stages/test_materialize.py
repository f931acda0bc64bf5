"""Tests for `streambatch.materialize`: batches gathered straight into final arrays."""

from __future__ import annotations

import numpy as np
import pytest

import streambatch as sb
from streambatch import AccumulationError
from streambatch.batch.minibatch import WindowProvenance
from streambatch.errors import RowIndexError
from streambatch.items.windows.gather import StoreGather
from streambatch.stages.materialize import Batches, materialize_one
from streambatch.tools.chapter import batch_contributions, build_epoch


def _batch() -> sb.MiniBatch:
    """Rows b@1, a@1, b@0: the chapter's first shuffled batch, gathered by the materialize stage."""
    docs = [sb.Document("a", "train", [0, 10, 11, 12, 1]), sb.Document("b", "train", [0, 20, 21, 1])]
    order = sb.shuffle(sb.windows(docs, context_length=2), seed=7)
    return materialize_one(order[:3], index=0)


def test_rows_are_shifted_by_one_and_contiguous() -> None:
    """Inputs are the first T tokens, targets the last T; both C-contiguous (width, T) arrays."""
    batch = _batch()
    assert batch.inputs.tolist() == [[20, 21], [10, 11], [0, 20]]
    assert batch.targets.tolist() == [[21, 1], [11, 12], [20, 21]]
    assert batch.inputs.flags.c_contiguous
    assert batch.targets.flags.c_contiguous
    assert not np.shares_memory(batch.inputs, batch.targets)
    assert (3, 2) == batch.shape
    assert 6 == batch.token_count


def test_provenance() -> None:
    """Each row knows its document id, index, start and partition."""
    batch = _batch()
    assert [str(p) for p in batch.provenance] == ["b@1", "a@1", "b@0"]
    assert WindowProvenance("b", 1, 1, sb.Partition.TRAIN) == batch.provenance[0]


def test_row_access_is_checked() -> None:
    """input_row/target_row raise RowIndexError (also an IndexError) out of range."""
    batch = _batch()
    assert batch.input_row(1).tolist() == [10, 11]
    for bad in (3, -1):
        with pytest.raises(RowIndexError, match=f"row={bad} is out of range for a batch of width 3"):
            batch.target_row(bad)
    assert issubclass(RowIndexError, IndexError)


def test_three_contributions_for_four_targets_is_an_error() -> None:
    """average_token_contributions needs exactly one contribution per target token."""
    final = list(build_epoch())[-1]
    contributions = batch_contributions(final)
    assert final.average_token_contributions(contributions).mean_loss == 0.4375
    with pytest.raises(AccumulationError, match="got 3 contributions for a batch of 4 target tokens"):
        final.average_token_contributions(contributions[:3])
    with pytest.raises(AccumulationError, match="got 5 contributions"):
        final.average_token_contributions([*contributions, contributions[0]])


def test_materialize_is_lazy_and_indexable() -> None:
    """Over Chunks, materialize gives a lazy Batches sequence; batches[i] gathers batch i alone."""
    docs = [sb.Document("a", "train", [0, 10, 11, 12, 1]), sb.Document("b", "train", [0, 20, 21, 1])]
    batches = sb.materialize(sb.chunk(sb.shuffle(sb.windows(docs, context_length=2), seed=7), 3))
    assert isinstance(batches, Batches)
    assert len(batches) == 2
    assert batches[1].index == 1
    assert [str(p) for p in batches[1].provenance] == ["a@0", "a@2"]
    assert list(batches[1:]) == [batches[1]]
    assert list(batches) == list(sb.materialize(iter(sb.chunk(sb.shuffle(sb.windows(docs, context_length=2), seed=7), 3))))


def test_one_gather_per_buffer_in_the_store_dtype() -> None:
    """StoreGather copies whole rows into fresh C-contiguous arrays of the store's dtype."""
    store = sb.DocumentStore.from_arrays(np.arange(10, dtype=np.uint16), [0, 10])
    inputs, targets = StoreGather(store.tokens, 3)(np.array([4, 0], dtype=np.intp))
    assert inputs.dtype == np.uint16
    assert inputs.tolist() == [[4, 5, 6], [0, 1, 2]]
    assert targets.tolist() == [[5, 6, 7], [1, 2, 3]]
    for gathered in (inputs, targets):  # fresh C-contiguous arrays, not views of the store's tokens
        assert gathered.flags.c_contiguous
        assert not np.shares_memory(gathered, store.tokens)
    empty_in, empty_out = StoreGather(store.tokens, 3)(np.zeros(0, dtype=np.intp))
    assert empty_in.shape == empty_out.shape == (0, 3)


def test_materialize_one_rejects_what_is_not_windows() -> None:
    """A chunk must be a Windows view."""
    with pytest.raises(sb.ConfigError, match=r"is not a streambatch\.Windows"):
        materialize_one([1, 2])  # type: ignore[arg-type]
