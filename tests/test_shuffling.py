"""Tests for `streambatch.shuffle`: the vectorized shuffle equals the plain loop bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streambatch import ConfigError
from streambatch.shuffling import apply_swaps, shuffled_order, splitmix64_draws, state_after, swap_targets

from . import spec


def test_chapter_seed_7_order() -> None:
    """Seed 7 on five windows gives the chapter's order b@1, a@1, b@0, a@0, a@2 (numbers 4, 1, 3, 0, 2)."""
    order, state = shuffled_order(5, seed=7)
    assert order.tolist() == [4, 1, 3, 0, 2]
    assert spec.fisher_yates(5, 7) == ([4, 1, 3, 0, 2], state)


def test_draws_match_scalar_generator() -> None:
    """Vectorized draws equal SplitMix64 stepped one draw at a time."""
    rng = spec.SplitMix64(123456789)
    expected = [rng.next_u64() for _ in range(100)]
    assert expected == splitmix64_draws(123456789, 1, 100).tolist()
    assert expected[40:] == splitmix64_draws(123456789, 41, 60).tolist()


@pytest.mark.parametrize("count", [0, 1])
def test_tiny_epochs_keep_the_seed_as_state(count: int) -> None:
    """0 or 1 windows draw nothing: the state after is the seed itself (the chapter's empty epoch, seed 9)."""
    order, state = shuffled_order(count, seed=9)
    assert list(range(count)) == order.tolist()
    assert state == 9


@given(st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=2**64 - 1))
def test_equals_plain_loop(count: int, seed: int) -> None:
    """Every size and seed: same order and same final state as the chapter's loop."""
    order, state = shuffled_order(count, seed)
    expected, expected_state = spec.fisher_yates(count, seed)
    assert expected == order.tolist()
    assert expected_state == state


@pytest.mark.parametrize("count", [1_000, 4_097, 30_000])
@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_equals_plain_loop_large(count: int, seed: int) -> None:
    """Larger sizes too (several chunks of draws are not needed for equality, but groups get long)."""
    order, state = shuffled_order(count, seed)
    expected, expected_state = spec.fisher_yates(count, seed)
    assert expected == order.tolist()
    assert expected_state == state


def test_chunked_draws_cross_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """With tiny draw chunks the result is unchanged: chunking is invisible."""
    import streambatch.shuffling as shuffle

    monkeypatch.setattr(shuffle, "_CHUNK", 7)
    monkeypatch.setattr(shuffle, "_BLOCK", 3)
    assert spec.fisher_yates(200, 99)[0] == shuffle.shuffled_order(200, 99)[0].tolist()


@given(
    st.integers(min_value=3, max_value=200),
    st.data(),
)
def test_forced_rejections_match_plain_loop(count: int, data: st.DataObject) -> None:
    """A seed built so that some step's draw is below its threshold redraws exactly like the loop."""
    upper = data.draw(st.integers(min_value=1, max_value=count - 1), label="step")
    bound = upper + 1
    threshold = ((1 << 64) - bound) % bound
    if threshold == 0:  # powers of two never reject
        bound, upper = 3, 2
        threshold = 1
    draw_number = count - upper  # no rejection before this step uses it
    value = data.draw(st.integers(min_value=0, max_value=threshold - 1), label="rejected draw")
    seed = spec.seed_with_draw(draw_number, value)
    expected, expected_state = spec.fisher_yates(count, seed)
    order, state = shuffled_order(count, seed)
    assert expected == order.tolist()
    assert expected_state == state
    assert state == state_after(seed, count)  # count - 1 accepted draws + 1 rejected


def test_rejection_consumes_one_extra_draw() -> None:
    """A rejected draw is skipped: the shuffle consumes count draws instead of count - 1."""
    count = 10
    seed = spec.seed_with_draw(count - 2, 0)  # step 2 (bound 3, threshold 1) gets draw 0
    order, state = shuffled_order(count, seed)
    assert spec.fisher_yates(count, seed) == (order.tolist(), state)
    _, draws = swap_targets(count, seed)
    assert draws == count  # one more than without the rejection


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=300))
def test_apply_swaps_equals_loop(raw: list[int]) -> None:
    """Any swap chain with H[i] <= i resolves like the sequential swaps."""
    targets = np.array([value % (i + 1) for i, value in enumerate(raw)], dtype=np.uint32)
    values = list(range(len(raw)))
    for i in range(len(raw) - 1, 0, -1):
        j = int(targets[i])
        values[i], values[j] = values[j], values[i]
    assert values == apply_swaps(targets).tolist()


def test_order_dtype_is_four_bytes_per_window() -> None:
    """Window counts that fit in uint32 get a uint32 order: 4 bytes per window."""
    order, _ = shuffled_order(1000, 1)
    assert np.uint32 == order.dtype
    assert order.nbytes == 4000


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True, "7", None])
def test_bad_seeds_are_rejected(seed: object) -> None:
    """Seeds outside [0, 2**64) or not integers raise ConfigError naming the seed."""
    with pytest.raises(ConfigError, match=r"seed=.* must be an int in \[0, 2\*\*64\)"):
        shuffled_order(5, seed)  # type: ignore[arg-type]
