"""Tests for `streambatch.batch.reduce`: raw sums, merged, divided once; failures change nothing."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import AccumulationError, TokenContribution, TokenMeanAccumulator, token_mean

# dyadic values: every partial sum is exact, so any split must give identical bits
dyadic = st.integers(-(2**20), 2**20).map(lambda n: n / 1024)
contribution_lists = st.lists(st.tuples(dyadic, dyadic, dyadic), min_size=1, max_size=40)


def _contributions(raw: list[tuple[float, float, float]]) -> list[TokenContribution]:
    return [TokenContribution(loss, [g0, g1]) for loss, g0, g1 in raw]


def _accumulate(items: list[TokenContribution]) -> TokenMeanAccumulator:
    acc = TokenMeanAccumulator(2)
    for item in items:
        acc.add_token(item)
    return acc


def test_chapter_final_batch_divides_by_four_not_six() -> None:
    """Losses [0.125, 0.25, 0.625, 0.75] sum to 1.75; the mean is 1.75 / 4 = 0.4375."""
    losses = [0.125, 0.25, 0.625, 0.75]
    mean = token_mean([TokenContribution(x, [2 * x, 2 - x]) for x in losses])
    assert mean.token_count == 4
    assert mean.mean_loss == 0.4375
    assert mean.mean_gradient.tolist() == [0.875, 1.5625]
    assert mean.mean_loss != pytest.approx(1.75 / 6)


@given(contribution_lists, st.data())
def test_merging_any_split_equals_one_pass(raw: list[tuple[float, float, float]], data: st.DataObject) -> None:
    """Split the tokens anywhere into pieces, merge raw sums: bit-identical to one pass."""
    items = _contributions(raw)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=4)))
    bounds = [0, *cuts, len(items)]
    merged = TokenMeanAccumulator(2)
    for lo, hi in itertools.pairwise(bounds):
        merged.merge(_accumulate(items[lo:hi]))
    assert _accumulate(items).finish() == merged.finish()


@given(contribution_lists)
def test_vectorized_and_presummed_adds_agree_on_dyadic_values(raw: list[tuple[float, float, float]]) -> None:
    """add_tokens (numpy order) and add_sums equal add_token when sums are exact."""
    items = _contributions(raw)
    losses = np.array([r[0] for r in raw])
    grads = np.array([[r[1], r[2]] for r in raw])
    vectorized = TokenMeanAccumulator(2)
    vectorized.add_tokens(losses, grads)
    presummed = TokenMeanAccumulator(2)
    presummed.add_sums(losses.sum(), len(raw), grads.sum(axis=0))
    expected = _accumulate(items)
    assert expected == vectorized
    assert expected == presummed


def test_mean_of_means_is_wrong_for_unequal_pieces() -> None:
    """Averaging piece means gives a short piece the weight of a full one; raw sums do not."""
    full = _contributions([(1.0, 0.0, 0.0)] * 6)
    short = _contributions([(3.0, 0.0, 0.0)] * 2)
    merged = _accumulate(full)
    merged.merge(_accumulate(short))
    assert merged.finish().mean_loss == 1.5  # (6 + 6) / 8
    assert (_accumulate(full).finish().mean_loss + _accumulate(short).finish().mean_loss) / 2 == 2.0


def _snapshot(acc: TokenMeanAccumulator) -> tuple[int, float, list[float]]:
    return acc.token_count, acc.loss_sum, acc.gradient_sums.tolist()


big = 1.7e308


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda a: a.add_token(TokenContribution(1.0, [1.0])), "gradient width 1"),
        (lambda a: a.add_token(TokenContribution(big, [0.0, 0.0])), "loss sum would become inf"),
        (lambda a: a.add_token(TokenContribution(0.0, [0.0, big])), "gradient sum coordinate 1 would become inf"),
        (lambda a: a.add_tokens([1.0, 1.0], [[0.0, 1.0]]), "2 tokens but gradients has 1 rows"),
        (lambda a: a.add_tokens([1.0], [[0.0, np.nan]]), r"gradients\[\(0, 1\)\]=nan is not finite"),
        (lambda a: a.add_tokens([np.inf], [[0.0, 0.0]]), r"losses\[0\]=inf is not finite"),
        (lambda a: a.add_sums(1.0, -1, [0.0, 0.0]), "token_count=-1 must be a non-negative int"),
        (lambda a: a.add_sums(1.0, 0, [0.0, 0.0]), "token_count=0 but the sums are not zero"),
        (lambda a: a.add_sums(1.0, 1, [0.0, big]), "gradient sum coordinate 1 would become inf"),
        (lambda a: a.merge(TokenMeanAccumulator(3)), "gradient width 3"),
        (lambda a: a.add_token((1.0, [1.0, 2.0])), "is not a TokenContribution"),
    ],
    ids=[
        "width",
        "loss-overflow",
        "late-coordinate-overflow",
        "count-mismatch",
        "nan-gradient",
        "inf-loss",
        "negative-count",
        "zero-count-nonzero-sum",
        "presummed-overflow",
        "merge-width",
        "not-a-contribution",
    ],
)
def test_failed_calls_change_nothing(action: object, message: str) -> None:
    """Every rejected call raises AccumulationError and leaves all sums exactly as they were."""
    acc = TokenMeanAccumulator(2)
    acc.add_token(TokenContribution(big, [1.0, big]))  # the loss and the late coordinate are near overflow
    before = _snapshot(acc)
    storage = acc._gradient_sums
    with pytest.raises(AccumulationError, match=message):
        action(acc)  # type: ignore[operator]
    assert before == _snapshot(acc)
    assert storage is acc._gradient_sums  # updated in place, never reallocated


@given(contribution_lists, st.integers(0, 39))
def test_failure_after_any_prefix_changes_nothing(raw: list[tuple[float, float, float]], at: int) -> None:
    """Whatever was added before, an add that overflows only its last coordinate changes nothing."""
    acc = _accumulate(_contributions(raw[: at % len(raw) + 1]))
    huge = TokenContribution(0.0, [0.0, np.finfo(np.float64).max])
    acc.add_token(huge)  # small dyadic sums keep this finite
    before = copy.deepcopy(acc)
    with pytest.raises(AccumulationError, match="coordinate 1 would become inf"):
        acc.add_token(huge)
    assert before == acc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.nan, [1.0]), "loss=nan is not finite"),
        ((1.0, []), r"gradient=\[\] is empty"),
        ((1.0, [1.0, np.inf]), r"gradient\[1\]=inf is not finite"),
        ((True, [1.0]), "loss=True is not a real number"),
        (("1", [1.0]), "loss='1' is not a real number"),
        ((1.0, [[1.0]]), "pass a 1-D sequence"),
    ],
    ids=["nan-loss", "empty-gradient", "inf-gradient", "bool-loss", "str-loss", "2d-gradient"],
)
def test_invalid_contributions(args: tuple[object, object], message: str) -> None:
    """Contributions are checked at construction."""
    with pytest.raises(AccumulationError, match=message):
        TokenContribution(*args)


def test_empty_accumulator_cannot_finish() -> None:
    """Finishing with zero tokens is an error, not a division by zero."""
    with pytest.raises(AccumulationError, match="empty accumulator: token_count=0"):
        TokenMeanAccumulator(2).finish()


@pytest.mark.parametrize("width", [0, -1, 2.0])
def test_bad_gradient_width(width: object) -> None:
    """The accumulator's width is a positive int."""
    with pytest.raises(AccumulationError, match=r"gradient_width=.* must be a positive int"):
        TokenMeanAccumulator(width)  # type: ignore[arg-type]


