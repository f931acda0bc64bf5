"""Tests for `streambatch.items.mix.plan`: Tijdeman's order, exact, randomly accessible, each source in its exact epochs.

The order is checked against the rule as written in DESIGN.md, run literally in
`fractions.Fraction`; the prefix bound is checked at every n in Fractions too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streambatch import _kernels
from streambatch.errors import ConfigError, OutOfRangeError, StreamBatchError
from streambatch.items.mix.plan import (
    MixPlan,
    default_length,
    integer_weights,
    normalised_weights,
    plan_mix,
    source_epoch_seed,
    tijdeman_order,
)
from streambatch.order.splitmix import derive_seed
from tests import spec
from tests.mix_reference import plan_items, seeded_orders, source_items, source_position

needs_c = pytest.mark.skipif(not _kernels.available()["mix_order"], reason="streambatch._mix_order is not built")
BACKENDS = [pytest.param("c", marks=needs_c), "python"]

# tiny (1e-6) to dominant, as floats, ints and Fractions
WEIGHT = st.one_of(
    st.floats(min_value=1e-6, max_value=1.0),
    st.sampled_from([1e-6, 1e-3, 0.1, 0.3, 0.6, 1.0, 1 / 3]),
    st.integers(min_value=1, max_value=10**6),
    st.fractions(min_value=Fraction(1, 10**6), max_value=10, max_denominator=10**6).filter(lambda f: f > 0),
)
WEIGHTS = st.lists(WEIGHT, min_size=2, max_size=6)
SEEDS = st.integers(min_value=0, max_value=2**64 - 1)


@contextlib.contextmanager
def backend_of(name: str) -> Iterator[None]:
    """`tijdeman_order` runs on path *name* inside."""
    with _kernels.use("mix_order", name):
        yield


def exact_weights(weights: Sequence[Any]) -> list[Fraction]:
    """The normalised weights in Fractions, straight from the inputs (independent of `integer_weights`)."""
    values = [Fraction(w) for w in weights]
    total = sum(values)
    return [v / total for v in values]


def reference_order(weights: Sequence[Any], length: int) -> list[int]:
    """DESIGN.md's rule, literally, in Fractions."""
    w = exact_weights(weights)
    k = len(w)
    if k == 1:
        return [0] * length
    mu = Fraction(1, 2 * k - 2)
    counts = [0] * k
    out = []
    for n in range(1, length + 1):
        eligible = [s for s in range(k) if counts[s] <= w[s] * n - mu]
        best = min(eligible, key=lambda s: ((counts[s] + 1 - mu) / w[s], s))
        counts[best] += 1
        out.append(best)
    return out


def assert_prefix_bound(weights: Sequence[Any], sources: Sequence[int]) -> None:
    """|c_s - w_s n| <= 1 - 1/(2k-2) after every prefix n, in exact Fractions."""
    w = exact_weights(weights)
    k = len(w)
    bound = 1 - Fraction(1, 2 * k - 2) if k > 1 else Fraction(0)
    counts = [0] * k
    for n, s in enumerate(sources, start=1):
        counts[s] += 1
        for t in range(k):
            assert abs(counts[t] - w[t] * n) <= bound, (n, t, counts, w)


def running_indices(sources: np.ndarray, k: int) -> np.ndarray:
    """Index of each item within its source, by iteration."""
    seen = [0] * k
    out = []
    for s in sources.tolist():
        out.append(seen[s])
        seen[s] += 1
    return np.array(out, dtype=np.int64)


# -- the order ---------------------------------------------------------------------


def test_design_example() -> None:
    """0.6/0.3/0.1: the first ten items hold 6, 3, 1."""
    plan = plan_mix([0.6, 0.3, 0.1], length=10)
    assert plan.sources.tolist() == reference_order([0.6, 0.3, 0.1], 10)
    assert plan.counts().tolist() == [6, 3, 1]


@pytest.mark.parametrize("backend", BACKENDS)
@given(weights=WEIGHTS, length=st.integers(min_value=0, max_value=400))
def test_order_is_the_rule_and_keeps_the_bound(backend: str, weights: list[Any], length: int) -> None:
    """Both backends equal the Fraction rule, and every prefix is within Tijdeman's bound."""
    with backend_of(backend):
        sources, checkpoints = tijdeman_order(weights, length, block=16)
    expected = reference_order(weights, length)
    assert sources.tolist() == expected
    assert_prefix_bound(weights, expected)
    k = len(weights)
    for row in range(checkpoints.shape[0]):
        assert checkpoints[row].tolist() == np.bincount(sources[: row * 16], minlength=k).tolist()


