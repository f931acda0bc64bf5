"""Tests for `streambatch.windows`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import ConfigError
from streambatch.errors import OutOfRangeError
from streambatch.items.windows.window_index import WindowConfig, WindowIndex, window_counts, window_starts, window_tails


@pytest.mark.parametrize(
    ("length", "context_length", "stride", "starts"),
    [
        (5, 2, 1, [0, 1, 2]),  # train-a
        (4, 2, 1, [0, 1]),  # train-b
        (3, 2, 1, [0]),  # exactly T + 1
        (2, 2, 1, []),  # too short: no window, not an error
        (0, 2, 1, []),
        (7, 2, 2, [0, 2, 4]),  # the course's stride-2 case
        (8, 2, 2, [0, 2, 4]),  # the incomplete tail is not emitted
        (9, 2, 3, [0, 3, 6]),
    ],
)
def test_window_starts_table(length: int, context_length: int, stride: int, starts: list[int]) -> None:
    """Starts are 0, s, 2s, ... while T + 1 tokens remain."""
    assert starts == window_starts(length, context_length, stride).tolist()
    assert len(starts) == window_counts([length], context_length, stride)[0]


@given(st.integers(0, 200), st.integers(1, 20), st.integers(1, 20))
def test_count_formula_matches_enumeration(length: int, context_length: int, stride: int) -> None:
    """max(0, (L - (T+1)) // s + 1) equals counting every start whose window fits."""
    expected = sum(1 for start in range(0, length, stride) if start + context_length + 1 <= length)
    assert expected == int(window_counts([length], context_length, stride)[0])


@given(st.integers(0, 200), st.integers(1, 20), st.integers(1, 20))
def test_tail_is_exactly_the_unused_suffix(length: int, context_length: int, stride: int) -> None:
    """The tail starts right after the last window's last token (or at 0), and ends the document."""
    starts = window_starts(length, context_length, stride)
    tail_start, tail_length = (int(a[0]) for a in window_tails([length], context_length, stride))
    covered_to = int(starts[-1]) + context_length + 1 if starts.size else 0
    assert covered_to == tail_start
    assert length - covered_to == tail_length


def test_index_locates_windows() -> None:
    """Global numbers map back to (document, start), skipping documents without windows."""
    index = WindowIndex([5, 2, 4], WindowConfig(2))
    documents, starts = index.locate(np.arange(index.window_count))
    assert documents.tolist() == [0, 0, 0, 2, 2]
    assert starts.tolist() == [0, 1, 2, 0, 1]


@given(st.lists(st.integers(0, 60), max_size=12), st.integers(1, 6), st.integers(1, 4))
def test_locate_inverts_enumeration(lengths: list[int], context_length: int, stride: int) -> None:
    """Window n is the n-th (document, start) pair in document order."""
    index = WindowIndex(lengths, WindowConfig(context_length, stride))
    expected = [(d, s) for d, length in enumerate(lengths) for s in window_starts(length, context_length, stride).tolist()]
    documents, starts = index.locate(np.arange(index.window_count))
    assert expected == list(zip(documents.tolist(), starts.tolist(), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context_length": 0}, r"context_length=0 must be a positive int"),
        ({"context_length": -3}, r"context_length=-3 must be a positive int"),
        ({"context_length": 2.0}, r"context_length=2.0 must be a positive int"),
        ({"context_length": True}, r"context_length=True must be a positive int"),
        ({"context_length": 2, "stride": 0}, r"stride=0 must be a positive int"),
    ],
    ids=["zero-T", "negative-T", "float-T", "bool-T", "zero-stride"],
)
def test_bad_window_config(kwargs: dict[str, object], message: str) -> None:
    """Non-positive or non-integer sizes raise ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=message):
        WindowConfig(**kwargs)  # type: ignore[arg-type]


def _store() -> sb.DocumentStore:
    return sb.DocumentStore.from_arrays(
        [0, 10, 11, 12, 1, 0, 20, 21, 1, 9, 9], [0, 5, 9, 11], partition=["train", "train", "test"]
    )


@pytest.mark.parametrize(
    ("item", "numbers"),
    [
        (slice(None), [0, 1, 2, 3, 4]),
        (slice(1, 3), [1, 2]),
        (slice(3, None), [3, 4]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(4, 0, -2), [4, 2]),
        (slice(5, 9), []),
    ],
)
def test_windows_slicing_table(item: slice, numbers: list[int]) -> None:
    """Slices are views with the window numbers of list slicing; sequential windows hold no array."""
    windows = sb.windows(_store(), context_length=2, keep_partition=True)
    assert windows.is_sequential
    assert windows.plan_nbytes == 0
    view = windows[item]
    assert numbers == list(view) == list(range(5))[item]
    assert len(view) == len(numbers)


def test_windows_of_one_partition_and_their_positions() -> None:
    """Only the partition's documents contribute windows; positions and locate agree with the tokens."""
    store = _store()
    train = sb.windows(store, context_length=2, keep_partition=True)
    test = sb.windows(store, context_length=1, partition="test", keep_partition=True)
    assert (len(train), len(test)) == (5, 1)
    assert train.positions().tolist() == [0, 1, 2, 5, 6]
    assert [a.tolist() for a in test.locate()] == [[2], [0]]
    assert test.positions().tolist() == [9]
    assert (train[0], train[-1]) == (0, 4)


def test_shuffled_windows_are_a_plan_of_positions() -> None:
    """shuffle gives the same windows in the chapter's order, 4 bytes per window, views when sliced."""
    windows = sb.shuffle(sb.windows(_store(), context_length=2, keep_partition=True), seed=7)
    assert list(windows) == [4, 1, 3, 0, 2]
    assert windows.plan_nbytes == 20
    assert windows[1:3].positions().tolist() == [1, 5]
    assert np.shares_memory(windows[1:3].plan_values(), windows.plan_values())
    assert sorted(windows) == list(sb.windows(_store(), context_length=2, keep_partition=True))


@pytest.mark.parametrize("bad", [5, -6, 1.0, "0"])
def test_windows_index_errors(bad: object) -> None:
    """Out-of-range or non-integer indices raise OutOfRangeError (also an IndexError)."""
    windows = sb.windows(_store(), context_length=2, keep_partition=True)
    with pytest.raises(OutOfRangeError):
        windows[bad]  # type: ignore[index]


def test_windows_stage_checks_its_arguments() -> None:
    """Bad T, stride or partition fail at the call."""
    with pytest.raises(ConfigError, match="context_length=0"):
        sb.windows(_store(), context_length=0, keep_partition=True)
    with pytest.raises(sb.DataError, match="partition='dev'"):
        sb.windows(_store(), context_length=2, partition="dev")
