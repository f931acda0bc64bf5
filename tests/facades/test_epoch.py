"""Tests for `streambatch.epoch`: the invariants of a whole epoch, as properties."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
import streambatch.items.windows.windows as windowing
from streambatch import ConfigError
from streambatch.errors import DuplicateIdError, PartitionError
from streambatch.stages.chunk import batch_widths
from tests.strategies import configs, documents, seeds


def _origins(epoch: sb.Epoch) -> list[tuple[int, int]]:
    return [(p.document_index, p.start) for b in epoch for p in b.provenance]


def _all_windows(docs: list[sb.Document], context_length: int, stride: int) -> list[tuple[int, int]]:
    return [(d, s) for d, doc in enumerate(docs) for s in range(0, len(doc), stride) if s + context_length + 1 <= len(doc)]


@given(documents(), configs, seeds)
def test_every_window_exactly_once(docs: list[sb.Document], config: dict[str, int], seed: int | None) -> None:
    """Every complete window of every document appears once; none twice, none missing."""
    epoch = sb.Epoch(docs, seed=seed, **config)
    origins = _origins(epoch)
    assert sorted(origins) == _all_windows(docs, config["context_length"], config["stride"])
    assert epoch.window_count == len(origins)


@given(documents(), configs, seeds)
def test_rows_never_cross_a_boundary(docs: list[sb.Document], config: dict[str, int], seed: int | None) -> None:
    """Each row is T + 1 consecutive tokens of its own document, shifted by one."""
    T = config["context_length"]
    for batch in sb.Epoch(docs, seed=seed, **config):
        for row, origin in enumerate(batch.provenance):
            source = docs[origin.document_index].tokens[origin.start : origin.start + T + 1]
            assert source.size == T + 1
            assert source[:-1].tolist() == batch.input_row(row).tolist()
            assert source[1:].tolist() == batch.target_row(row).tolist()
            assert docs[origin.document_index].id == origin.document_id


@given(documents(), configs, seeds)
def test_widths_and_no_padding(docs: list[sb.Document], config: dict[str, int], seed: int | None) -> None:
    """Widths are [B, ..., B, r]; arrays hold exactly width x T ids, no padding; token_count = width x T."""
    epoch = sb.Epoch(docs, seed=seed, **config)
    batches = list(epoch)
    widths = [b.width for b in batches]
    assert batch_widths(epoch.window_count, config["batch_size"]) == widths
    assert len(batches) == len(epoch) == epoch.batch_count
    for batch in batches:
        assert (batch.width, config["context_length"]) == batch.inputs.shape == batch.targets.shape
        assert batch.width * config["context_length"] == batch.token_count == batch.targets.size


@given(documents(), configs, st.integers(0, 2**64 - 1))
def test_same_seed_replays_other_seed_permutes(docs: list[sb.Document], config: dict[str, int], seed: int) -> None:
    """The same seed gives identical batches (also on a second pass); another seed the same windows."""
    epoch = sb.Epoch(docs, seed=seed, **config)
    first = list(epoch)
    assert first == list(epoch)  # iterable more than once
    assert first == list(sb.Epoch(docs, seed=seed, **config))
    other = sb.Epoch(docs, seed=(seed + 1) % 2**64, **config)
    assert sorted(_origins(epoch)) == sorted(_origins(other))


@given(documents(), configs, seeds)
def test_final_batch_token_mean_uses_width_times_t(docs: list[sb.Document], config: dict[str, int], seed: int | None) -> None:
    """The final batch's token mean divides by its own width x T, never the capacity."""
    batches = list(sb.Epoch(docs, seed=seed, **config))
    if not batches:
        return
    final = batches[-1]
    contributions = [sb.TokenContribution(1.0 + i / 8, [float(i)]) for i in range(final.token_count)]
    mean = final.average_token_contributions(contributions)
    assert final.width * config["context_length"] == mean.token_count
    assert sum(c.loss for c in contributions) / (final.width * config["context_length"]) == mean.mean_loss


def test_sequential_order_is_document_then_start() -> None:
    """seed=None keeps document order, then increasing start, and builds no order array."""
    docs = [sb.Document("a", "train", range(6)), sb.Document("b", "train", range(4))]
    epoch = sb.Epoch(docs, context_length=2, batch_size=4, stride=2, seed=None)
    assert _origins(epoch) == [(0, 0), (0, 2), (1, 0)]
    assert epoch.shuffle_state_after is None
    assert epoch.order.is_sequential
    assert epoch.plan_nbytes == 0


def test_stride_two_starts() -> None:
    """The course's stride-2 case: starts 0, 2, 4."""
    epoch = sb.Epoch([sb.Document("a", "train", range(7))], context_length=2, batch_size=8, stride=2, seed=None)
    assert next(iter(epoch)).starts.tolist() == [0, 2, 4]


