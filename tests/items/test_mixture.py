"""Tests for `streambatch.items.mix.mixture`: a mixture is an `Items` the pipeline takes unchanged.

The hypothesis property checks the four claims over random sources: the prefix
bound at every n (in exact integers), each source's items as the concatenation
of its exact epochs (against `source_order`, computed independently of the
shuffle stage), random access against iteration, and resuming a `Run` at a
random position; batches are taken through every worker's and rank's share.
"""

from __future__ import annotations

import math
import pickle
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import ConfigError, DataError, StateError, StoreError, StreamBatchError
from streambatch.items.mix.gather import source_sums
from streambatch.items.mix.mixture import MixItem, Mixture, mix
from streambatch.items.mix.plan import integer_weights, source_order
from streambatch.order.splitmix import derive_seed

WEIGHT = st.one_of(
    st.sampled_from([1e-6, 1e-3, 0.1, 1 / 3, 0.6, 1.0, 7.0]),
    st.floats(min_value=1e-4, max_value=100.0),
    st.integers(min_value=1, max_value=1000),
)


def source(size: int, base: int, dtype: Any = np.uint32) -> sb.Windows:
    """*size* windows of T=1 over one document of distinct tokens ``base, base + 1, ...``: window j starts at j."""
    tokens = np.arange(base, base + size + 1, dtype=dtype)
    return sb.windows(sb.DocumentStore.from_arrays(tokens, [0, size + 1], ids=[f"doc-{base}"]), context_length=1)


def parts_of(sizes: list[int]) -> list[sb.Windows]:
    return [source(n, 1000 * s) for s, n in enumerate(sizes)]