def test_finish_does_not_consume() -> None:
    """finish() may be called again; the accumulator keeps its raw sums, so later tokens still count fully."""
    acc = _accumulate(_contributions([(1.0, 2.0, 3.0), (3.0, 0.0, 1.0)]))
    for _ in range(2):
        mean = acc.finish()
        assert (2, 2.0, [1.0, 2.0]) == (mean.token_count, mean.mean_loss, mean.mean_gradient.tolist())
    assert acc.token_count == 2
    acc.add_token(TokenContribution(5.0, [4.0, 8.0]))  # sums (9, [6, 12]) over 3 tokens; consumed means would not give this
    mean = acc.finish()
    assert (3, 3.0, [2.0, 4.0]) == (mean.token_count, mean.mean_loss, mean.mean_gradient.tolist())


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(1, 50), st.floats(-1e6, 1e6)), min_size=1, max_size=20))
def test_token_mean_folds_raw_sums(pieces: list[tuple[float, int, float]]) -> None:
    """token_mean over TokenSums = (sum of loss sums) / (sum of counts); never the mean of means."""
    sums = [sb.TokenSums(loss, count, np.array([grad])) for loss, count, grad in pieces]
    mean = sb.token_mean(iter(sums))
    total = sum(c for _, c, _ in pieces)
    assert mean.token_count == total
    assert mean.mean_loss == pytest.approx(math.fsum(loss for loss, _, _ in pieces) / total, rel=1e-9, abs=1e-9)
    folded = sum(sums[1:], sums[0]).mean()
    assert folded.token_count == total
    assert folded.mean_loss == pytest.approx(mean.mean_loss, rel=1e-12, abs=1e-12)