def test_empty_epoch_keeps_seed_state() -> None:
    """An epoch of documents too short for a window has no batches; seed 9 stays state 9."""
    epoch = sb.Epoch([sb.Document("short", "train", [1, 2])], context_length=2, batch_size=3, seed=9)
    assert (epoch.window_count, len(epoch), list(epoch)) == (0, 0, [])
    assert epoch.shuffle_state_after == 9


def test_validation_happens_before_any_window_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cross-partition and duplicate-id rejections come before windows are even counted."""

    def no_window_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("window work started before validation")

    monkeypatch.setattr(windowing, "WindowIndex", no_window_work)
    mixed = [sb.Document("a", "train", [1, 2, 3]), sb.Document("v", "validation", [1, 2, 3])]
    with pytest.raises(PartitionError, match="'v'"):
        sb.Epoch(mixed, context_length=2, batch_size=3, seed=None)
    twice = [sb.Document("a", "train", [1, 2, 3]), sb.Document("a", "train", [4, 5, 6])]
    with pytest.raises(DuplicateIdError, match="'a'"):
        sb.Epoch(twice, context_length=2, batch_size=3, seed=None)


def test_epoch_for_another_partition() -> None:
    """partition='validation' admits only validation documents."""
    docs = [sb.Document("v", "validation", [1, 2, 3, 4])]
    epoch = sb.Epoch(docs, context_length=2, batch_size=3, partition="validation", seed=None)
    assert {sb.Partition.VALIDATION} == {p.partition for b in epoch for p in b.provenance}


def test_store_epoch_equals_document_epoch() -> None:
    """An epoch over DocumentStore.from_arrays equals the same epoch over documents."""
    rng = np.random.default_rng(0)
    docs = [sb.Document(str(i), "train", rng.integers(0, 1000, rng.integers(0, 30))) for i in range(20)]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    store = sb.DocumentStore.from_arrays(np.concatenate([d.tokens for d in docs]), offsets)
    kwargs: dict[str, Any] = {"context_length": 3, "batch_size": 4, "stride": 2, "seed": 11}
    assert list(sb.Epoch(docs, **kwargs)) == list(sb.Epoch(store, **kwargs))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ConfigError, "batch_size=0 must be a positive int"),
        ({"batch_size": 2.5}, ConfigError, "batch_size=2.5 must be a positive int"),
        ({"context_length": 0}, ConfigError, "context_length=0 must be a positive int"),
        ({"stride": -1}, ConfigError, "stride=-1 must be a positive int"),
        ({"seed": -1}, ConfigError, r"seed=-1 must be an int in \[0, 2\*\*64\)"),
        ({"seed": 2**64}, ConfigError, r"seed=18446744073709551616 must be an int"),
        ({"seed": 1.0}, ConfigError, r"seed=1.0 must be an int"),
        ({"partition": "dev"}, sb.DataError, "partition='dev' is not one of"),
    ],
    ids=["zero-B", "float-B", "zero-T", "negative-stride", "negative-seed", "big-seed", "float-seed", "bad-partition"],
)
def test_invalid_epoch_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    """Invalid arguments raise at the call with name=value, the rule and the fix."""
    arguments: dict[str, Any] = {"context_length": 2, "batch_size": 3, **kwargs}
    with pytest.raises(error, match=message):
        sb.Epoch([sb.Document("a", "train", [1, 2, 3])], **arguments)


def test_errors_are_value_errors() -> None:
    """Every library error is a StreamBatchError, itself a ValueError."""
    import streambatch.errors as errors

    for name in ("ConfigError", "DataError", "PartitionError", "DuplicateIdError", "StoreError", "AccumulationError"):
        assert issubclass(getattr(errors, name), sb.StreamBatchError)
    assert issubclass(sb.StreamBatchError, ValueError)


def test_window_number_plan_for_huge_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores of >= 2**32 tokens keep window numbers in the plan; batches are the same (threshold forced low)."""
    docs = [sb.Document(f"d{i}", "train", list(range(i % 7 + 3))) for i in range(30)]
    expected = list(sb.Epoch(docs, context_length=2, batch_size=4, seed=5))
    monkeypatch.setattr(windowing, "POSITION_LIMIT", 10)
    epoch = sb.Epoch(docs, context_length=2, batch_size=4, seed=5)
    assert not epoch.order.space.plan_holds_positions
    assert expected == list(epoch)
    assert [b.window_numbers.tolist() for b in expected] == [epoch.batch_windows(i).tolist() for i in range(len(epoch))]
