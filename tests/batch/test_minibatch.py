"""Tests for streambatch/batch/minibatch.py: one `MiniBatch` class for windows, packed rows, mixtures and packed mixtures."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.batch import minibatch as batch_module
from streambatch.batch.minibatch import MiniBatch, SegmentProvenance, WindowProvenance
from streambatch.errors import AccumulationError, ConfigError, DataError, RowIndexError

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
    if backend == "c" and not _kernels.available()["packed_gather"]:
        pytest.skip("the C gather is not built")
    rows = sb.pack(_docs([9, 4, 13, 6]), context_length=3)
    damaged = rows.with_plan(np.array([0, 1, 10**6, 2][: len(rows)] + [3] * (len(rows) - 4), dtype=np.uint32), None)
    with _kernels.use("packed_gather", "python" if backend == "numpy" else "c"):
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
    assert epoch.item_count == epoch.window_count == len(epoch.items)
    packed = sb.Epoch(docs, context_length=3, batch_size=2, seed=5, pack=True)
    assert packed.item_count == len(packed.items)
    with pytest.raises(ConfigError, match="item_count"):
        _ = packed.window_count


def _masked_docs(lengths: list[int]) -> list[sb.Document]:
    return [
        sb.Document(f"m{i}", "train", [1 + (3 * i + j) % 40 for j in range(n)], loss_mask=[(i + j) % 3 != 0 for j in range(n)])
        for i, n in enumerate(lengths)
    ]


def test_shapes_and_dtypes_of_every_kind() -> None:
    """``(width, T)`` C-contiguous inputs and targets in the store's dtype; the final batch is as wide as its rows."""
    T, B = 3, 4
    for name, items in _kinds([9, 4, 13, 6], T=T).items():
        batches = list(sb.materialize(sb.chunk(items, B)))
        assert [b.width for b in batches] == [B] * (len(items) // B) + ([len(items) % B] if len(items) % B else []), name
        for batch in batches:
            assert batch.shape == (batch.width, T) == batch.inputs.shape == batch.targets.shape
            assert batch.context_length == T
            assert batch.inputs.flags.c_contiguous
            assert batch.targets.flags.c_contiguous
            assert batch.inputs.dtype == batch.targets.dtype == batch.space.store.dtype


def test_a_window_batch_is_its_documents_tokens_and_provenance() -> None:
    """Each window row is ``T + 1`` tokens of one document read from the store independently, and its provenance
    (id, index, start, partition, shard) is where they were read."""
    docs = _docs([9, 4, 13, 6])
    T = 3
    items = sb.shuffle(sb.windows(docs, context_length=T, stride=2), seed=4)
    for batch in sb.materialize(sb.chunk(items, 3)):
        assert len(batch.provenance) == batch.width
        for row, where in enumerate(batch.provenance):
            assert type(where) is WindowProvenance
            doc = docs[where.document_index]
            assert (where.document_id, where.partition, where.shard) == (doc.id, sb.Partition.TRAIN, 0)
            tokens = doc.tokens[where.start : where.start + T + 1].tolist()
            assert batch.input_row(row).tolist() == tokens[:-1]
            assert batch.target_row(row).tolist() == tokens[1:]
            assert str(where) == f"{doc.id}@{where.start}"
        assert batch.token_count == batch.width * T
        assert batch.global_token_count == batch.token_count


def test_packed_provenance_places_every_segment() -> None:
    """A packed batch's segments laid left to right in their rows are the documents' tokens; padding is pad."""
    docs = _docs([9, 4, 13, 6, 2])
    T = 4
    batch = sb.materialize(sb.chunk(sb.pack(docs, context_length=T, pad_id=0), 8))[0]
    assert batch.packed
    columns = np.zeros(batch.width, dtype=np.int64)
    seen = np.zeros(batch.shape, dtype=bool)
    for where in batch.provenance:
        assert type(where) is SegmentProvenance
        lo = int(columns[where.row])
        tokens = docs[where.document_index].tokens[where.start : where.start + where.length + 1].tolist()
        assert batch.inputs[where.row, lo : lo + where.length].tolist() == tokens[:-1]
        assert batch.targets[where.row, lo : lo + where.length].tolist() == tokens[1:]
        assert batch.position_ids[where.row, lo : lo + where.length].tolist() == list(range(where.length))
        seen[where.row, lo : lo + where.length] = True
        columns[where.row] += where.length
    assert np.array_equal(seen, batch.loss_mask)
    assert np.array_equal(seen, batch.segment_ids >= 0)
    assert batch.token_count == int(seen.sum()) == int(batch.segments.length.sum())
    assert batch.pad_count == seen.size - int(seen.sum())
    assert not batch.inputs[~seen].any()


def test_the_optional_columns_are_set_where_they_apply() -> None:
    """None where a column does not apply: windows none, a masked window store ``loss_mask`` only, packed rows the
    packed columns, a mixture ``sources`` and ``names``."""
    T = 3
    cases = {
        **_kinds([9, 4, 13, 6], T=T),
        "masked windows": sb.windows(_masked_docs([9, 4, 13, 6]), context_length=T),
    }
    for name, items in cases.items():
        batch = sb.materialize(sb.chunk(items, 4))[0]
        packed, mixed = "packed" in name, "mixture" in name
        for column in ("segment_ids", "position_ids", "cu_seqlens", "max_seqlen"):
            assert (getattr(batch, column) is not None) == packed, (name, column)
        assert (batch.loss_mask is not None) == (packed or "masked" in name), name
        assert (batch.sources is not None) == mixed == (batch.names is not None) == (batch.source_names is not None)
        if batch.loss_mask is not None:
            assert batch.loss_mask.shape == batch.shape
            assert batch.token_count == int(np.count_nonzero(batch.loss_mask))
        else:
            assert batch.token_count == batch.targets.size
        if mixed:
            assert batch.source_names == [batch.names[s] for s in batch.sources.tolist()]
            assert "rows per source" in repr(batch)


def test_a_masked_window_batch_counts_the_stores_bits() -> None:
    """A window batch of a store with a loss mask counts exactly the targets whose bit is set."""
    docs = _masked_docs([9, 4, 13, 6])
    T = 3
    for batch in sb.materialize(sb.chunk(sb.windows(docs, context_length=T), 4)):
        for row, where in enumerate(batch.provenance):
            bits = docs[where.document_index].loss_mask
            assert bits is not None
            assert batch.loss_mask[row].tolist() == bits[where.start + 1 : where.start + T + 1].tolist()
        assert batch.token_count == int(batch.loss_mask.sum())


@pytest.mark.parametrize("kind", ["windows", "packed", "mixture", "packed mixture"])
def test_average_token_contributions_takes_one_per_counted_target(kind: str) -> None:
    """Exactly ``token_count`` contributions give their mean; one more or one fewer is an `AccumulationError`."""
    batch = sb.materialize(sb.chunk(_kinds([9, 4, 13, 6], T=3)[kind], 4))[0]
    n = batch.token_count
    contributions = [sb.TokenContribution(float(i), [float(i), 1.0]) for i in range(n)]
    mean = batch.average_token_contributions(contributions)
    assert mean.token_count == n
    assert mean.mean_loss == pytest.approx(sum(range(n)) / n)
    assert mean.mean_gradient.tolist() == pytest.approx([sum(range(n)) / n, 1.0])
    words = "real target" if batch.packed else "target token"
    for wrong in (contributions[:-1], [*contributions, contributions[0]]):
        with pytest.raises(AccumulationError, match=f"got {len(wrong)} contributions.*one per {words}"):
            batch.average_token_contributions(wrong)


def test_equality_compares_every_column_and_the_place() -> None:
    """Equal batches are equal in every column, provenance and place; a changed token, index or epoch is not equal."""
    for name, items in _kinds([9, 4, 13, 6], T=3).items():
        batches = sb.materialize(sb.chunk(items, 4))
        a, b = batches[0], batches[0]
        assert a == b, name
        assert a != batches[1]
        assert a != a.in_epoch(1)
        assert (a == "batch") is False
        changed = sb.materialize(sb.chunk(items, 4))[0]
        changed.inputs[0, 0] += 1
        assert changed != a
        with pytest.raises(TypeError):
            hash(a)


@pytest.mark.parametrize("kind", ["windows", "packed", "mixture", "packed mixture"])
def test_a_batch_pickles_to_an_equal_batch(kind: str) -> None:
    batch = sb.materialize(sb.chunk(_kinds([9, 4, 13, 6], T=3)[kind], 4))[0]
    again = pickle.loads(pickle.dumps(batch))
    assert again == batch
    assert again.provenance == batch.provenance


def test_the_constructor_makes_a_window_batch() -> None:
    """`MiniBatch` from its five positional arguments: every target counts unless a mask is given; rows checked."""
    items = sb.windows(_docs([9, 4]), context_length=3)
    made = sb.materialize(sb.chunk(items, 2))[0]
    again = MiniBatch(made.index, made.inputs, made.targets, made.positions, made.space)
    assert again == made
    assert again.token_count == 6
    masked = MiniBatch(0, made.inputs, made.targets, made.positions, made.space, loss_mask=np.eye(2, 3, dtype=bool))
    assert masked.token_count == 2
    assert masked.pad_count == 4
    masked.global_token_count = 9
    assert masked.global_token_count == 9
    with pytest.raises(RowIndexError, match="out of range for a batch of width 2"):
        made.input_row(2)
    with pytest.raises(IndexError):
        made.target_row(-1)


@pytest.mark.parametrize("name", ["PackedBatch", "MixtureBatch", "PackedMixtureBatch"])
def test_the_old_batch_classes_are_aliases_on_every_path(name: str) -> None:
    """The 0.3 aliases are `MiniBatch` from the new module and the package; an unknown name is an AttributeError."""
    with pytest.warns(DeprecationWarning, match=name):
        assert getattr(batch_module, name) is MiniBatch
    assert sb.MiniBatch is MiniBatch
    with pytest.raises(AttributeError, match="NoSuchBatch"):
        _ = batch_module.NoSuchBatch