@needs_c
@given(weights=WEIGHTS, length=st.integers(min_value=0, max_value=3000), block=st.sampled_from([1, 2, 64, 1024]))
def test_c_equals_python(weights: list[Any], length: int, block: int) -> None:
    """The C kernel and the Python loop agree item for item and checkpoint for checkpoint."""
    c = tijdeman_order(weights, length, block)
    with backend_of("python"):
        python = tijdeman_order(weights, length, block)
    assert c[0].tolist() == python[0].tolist()
    assert c[1].tolist() == python[1].tolist()


@needs_c
@given(
    bits=st.lists(st.integers(min_value=1, max_value=120), min_size=2, max_size=6),
    noise=st.lists(st.integers(min_value=0, max_value=2**120), min_size=6, max_size=6),
)
def test_c_widths_equal_python(bits: list[int], noise: list[int]) -> None:
    """Integer weights of 1 to 120 bits run every width of the kernel (64, 128, 256-bit products) and the
    Python fallback beyond 2**116: all equal the Python loop, all keep the bound."""
    weights = [(1 << (b - 1)) + noise[i] % (1 << (b - 1)) if b > 1 else 1 for i, b in enumerate(bits)]
    c, _ = tijdeman_order(weights, 500)
    with backend_of("python"):
        python, _ = tijdeman_order(weights, 500)
    assert c.tolist() == python.tolist()
    assert_prefix_bound(weights, c.tolist())


def test_bound_is_reached_not_exceeded() -> None:
    """Over random weight sets the worst drift is exactly 1 - mu for k = 3 somewhere, never more."""
    rng = np.random.default_rng(1)
    worst = Fraction(0)
    for _ in range(20):
        weights = [Fraction(int(v), 1000) for v in rng.integers(1, 1000, 3)]
        sources = plan_mix(weights, length=300).sources.tolist()
        w = exact_weights(weights)
        counts = [0, 0, 0]
        for n, s in enumerate(sources, start=1):
            counts[s] += 1
            worst = max(worst, *(abs(counts[t] - w[t] * n) for t in range(3)))
    assert worst <= Fraction(3, 4)
    assert worst > Fraction(1, 2)


def test_one_source() -> None:
    plan = plan_mix([2.5], length=5)
    assert plan.sources.tolist() == [0] * 5
    assert plan.locate(3) == (0, 3)


def test_exact_weights_not_float_rounded() -> None:
    """Weights equal as numbers give one order whatever their type; 0.1 is a dyadic, not 1/10."""
    assert integer_weights([Fraction(1, 2), 0.25, 1]) == (2, 1, 4)
    assert normalised_weights([0.5, 0.5]) == (Fraction(1, 2), Fraction(1, 2))
    assert normalised_weights([0.1, 0.9])[0] == Fraction(0.1) / (Fraction(0.1) + Fraction(0.9))
    assert plan_mix([1, 3], length=50).sources.tolist() == plan_mix([0.25, 0.75], length=50).sources.tolist()


# -- random access -----------------------------------------------------------------


@given(weights=WEIGHTS, length=st.integers(min_value=1, max_value=600), data=st.data())
def test_locate_equals_iteration(weights: list[Any], length: int, data: st.DataObject) -> None:
    """`locate` of every position (as a batch, in a random order, and one by one) equals replaying the order."""
    plan = plan_mix(weights, length=length, block=data.draw(st.sampled_from([None, 1, 8, 64])))
    expected = running_indices(plan.sources, len(weights))
    sources, indices = plan.locate(np.arange(length))
    assert sources.tolist() == plan.sources.tolist()
    assert indices.tolist() == expected.tolist()
    picks = data.draw(st.lists(st.integers(min_value=0, max_value=length - 1), max_size=20))
    batch = plan.locate(np.array(picks, dtype=np.int64))
    assert batch[1].tolist() == expected[picks].tolist()
    for p in picks[:5]:
        assert plan.locate(p) == (int(plan.sources[p]), int(expected[p]))
        assert plan.counts(p).tolist() == np.bincount(plan.sources[:p], minlength=len(weights)).tolist()