def test_token_mean_mixes_piece_kinds() -> None:
    """TokenSums, single contributions and accumulators fold into one mean."""
    acc = sb.TokenMeanAccumulator(1)
    acc.add_token(sb.TokenContribution(3.0, [1.0]))
    mean = sb.token_mean([sb.TokenSums(1.0, 2, np.array([2.0])), sb.TokenContribution(2.0, [0.0]), acc])
    assert (mean.token_count, mean.mean_loss, mean.mean_gradient.tolist()) == (4, 1.5, [0.75])
    with pytest.raises(sb.AccumulationError, match="is not TokenSums"):
        sb.token_mean([sb.TokenSums(1.0, 2, np.array([2.0])), 5])
    with pytest.raises(sb.AccumulationError, match="token_count=0"):
        sb.TokenSums(0.0, 0, np.zeros(1)).mean()


def test_one_argument_order_everywhere() -> None:
    """TokenSums, add_sums, merge and add take raw sums as (loss_sum, token_count, gradient_sum) and agree."""
    piece = sb.TokenSums(1.5, 3, np.array([2.0, 4.0]))
    by_call, by_merge, by_add = (TokenMeanAccumulator(2) for _ in range(3))
    by_call.add_sums(1.5, 3, np.array([2.0, 4.0]))
    by_merge.merge(piece)
    by_add.add(piece)
    assert by_call == by_merge == by_add
    assert by_merge.sums.token_count == 3
    assert by_merge.finish().mean_gradient.tolist() == [2.0 / 3, 4.0 / 3]


def test_add_sums_old_order_still_works_with_a_warning() -> None:
    """The 0.3 order (loss_sum, gradient_sum, token_count) gives the same sums, with a DeprecationWarning."""
    new, old = TokenMeanAccumulator(2), TokenMeanAccumulator(2)
    new.add_sums(1.5, 3, [2.0, 4.0])
    with pytest.warns(DeprecationWarning, match=r"pass \(loss_sum, token_count, gradient_sum\)"):
        old.add_sums(1.5, [2.0, 4.0], 3)
    assert old == new


def test_token_sums_in_the_wrong_order_is_refused() -> None:
    """TokenSums(loss, gradient, count) is refused, naming the one order, instead of adding a gradient as a count."""
    with pytest.raises(sb.AccumulationError, match=r"gradient_sum, token_count\?.*takes \(loss_sum, token_count"):
        sb.TokenSums(1.5, np.array([2.0]), 3)
    with pytest.raises(sb.AccumulationError, match="token_count=-1 must be a non-negative int"):
        sb.TokenSums(0.0, -1, np.zeros(1))
    accumulator = TokenMeanAccumulator(1)
    with pytest.raises(sb.AccumulationError, match="is not a TokenMeanAccumulator or TokenSums"):
        accumulator.merge([1.0, 1, [1.0]])  # type: ignore[arg-type]
    assert accumulator.token_count == 0


def test_token_sums_count_may_be_any_integer_kind() -> None:
    """A numpy int or a one-element integer tensor is a count (kept as an int); a bool or a float is not."""
    assert sb.TokenSums(1.0, np.int64(4), np.zeros(1)).token_count == 4
    assert type(sb.TokenSums(1.0, np.int64(4), np.zeros(1)).token_count) is int
    torch = pytest.importorskip("torch")
    assert sb.TokenSums(1.0, torch.tensor(4), 0.0).token_count == 4
    for count in (True, 4.0, torch.tensor(4.0)):
        with pytest.raises(sb.AccumulationError, match="must be a non-negative int"):
            sb.TokenSums(1.0, count, 0.0)
