"""The packed epoch's invariants, as a hypothesis property over random corpora and pipelines.

Documents of 1 token, of exactly T + 1 tokens and of many times T; any T, batch
size, seed, worker count and rank count: every (document, target position) is
covered exactly once, every input and target is the document's own token,
segment and position ids are consistent, padding is masked, and the token mean
over batches equals the direct mean over all targets.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.order.shuffle import shuffled_order


@st.composite
def corpora(draw: st.DrawFn) -> tuple[list[sb.Document], int]:
    """Documents whose lengths mix 0, 1, T + 1, k * T (+ 1) and anything else up to 5 T."""
    T = draw(st.integers(min_value=1, max_value=9))
    special = st.sampled_from([0, 1, 2, T, T + 1, 2 * T, 2 * T + 1, 3 * T + 1, 5 * T])
    lengths = draw(st.lists(st.one_of(special, st.integers(min_value=0, max_value=5 * T)), min_size=1, max_size=12))
    big = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    top = 2**32 - 1 if big else 60_000
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, top, n, dtype=np.int64).tolist()) for i, n in enumerate(lengths)]
    return docs, T


def _mean_of(values: list[tuple[float, int]]) -> float:
    """Token mean from raw sums per piece: the one division."""
    mean = sb.token_mean(sb.TokenSums(loss, count, np.zeros(1)) for loss, count in values if count)
    return float(mean.mean_loss)


@given(
    corpus=corpora(),
    batch_size=st.integers(min_value=1, max_value=5),
    seed=st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)),
    workers=st.integers(min_value=1, max_value=3),
    world=st.integers(min_value=1, max_value=3),
    numpy_gather=st.booleans(),
)
def test_packed_epoch_covers_every_target_once(
    corpus: tuple[list[sb.Document], int], batch_size: int, seed: int | None, workers: int, world: int, numpy_gather: bool
) -> None:
    docs, T = corpus
    rows = sb.pack(docs, context_length=T)
    switch = _kernels.use("packed_gather", "python") if numpy_gather else contextlib.nullcontext()  # the same batches
    ordered = rows if seed is None else sb.shuffle(rows, seed)
    chunks = sb.chunk(ordered, batch_size)
    seen: Counter[tuple[int, int]] = Counter()
    per_batch: dict[int, list[tuple[float, int]]] = {}
    loss_of = {i: np.asarray(d.tokens, dtype=np.float64) * 1e-6 for i, d in enumerate(docs)}  # a "loss" per target
    with switch:
        for worker in range(workers):
            for rank in range(world):
                for batch in sb.materialize(sb.share(chunks, worker=worker, workers=workers, rank=rank, world_size=world)):
                    _check_batch(batch, docs, T, seen)
                    per_batch.setdefault(batch.index, []).append(_loss_sum(batch, loss_of))
    expected = Counter((d, p) for d, doc in enumerate(docs) for p in range(1, len(doc)))
    assert seen == expected  # every (document, target position) exactly once
    assert sorted(per_batch) == list(range(len(chunks)))
    total_targets = sum(expected.values())
    assert rows.report.targets == total_targets
    if total_targets:
        direct = sum(float(loss_of[d][p]) for d, p in expected) / total_targets
        assert abs(_mean_of([piece for pieces in per_batch.values() for piece in pieces]) - direct) <= 1e-12 * max(1, direct)


def _loss_sum(batch: Any, loss_of: dict[int, np.ndarray]) -> tuple[float, int]:
    """The batch's summed per-target loss over real targets (loss_mask), and its target count."""
    total = 0.0
    for d, start, n in zip(batch.document_indices, batch.starts, batch.segment_lengths, strict=True):
        total += float(loss_of[int(d)][int(start) + 1 : int(start) + 1 + int(n)].sum())
    assert batch.target_count == int(batch.loss_mask.sum()) == batch.token_count
    return total, batch.target_count


def _check_batch(batch: Any, docs: list[sb.Document], T: int, seen: Counter[tuple[int, int]]) -> None:
    assert batch.inputs.shape == batch.targets.shape == batch.segment_ids.shape == (batch.width, T)
    column = Counter[int]()
    ids_of: dict[int, list[int]] = {}
    for d, start, n, row in zip(batch.document_indices, batch.starts, batch.segment_lengths, batch.segment_rows, strict=True):
        d, start, n, row = int(d), int(start), int(n), int(row)
        tokens = np.asarray(docs[d].tokens, dtype=np.int64)
        at = column[row]
        segment = int(batch.segment_ids[row, at])
        ids_of.setdefault(row, []).append(segment)
        assert 1 <= n <= T
        assert start % T == 0
        assert start + n < len(tokens)
        assert batch.inputs[row, at : at + n].tolist() == tokens[start : start + n].tolist()  # the document's own tokens
        assert batch.targets[row, at : at + n].tolist() == tokens[start + 1 : start + n + 1].tolist()
        assert batch.segment_ids[row, at : at + n].tolist() == [segment] * n
        assert batch.position_ids[row, at : at + n].tolist() == list(range(n))
        assert batch.loss_mask[row, at : at + n].all()
        seen.update((d, p) for p in range(start + 1, start + n + 1))
        column[row] = at + n
    for row in range(batch.width):
        used = column[row]
        assert used >= 1
        assert ids_of[row] == list(range(len(ids_of[row])))
        assert not batch.loss_mask[row, used:].any()
        assert (batch.segment_ids[row, used:] == -1).all()
        assert (batch.inputs[row, used:] == 0).all()
        assert (batch.targets[row, used:] == 0).all()
    cu = batch.cu_seqlens
    assert cu[0] == 0
    assert cu[-1] == batch.width * T
    assert (np.diff(cu) >= 1).all()
    assert batch.max_seqlen == (int(np.diff(cu).max()) if cu.size > 1 else 0)
    assert int(batch.sequence_is_pad.sum()) == sum(1 for row in range(batch.width) if column[row] < T)


@given(corpus=corpora(), seed=st.integers(min_value=0, max_value=2**64 - 1))
def test_shuffle_of_rows_is_the_chapters_permutation(corpus: tuple[list[sb.Document], int], seed: int) -> None:
    """sb.shuffle(rows, seed) orders row numbers exactly as the chapter's SplitMix64 Fisher-Yates orders range(n)."""
    docs, T = corpus
    rows = sb.pack(docs, context_length=T)
    order, state = shuffled_order(len(rows), seed)
    shuffled = sb.shuffle(rows, seed)
    assert list(shuffled) == order.tolist()
    assert shuffled.shuffle_state_after == state
    assert sorted(shuffled) == list(range(len(rows)))  # another order, the same membership