def test_locate_refuses_out_of_range() -> None:
    plan = plan_mix([1, 1], length=10)
    with pytest.raises(OutOfRangeError, match="position 10 is out of range"):
        plan.locate(10)
    with pytest.raises(OutOfRangeError, match="position -1"):
        plan.locate(np.array([3, -1]))
    with pytest.raises(ConfigError, match="must be integers"):
        plan.locate(np.array([1.5]))
    assert plan.locate(np.array([], dtype=np.int64))[1].tolist() == []


def test_memory_per_item() -> None:
    """One byte per item plus at most half a byte of checkpoints (and one last row), for 3 and 255 sources."""
    for k in (3, 255):
        plan = plan_mix([1] * k, length=100_000)
        assert plan.nbytes <= 1.5 * len(plan) + 8 * k


# -- per-source streams ------------------------------------------------------------


@given(
    weights=WEIGHTS,
    sizes_seed=st.lists(st.integers(min_value=1, max_value=200), min_size=6, max_size=6),
    length=st.integers(min_value=0, max_value=1500),
    seed=SEEDS,
)
def test_each_source_is_its_exact_epochs(weights: list[Any], sizes_seed: list[int], length: int, seed: int) -> None:
    """Source s's items, in mixture order, are its source epochs 0, 1, 2, ... concatenated, each the
    chapter's Fisher–Yates (the plain loop of tests/spec.py) at `source_epoch_seed`, cut at its count."""
    sizes = sizes_seed[: len(weights)]
    plan = plan_mix(weights, length=length)
    sources, items = plan_items(plan, np.arange(length), sizes, seeded_orders(sizes, seed))
    assert sources.tolist() == plan.sources.tolist()
    for s, size in enumerate(sizes):
        got = items[sources == s].tolist()
        epochs = -(-len(got) // size)
        expected = [i for e in range(epochs) for i in spec.fisher_yates(size, source_epoch_seed(seed, s, e))[0]]
        assert got == expected[: len(got)]
        for e in range(len(got) // size):  # every whole epoch holds each item once
            assert sorted(got[e * size : (e + 1) * size]) == list(range(size))


def test_third_epoch_of_an_upsampled_source() -> None:
    """A 3-item source at half the weight of a 60-item one is in its many-th epoch; any position maps exactly."""
    sizes, seed = [60, 3], 11
    plan = plan_mix([2, 1], sizes=sizes)
    assert len(plan) == 90
    assert plan.counts().tolist() == [60, 30]
    orders = seeded_orders(sizes, seed)
    positions = np.flatnonzero(plan.sources == 1)
    source, index = plan.locate(int(positions[7]))  # the 8th item of source 1: epoch 2, position 1
    assert (source, index) == (1, 7)
    assert source_position(index, 3) == (2, 1)
    assert plan_items(plan, [positions[7]], sizes, orders)[1].tolist() == [int(orders[1](2)[1])]


def test_source_epoch_seed_derivation() -> None:
    """Draw number 256 e + s + 1 from the seed: derive_seed's draw, distinct across (source, epoch)."""
    for seed in (0, 7, 2**64 - 1):
        seeds = {source_epoch_seed(seed, s, e) for s in range(255) for e in range(4)}
        assert len(seeds) == 255 * 4
        assert source_epoch_seed(seed, 3, 2) == derive_seed(seed, 256 * 2 + 3 + 1)
    with pytest.raises(ConfigError, match="source=255"):
        source_epoch_seed(7, 255, 0)
    with pytest.raises(ConfigError, match="epoch=-1"):
        source_epoch_seed(7, 0, -1)


def test_source_items_with_plain_sequences() -> None:
    """Any indexable works as an epoch order; each epoch is fetched once."""
    fetched: list[int] = []

    def order(epoch: int) -> list[int]:
        fetched.append(epoch)
        return [2, 0, 1] if epoch % 2 else [0, 1, 2]

    assert source_items([0, 4, 1, 5, 6], 3, order).tolist() == [0, 0, 1, 1, 0]
    assert sorted(fetched) == [0, 1, 2]


# -- the default length ------------------------------------------------------------


@given(
    weights=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=6),
    sizes=st.lists(st.integers(min_value=1, max_value=200), min_size=6, max_size=6),
)
def test_default_length_passes_the_largest_source_once(weights: list[int], sizes: list[int]) -> None:
    """The mixture ends on the largest source's N-th item: the smallest length giving it all N."""
    sizes = sizes[: len(weights)]
    plan = plan_mix(weights, sizes=sizes)
    big = min(range(len(sizes)), key=lambda s: (-sizes[s], Fraction(weights[s], sum(weights)), s))
    assert plan.counts()[big] == sizes[big]
    assert int(plan.sources[-1]) == big
    assert default_length(sizes, weights) == len(plan)
    longer = plan_mix(weights, length=len(plan) + 50)
    assert longer.sources[: len(plan)].tolist() == plan.sources.tolist()
    assert plan.checkpoints.tolist() == longer.checkpoints[: plan.checkpoints.shape[0]].tolist()
    w_big = Fraction(weights[big], sum(weights))
    mu = Fraction(1, 2 * len(weights) - 2) if len(weights) > 1 else Fraction(1)
    assert abs(len(plan) - sizes[big] / w_big) <= (1 - mu) / w_big + 1


def test_default_length_examples() -> None:
    assert default_length([4, 1, 1], [0.5, 0.25, 0.25]) == 8
    assert default_length([5], [1.0]) == 5
    assert default_length([10, 30, 100], [1, 3, 6]) == 166  # 100 / 0.6 = 166.7: item 166 is the 100th of source 2


# -- refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([0.6, 0.3, float("nan")], r"weights\[2\]=nan must be a positive finite number"),
        ([0.6, 0.0], r"weights\[1\]=0\.0 must be a positive finite number"),
        ([0, 1], r"weights\[0\]=0 must be"),
        ([1, -0.5], r"weights\[1\]=-0\.5 must be"),
        ([1, float("inf")], r"weights\[1\]=inf must be"),
        ([float("-inf"), 1], r"weights\[0\]=-inf must be"),
        ([True, 1], r"weights\[0\]=True must be"),
        ([1, np.bool_(True)], r"weights\[1\]=.*True_? must be"),
        ([1, "0.5"], r"weights\[1\]='0\.5' must be"),
        ([1, None], r"weights\[1\]=None must be"),
        ([1, 1j], r"weights\[1\]=1j must be"),
        ([1, np.float32("nan")], r"weights\[1\]=.*nan\)? must be"),
        ([], r"weights has 0 entries; a mixture takes 1 to 255 sources"),
        ([1] * 256, r"weights has 256 entries"),
        (0.5, r"weights=0\.5 must be a sequence"),
        ("0.5", r"weights='0\.5' must be a sequence"),
    ],
)
def test_bad_weights_are_refused(weights: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_mix(weights, length=10)
    with pytest.raises(StreamBatchError):
        tijdeman_order(weights, 10)


def test_numpy_and_fraction_weights_are_accepted() -> None:
    expected = plan_mix([3, 1], length=20).sources.tolist()
    for weights in (np.array([0.75, 0.25]), [np.float32(0.75), np.int64(1) / 4], [Fraction(3), Fraction(1)], (3, 1)):
        assert plan_mix(weights, length=20).sources.tolist() == expected


def test_bad_lengths_and_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="length=-1"):
        plan_mix([1, 1], length=-1)
    with pytest.raises(ConfigError, match="needs sizes"):
        plan_mix([1, 1])
    with pytest.raises(ConfigError, match=r"sizes\[1\]=0"):
        plan_mix([1, 1], sizes=[3, 0])
    with pytest.raises(ConfigError, match="one item count per source"):
        plan_mix([1, 1], sizes=[3])
    with pytest.raises(ConfigError, match="too small a weight"):
        plan_mix([1, 1e-300], sizes=[1, 10])
    with pytest.raises(ConfigError, match="power of two"):
        plan_mix([1, 1], length=5, block=3)


def test_plan_repr_and_truncation() -> None:
    plan = plan_mix([1, 1], length=10, block=4)
    assert repr(plan) == "MixPlan(length=10, weights=['1/2', '1/2'], block=4)"
    short = plan.truncated(5)
    assert isinstance(short, MixPlan)
    assert short.sources.tolist() == plan.sources[:5].tolist()
    assert short.checkpoints.shape == (2, 2)