def rows_in_order(mixture: Mixture, batch_size: int, workers: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, window) of every row, put back in mixture order from every worker's and rank's share."""
    length = len(mixture)
    sources = np.full(length, 255, dtype=np.uint8)
    windows = np.full(length, -1, dtype=np.int64)
    for rank in range(world):
        for worker in range(workers):
            chunks = sb.share(sb.chunk(mixture, batch_size), worker=worker, workers=workers, rank=rank, world_size=world)
            for view, batch in zip(chunks, sb.materialize(chunks), strict=True):
                assert isinstance(batch, sb.MiniBatch)
                assert batch.sources is not None
                lo = view._lo  # the view's place in the mixture
                assert (windows[lo : lo + batch.width] == -1).all()  # every row in exactly one share
                sources[lo : lo + batch.width] = batch.sources
                windows[lo : lo + batch.width] = batch.window_numbers
                bases = 1000 * batch.sources.astype(np.int64)
                assert (batch.inputs[:, 0] == bases + batch.window_numbers).all()  # the row's own source's tokens
    assert (windows >= 0).all()
    return sources, windows


def check_prefix_bound(sources: np.ndarray, weights: list[Any]) -> None:
    ints = integer_weights(weights)
    k, total = len(ints), sum(ints)
    counts = [0] * k
    for n, s in enumerate(sources.tolist(), start=1):
        counts[s] += 1
        for a, c in zip(ints, counts, strict=True):  # |c - w n| <= 1 - 1/(2k-2), times A (2k-2)
            assert abs(total * c - a * n) * (2 * k - 2) <= total * (2 * k - 3), (n, counts)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=200), min_size=2, max_size=6),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    batch_size=st.integers(min_value=1, max_value=9),
    workers=st.integers(min_value=1, max_value=3),
    world=st.integers(min_value=1, max_value=3),
)
def test_mixture_property(sizes: list[int], data: st.DataObject, seed: int, batch_size: int, workers: int, world: int) -> None:
    weights = data.draw(st.lists(WEIGHT, min_size=len(sizes), max_size=len(sizes)))
    length = data.draw(st.one_of(st.none(), st.integers(min_value=1, max_value=3 * sum(sizes))))
    ints = integer_weights(weights)
    big = min(range(len(sizes)), key=lambda s: (-sizes[s], Fraction(ints[s]), s))
    assume(length is not None or Fraction(sizes[big] * sum(ints), ints[big]) < 20_000)  # one pass of a tiny weight is huge
    mixture = mix(parts_of(sizes), weights, seed=seed, length=length)
    sources, windows = rows_in_order(mixture, batch_size, workers, world)
    assert np.array_equal(sources, mixture.sources())
    check_prefix_bound(sources, weights)
    for s, size in enumerate(sizes):  # each source: its exact epochs, concatenated
        got = windows[sources == s]
        epochs = -(-got.size // size)
        expected = np.concatenate([source_order(size, seed, s, e) for e in range(epochs)]) if epochs else got
        assert np.array_equal(got, expected[: got.size])
    if length is None:  # the largest source passed exactly once, ending the mixture
        assert mixture.counts().tolist()[big] == sizes[big]
        assert sources[-1] == big
    at = data.draw(st.lists(st.integers(min_value=0, max_value=len(mixture) - 1), max_size=5))
    assert [mixture[i] for i in at] == [MixItem(int(sources[i]), int(windows[i])) for i in at]  # random access
    run = sb.Run(mixture, batch_size=batch_size, seed=seed, epochs=2)
    every = [(b.epoch, b.index, b.sources.tolist(), b.inputs.tolist()) for b in run]
    step = data.draw(st.integers(min_value=0, max_value=len(every)))
    again = sb.Run(mixture, batch_size=batch_size, seed=seed, epochs=2)
    again.load_state_dict(run.state_dict(run.position_of(step)) if step < len(every) else run.state_dict((2, 0)))
    assert [(b.epoch, b.index, b.sources.tolist(), b.inputs.tolist()) for b in again] == every[step:]


def test_upsampled_source_resumes_in_its_third_epoch() -> None:
    """A 4-window source at weight 1/2 beside a 40-window one: its third epoch starts after item ~16."""
    mixture = mix([source(40, 0), source(4, 1000)], [1, 1], seed=11)
    assert mixture.source_epochs()[1] > 9  # upsampled: nearly ten epochs of the small source
    run = sb.Run(mixture, batch_size=3, seed=11, epochs=1)
    every = list(run)
    cut = next(i for i, b in enumerate(every) if mixture.counts((i + 1) * 3)[1] > 8) + 1  # inside its third epoch
    assert 8 < mixture.counts(cut * 3)[1] < 12
    state = run.state_dict((0, cut))
    resumed = sb.Run(mix([source(40, 0), source(4, 1000)], [1, 1], seed=11), batch_size=3, seed=None, epochs=1)
    resumed.load_state_dict(state)
    assert list(resumed) == every[cut:]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "0.5"])
def test_bad_weights_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"weights\[1\]"):
        mix([source(3, 0), source(3, 1000)], [0.5, bad], seed=1)


def test_changed_mixture_state_is_refused_and_changes_nothing() -> None:
    run = sb.Run(mix([source(9, 0), source(3, 1000)], [0.7, 0.3], seed=2), batch_size=2, seed=None, epochs=1)
    next(iter(run))
    state = run.state_dict()
    for changed in (
        mix([source(9, 0), source(3, 1000)], [0.6, 0.4], seed=2),  # a weight
        mix([source(9, 0), source(4, 1000)], [0.7, 0.3], seed=2),  # a source
        mix([source(9, 0), source(3, 2000)], [0.7, 0.3], seed=2),  # a source's content
        mix([source(9, 0), source(3, 1000)], [0.7, 0.3], seed=3),  # the seed
    ):
        other = sb.Run(changed, batch_size=2, seed=None, epochs=1)
        with pytest.raises(StateError, match=r"the mixture changed|seed="):
            other.load_state_dict(state)
        assert other.position == (0, 0)


def test_mixture_refuses_bad_parts() -> None:
    a = source(5, 0)
    with pytest.raises(ConfigError, match="already shuffled"):
        mix([sb.shuffle(a, 1), a], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="context_length"):
        mix([a, sb.windows(a.store, context_length=2)], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="one weight per source"):
        mix([a, a], [1], seed=1)
    with pytest.raises(ConfigError, match="twice"):
        mix([a, a], [1, 1], seed=1, names=["x", "x"])


def test_epoch_over_a_mixture_is_the_chained_stages() -> None:
    mixture = mix([source(30, 0), source(7, 1000), source(2, 2000)], [0.5, 0.3, 0.2], seed=9)
    epoch = sb.Epoch(mixture, batch_size=4)
    chained = list(sb.materialize(sb.chunk(mixture, 4)))
    assert list(epoch) == chained
    assert [epoch.batch(i) for i in range(epoch.batch_count)] == chained
    assert [b.width for b in chained][-1] == len(mixture) % 4 or len(mixture) % 4 == 0  # the short final batch
    assert epoch.batch_count == math.ceil(len(mixture) / 4)
    with pytest.raises(ConfigError, match="seed"):
        sb.Epoch(mixture, batch_size=4, seed=10)


def test_run_epochs_reseed_the_sources_only() -> None:
    mixture = mix([source(6, 0), source(3, 1000)], [2, 1], seed=4)
    run = sb.Run(mixture, batch_size=3, seed=None, epochs=2)
    first = run.epoch(0).order
    second = run.epoch(1).order
    assert isinstance(first, Mixture)
    assert isinstance(second, Mixture)
    assert np.array_equal(first.sources(), second.sources())  # Tijdeman's order does not depend on the seed
    assert first.numbers().tolist() != second.numbers().tolist()
    assert second.seed == derive_seed(4, 1)
    assert first.seed == 4


def test_per_source_token_mean_over_micro_batches_and_ranks() -> None:
    mixture = mix([source(20, 0), source(5, 1000), source(9, 2000)], [0.5, 0.25, 0.25], seed=6)
    whole = sb.materialize(sb.chunk(mixture, 8))[1]
    losses = np.arange(whole.width, dtype=np.float64) / 8 + 0.125  # exact in binary: sums are exact
    direct = sb.token_mean([source_sums(whole, losses)])
    pieces = []
    for rank in range(3):  # every rank's rows, split again into micro-batches of one or two rows
        share = sb.materialize(sb.share(sb.chunk(mixture, 8), rank=rank, world_size=3))[1]
        lo = sum(len(sb.share(sb.chunk(mixture, 8), rank=r, world_size=3)[1]) for r in range(rank))
        for first in range(0, share.width, 2):
            part = sb.materialize(sb.share(sb.chunk(mixture, 8), rank=rank, world_size=3))[1]
            rows = slice(first, min(first + 2, share.width))
            micro = sb.MiniBatch(part.index, part.inputs[rows], part.targets[rows], part.positions[rows], part.spaces,
                                 sources=part.sources[rows], names=part.names)  # fmt: skip
            pieces.append(source_sums(micro, losses[lo + rows.start : lo + rows.stop]))
    folded = sb.token_mean(pieces)
    assert folded.mean_loss == direct.mean_loss
    assert folded.token_count == direct.token_count
    assert direct.sources is not None
    assert folded.sources is not None
    assert {s: (m.token_count, m.mean_loss) for s, m in folded.sources.items()} == {
        s: (m.token_count, m.mean_loss) for s, m in direct.sources.items()
    }
    for s, mean in direct.sources.items():
        rows = whole.sources == s
        assert mean.token_count == int(rows.sum())
        assert mean.mean_loss == losses[rows].sum() / rows.sum()
    plain = sb.token_mean([sb.TokenSums(1.0, 2, np.zeros(1))])
    assert plain.sources is None  # batches without sources: no per-source means


def test_plan_files_are_shared_and_checked(tmp_path: Path) -> None:
    parts = [source(50, 0), source(7, 1000)]
    first = mix(parts, [0.8, 0.2], seed=5, plan_dir=tmp_path)
    second = mix(parts, [0.8, 0.2], seed=6, plan_dir=tmp_path)  # another seed: the same order file
    assert first.space.plan_path == second.space.plan_path
    assert list(first) == list(mix(parts, [0.8, 0.2], seed=5))
    assert isinstance(first.plan.sources.base, np.memmap) or first.plan.sources.base is not None
    copied = pickle.loads(pickle.dumps(first))  # a spawned worker maps the file again
    assert list(copied) == list(first)
    assert len(pickle.dumps(first)) < 4096 + len(first)
    assert list(sb.materialize(sb.chunk(copied, 4))) == list(sb.materialize(sb.chunk(first, 4)))
    path = Path(first.space.plan_path or "")
    path.write_bytes(path.read_bytes()[:-8])  # truncated
    with pytest.raises(StoreError, match="remove"):
        mix(parts, [0.8, 0.2], seed=5, plan_dir=tmp_path)


def test_mixed_dtypes_and_corpora_gather_every_row() -> None:
    small = source(5, 100, np.uint16)
    wide = source(6, 70_000, np.uint32)
    a = sb.DocumentStore.from_arrays(np.arange(10, 18, dtype=np.uint32), [0, 8], ids=["a"])
    b = sb.DocumentStore.from_arrays(np.arange(50, 55, dtype=np.uint32), [0, 5], ids=["b"])
    sharded = sb.windows(sb.Corpus([a, b]), context_length=1)
    mixture = mix([small, wide, sharded], [1, 1, 1], seed=3, length=40)
    for batch in sb.materialize(sb.chunk(mixture, 7)):
        assert batch.inputs.dtype == np.uint32
        for r, (s, p) in enumerate(zip(batch.sources.tolist(), batch.positions.tolist(), strict=True)):
            tokens = batch.spaces[s].store.window_tokens([p], 2)[0]
            assert batch.inputs[r, 0] == tokens[0]
            assert batch.targets[r, 0] == tokens[1]
        assert batch.source_names == [f"source-{s}" for s in batch.sources.tolist()]
        assert len(batch.provenance) == batch.width


def test_a_damaged_source_plan_is_a_data_error() -> None:
    mixture = mix([source(5, 0), source(5, 1000)], [1, 1], seed=3)
    order = mixture.space.order(0, 0)
    order.plan_values()[0] = 10_000  # a start beyond the source's tokens
    with pytest.raises(DataError, match="not a window start"):
        list(sb.materialize(sb.chunk(mixture, 4)))


def test_every_refusal_is_a_streambatch_error() -> None:
    a = source(4, 0)
    for call in (
        lambda: mix(a, [1], seed=1),
        lambda: mix([a], [1], seed=-1),
        lambda: mix([a, a], [1, 1], seed=1, length=-3),
        lambda: mix([a, a], [1, 1], seed=1)[99],
        lambda: mix([a, a], [1, 1], seed=1)[::2],
    ):
        with pytest.raises(StreamBatchError):
            call()
