"""Tests for streambatch/batch/minibatch.py: one `MiniBatch` class for windows, packed rows, mixtures and packed mixtures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import ConfigError, DataError
from streambatch.items.pack.rows import GATHER_BACKEND
from streambatch.stages import batch as batch_module

PACKED = ("loss_mask", "segment_ids", "position_ids", "cu_seqlens", "max_seqlen")


def _docs(lengths: list[int], base: int = 0) -> list[sb.Document]:
    return [sb.Document(f"d{base + i}", "train", [1 + (7 * i + j) % 50 for j in range(n)]) for i, n in enumerate(lengths)]


def _kinds(lengths: list[int], T: int) -> dict[str, Any]:
    a, b = _docs(lengths), _docs(lengths[::-1], base=100)
    return {
        "windows": sb.windows(a, context_length=T),
        "packed": sb.pack(a, context_length=T),
        "mixture": sb.mix([sb.windows(a, context_length=T), sb.windows(b, context_length=T)], [1, 2], seed=3),
        "packed mixture": sb.mix([sb.pack(a, context_length=T), sb.pack(b, context_length=T)], [2, 1], seed=3),
    }


def test_every_item_kind_gives_the_one_batch_class() -> None:
    """Windows, packed rows, mixtures and packed mixtures: every batch is exactly `sb.MiniBatch`, by index and by iteration."""
    for name, items in _kinds([9, 4, 13, 6], T=3).items():
        batches = sb.materialize(sb.chunk(items, 4))
        for batch in [*batches, batches[0]]:
            assert type(batch) is sb.MiniBatch, name
            assert batch.packed == ("packed" in name)
            assert (batch.sources is not None) == ("mixture" in name)


def test_a_window_batch_allocates_no_packed_column() -> None:
    """The window hot path stores no optional column: each reads None from the class, none is in the instance."""
    batch = sb.materialize(sb.chunk(sb.windows(_docs([9, 4]), context_length=3), 4))[0]
    assert all(getattr(batch, name) is None for name in (*PACKED, "sources", "names"))
    assert not vars(batch)
    assert batch.sequence_is_pad is None
    assert batch.token_count == batch.targets.size
    assert batch.pad_count == 0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(7, 20), min_size=1, max_size=8), st.integers(1, 5), st.integers(1, 6))
def test_the_segment_table_accounts_for_every_target(lengths: list[int], T: int, B: int) -> None:
    """Per segment (row, source, document, start, length): lengths sum to token_count; a window is one segment of T."""
    for name, items in _kinds(lengths, T).items():
        if not len(items):
            continue
        for batch in sb.materialize(sb.chunk(items, B)):
            table = batch.segments
            assert table.length.sum() == batch.token_count, name
            assert np.all(np.diff(table.row) >= 0)
            assert len(batch.provenance) == table.row.size == len(batch.document_ids)
            sources = np.zeros(batch.width, dtype=np.int64) if batch.sources is None else batch.sources.astype(np.int64)
            assert table.source.tolist() == sources[table.row].tolist()
            if not batch.packed:
                assert table.row.tolist() == list(range(batch.width))
                assert set(table.length.tolist()) <= {T}
            else:
                assert batch.token_count == int(np.count_nonzero(batch.loss_mask))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["windows", "packed", "mixture", "packed mixture"]))
def test_token_count_follows_a_new_loss_mask(seed: int, kind: str) -> None:
    """Setting ``loss_mask`` recounts ``token_count`` (None: every target); a mask of another shape is refused and
    changes nothing."""
    batch = sb.materialize(sb.chunk(_kinds([9, 4, 13, 6], T=3)[kind], 4))[0]
    mask = np.random.default_rng(seed).random(batch.shape) < 0.5
    batch.loss_mask = mask
    assert batch.token_count == int(mask.sum()) == batch.targets.size - batch.pad_count
    assert np.array_equal(batch.loss_mask, mask)
    with pytest.raises(ConfigError, match="loss_mask of shape"):
        batch.loss_mask = mask[:, :-1]
    assert batch.token_count == int(mask.sum())
    assert np.array_equal(batch.loss_mask, mask)
    batch.loss_mask = None
    assert batch.token_count == batch.targets.size
    assert batch.loss_mask is None


def test_in_epoch_keeps_every_column() -> None:
    """A batch placed in another epoch is the same batch (columns, sources, provenance) but for ``epoch``."""
    for items in _kinds([9, 4, 13, 6], T=3).values():
        batch = sb.materialize(sb.chunk(items, 4))[1]
        moved = batch.in_epoch(2)
        assert type(moved) is sb.MiniBatch
        assert moved.epoch == 2
        assert moved.in_epoch(0) == batch
        assert moved.provenance == batch.provenance


def test_window_and_row_numbers_mean_one_thing() -> None:
    """``window_numbers`` are windows, ``row_numbers`` packed rows; asking a batch for the other kind is a ConfigError."""
    kinds = _kinds([9, 4, 13], T=3)
    windows = sb.materialize(sb.chunk(kinds["windows"], 4))[0]
    packed = sb.materialize(sb.chunk(kinds["packed"], 4))[0]
    assert windows.window_numbers.tolist() == windows.item_numbers.tolist() == [0, 1, 2, 3]
    assert packed.row_numbers.tolist() == packed.item_numbers.tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="row_numbers"):
        _ = packed.window_numbers
    with pytest.raises(ConfigError, match="window_numbers"):
        _ = windows.row_numbers


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_a_damaged_packed_plan_is_a_data_error_on_both_paths(backend: str) -> None:
    """One rule for packed batches: a row number outside the packing is a DataError by index and by iteration."""
    if backend == "c" and GATHER_BACKEND != "c":
        pytest.skip("the C gather is not built")
    rows = sb.pack(_docs([9, 4, 13, 6]), context_length=3)
    damaged = rows.with_plan(np.array([0, 1, 10**6, 2][: len(rows)] + [3] * (len(rows) - 4), dtype=np.uint32), None)
    if backend == "numpy":
        damaged.space.cache["gather"] = False
    batches = sb.materialize(sb.chunk(damaged, 4))
    with pytest.raises(DataError, match="do not belong to this packing"):
        _ = batches[0]
    with pytest.raises(DataError, match="do not belong to this packing"):
        list(batches)


@pytest.mark.parametrize("name", ["PackedBatch", "MixtureBatch", "PackedMixtureBatch"])
def test_the_old_batch_classes_are_deprecated_aliases(name: str) -> None:
    """0.3's three other batch classes are `MiniBatch`, with a DeprecationWarning, for one release."""
    with pytest.warns(DeprecationWarning, match="every batch is a streambatch.MiniBatch"):
        alias = getattr(batch_module, name)
    assert alias is sb.MiniBatch


def test_epoch_and_run_share_one_configuration() -> None:
    """`Run` hands its epochs one `EpochConfig`: each epoch has the run's settings, whatever the keywords."""
    docs = _docs([9, 4, 13, 6])
    run = sb.Run(docs, context_length=3, stride=2, batch_size=2, seed=5, epochs=2)
    epoch = sb.Epoch(docs, context_length=3, stride=2, batch_size=2, seed=5)
    assert run.epoch(0).settings == epoch.settings
    assert run.epoch(1).settings.seed != epoch.settings.seed
    assert [b.inputs.tolist() for b in run.epoch(0)] == [b.inputs.tolist() for b in epoch]
    assert epoch.item_count == epoch.window_count == len(epoch.windows)
    packed = sb.Epoch(docs, context_length=3, batch_size=2, seed=5, pack=True)
    assert packed.item_count == len(packed.windows)
    with pytest.raises(ConfigError, match="item_count"):
        _ = packed.window_count
