"""`tensor_batch`: every kind of batch wraps to a `TensorBatch` whose tensors equal the batch's arrays, whatever
road made it (the plain-window fast path included), and ``positions`` becomes a tensor on its first read."""

from __future__ import annotations

import pickle
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

import streambatch as sb
from streambatch.torch.tensors import IGNORE_INDEX, TensorBatch, tensor_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _store(masked: bool) -> sb.DocumentStore:
    rng = np.random.default_rng(5)
    lengths = rng.integers(20, 60, size=12)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 1000, size=int(offsets[-1]), dtype=np.uint16)
    mask = rng.random(tokens.size) < 0.6 if masked else None
    return sb.DocumentStore.from_arrays(tokens, offsets, loss_mask=mask)


def _batches() -> dict[str, sb.MiniBatch]:
    plain, masked = _store(False), _store(True)
    windows = sb.Epoch(plain, context_length=8, batch_size=4, seed=1)
    return {
        "plain": windows[0],
        "masked": sb.Epoch(masked, context_length=8, batch_size=4, seed=1)[0],
        "share": windows.batches(rank=1, world_size=2)[0],
        "packed": sb.Epoch(masked, context_length=16, batch_size=3, seed=2, pack=True)[0],
        "mixture": sb.mix([sb.windows(plain, context_length=8), sb.windows(masked, context_length=8)], [1, 1], seed=3)
        .view(0, 4)
        .gather(0),
    }


def test_plain_is_only_a_batch_of_windows_and_nothing_more() -> None:
    found = {name: batch.plain for name, batch in _batches().items()}
    assert found == {"plain": True, "masked": False, "share": False, "packed": False, "mixture": False}


@pytest.mark.parametrize("name", ["plain", "masked", "share", "packed", "mixture"])
@pytest.mark.parametrize("dtype", [None, torch.long])
def test_every_field_equals_the_batch(name: str, dtype: torch.dtype | None) -> None:
    batch = _batches()[name]
    wrapped = tensor_batch(batch, dtype=dtype)
    assert (wrapped.index, wrapped.epoch) == (batch.index, batch.epoch)
    assert wrapped.global_token_count == batch.global_token_count
    assert wrapped.token_count == batch.token_count
    mask = batch.loss_mask
    targets = batch.targets.astype(np.int64)
    if dtype is not None and mask is not None:
        targets = np.where(mask, targets, IGNORE_INDEX)
    assert np.array_equal(wrapped.inputs.numpy(), batch.inputs)
    assert np.array_equal(wrapped.targets.numpy(), targets)
    assert isinstance(wrapped.positions, torch.Tensor)
    assert np.array_equal(wrapped.positions.numpy(), batch.positions)
    assert (wrapped.loss_mask is None) == (mask is None)
    if mask is not None:
        assert wrapped.loss_mask is not None
        assert np.array_equal(wrapped.loss_mask.numpy(), mask)
    assert (wrapped.sources is None) == (batch.sources is None)
    if batch.sources is not None:
        assert wrapped.sources is not None
        assert np.array_equal(wrapped.sources.numpy(), batch.sources)
    assert wrapped.packed == batch.packed
    if batch.packed:
        assert wrapped.segment_ids is not None and wrapped.position_ids is not None  # noqa: PT018
        assert wrapped.segment_ids.dtype == wrapped.position_ids.dtype == torch.int32
        assert np.array_equal(wrapped.segment_ids.numpy(), batch.segment_ids)
        assert np.array_equal(wrapped.position_ids.numpy(), batch.position_ids)
        assert wrapped.max_seqlen == batch.max_seqlen


def test_positions_become_a_tensor_once_and_survive_pickle_and_replace() -> None:
    wrapped = tensor_batch(_batches()["plain"], dtype=None)
    assert isinstance(wrapped.__dict__["_positions"], np.ndarray)  # nobody read it yet: no tensor made
    first = wrapped.positions
    assert wrapped.positions is first  # made once, kept
    fresh = tensor_batch(_batches()["plain"])  # torch.long: torch 2.13's pickle refuses uint16 tensors
    for other in (pickle.loads(pickle.dumps(fresh)), replace(wrapped, epoch=3)):
        assert torch.equal(other.positions, first)
    assert [f.name for f in fields(TensorBatch)][:5] == ["index", "inputs", "targets", "positions", "epoch"]
    with pytest.raises(TypeError, match="positions"):
        TensorBatch(0, first, first)  # type: ignore[call-arg]
