"""Tests for mixtures of packed rows (`streambatch.items.mix.packed_gather`): ``sb.mix`` of ``sb.pack`` parts.

The hypothesis property is the mixture property (tests/items/test_mixture.py) over
packed parts: the prefix bound at every n, each source's rows as the
concatenation of its exact epochs (against `source_order`, computed apart from
the shuffle stage), random access against iteration, resuming a `Run` at a
random position, and every target of a source once per source epoch, read from
the batches' tokens (every token names its source, document and position).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.batch.minibatch import MiniBatch
from streambatch.errors import ConfigError, StateError
from streambatch.items.mix.gather import source_sums
from streambatch.items.mix.mixture import MixItem, Mixture, mix
from streambatch.items.mix.plan import integer_weights, source_order
from tests.items.test_mixture import WEIGHT, check_prefix_bound

HAVE_C = _kernels.available()["packed_gather"]

LENGTHS = st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=5)


def token(source: int, document: int, position: int) -> int:
    """A token that names its place: distinct for every (source, document, position)."""
    return source * 1_000_000 + document * 1_000 + position


def packed_source(s: int, lengths: list[int], T: int, dtype: Any = np.uint32) -> sb.Rows:
    docs = [sb.Document(f"s{s}d{d}", "train", [token(s, d, p) for p in range(n)]) for d, n in enumerate(lengths)]
    store = sb.DocumentStore.from_documents(docs) if dtype is np.uint32 else _narrow(docs)
    return sb.pack(store, context_length=T)


def _narrow(docs: list[sb.Document]) -> sb.DocumentStore:
    tokens = np.concatenate([np.asarray(d.tokens, dtype=np.int64) % 60_000 for d in docs]).astype(np.uint16)
    offsets = np.cumsum([0, *[len(d.tokens) for d in docs]])
    return sb.DocumentStore.from_arrays(tokens, offsets, ids=[d.id for d in docs])


def all_targets(s: int, lengths: list[int]) -> Counter[int]:
    """Every target of source *s*: positions 1 .. L - 1 of each document."""
    return Counter(token(s, d, p) for d, n in enumerate(lengths) for p in range(1, n))


def rows_in_order(mixture: Mixture, batch_size: int, workers: int, world: int) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """(source, row number, (targets, inputs) of the row) of every item, back in mixture order from every share."""
    length = len(mixture)
    sources = np.full(length, 255, dtype=np.uint8)
    numbers = np.full(length, -1, dtype=np.int64)
    rows: list[Any] = [None] * length
    for rank in range(world):
        for worker in range(workers):
            chunks = sb.share(sb.chunk(mixture, batch_size), worker=worker, workers=workers, rank=rank, world_size=world)
            for view, batch in zip(chunks, sb.materialize(chunks), strict=True):
                assert isinstance(batch, MiniBatch)
                assert batch.packed
                assert batch.sources is not None
                check_batch(batch)
                lo = view._lo  # the view's place in the mixture
                assert (numbers[lo : lo + batch.width] == -1).all()  # every row in exactly one share
                sources[lo : lo + batch.width] = batch.sources
                numbers[lo : lo + batch.width] = batch.row_numbers
                for r in range(batch.width):
                    mask = batch.loss_mask[r]
                    rows[lo + r] = (batch.targets[r][mask].tolist(), batch.inputs[r][mask].tolist())
    assert (numbers >= 0).all()
    return sources, numbers, rows


def check_batch(batch: MiniBatch) -> None:
    """The packed fields hold together: real targets only in the mask, cu_seqlens over the rows, ids per segment."""
    T = batch.context_length
    assert batch.target_count == int(batch.loss_mask.sum())
    assert (batch.segment_ids[~batch.loss_mask] == -1).all()
    assert (batch.inputs[~batch.loss_mask] == 0).all()  # the pad id
    cu = batch.cu_seqlens.astype(np.int64)
    assert cu[0] == 0
    assert cu[-1] == batch.width * T
    assert (np.diff(cu) > 0).all()
    assert set(range(0, batch.width * T + 1, T)) <= set(cu.tolist())  # every row boundary is a sequence boundary
    assert batch.max_seqlen == (int(np.diff(cu).max()) if batch.width else 0)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):  # one sequence: one segment, positions 0, 1, ...
        flat = batch.position_ids.reshape(-1)[lo:hi]
        assert flat.tolist() == list(range(hi - lo))
        assert np.unique(batch.segment_ids.reshape(-1)[lo:hi]).size == 1
    provenance = batch.provenance
    assert [p.row for p in provenance] == batch.segment_rows.tolist()
    for p, s in zip(provenance, batch.segment_sources.tolist(), strict=True):
        assert p.document_id.startswith(f"s{s}d")  # each segment resolved in its own source
        assert batch.names[s] == f"source-{s}"


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(LENGTHS, min_size=2, max_size=4),
    T=st.integers(min_value=1, max_value=6),
    data=st.data(),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    batch_size=st.integers(min_value=1, max_value=7),
    workers=st.integers(min_value=1, max_value=3),
    world=st.integers(min_value=1, max_value=3),
)
def test_packed_mixture_property(
    lengths: list[list[int]], T: int, data: st.DataObject, seed: int, batch_size: int, workers: int, world: int
) -> None:
    assume(all(any(n > 1 for n in source) for source in lengths))  # every source has a target
    parts = [packed_source(s, source, T) for s, source in enumerate(lengths)]
    sizes = [len(p) for p in parts]
    weights = data.draw(st.lists(WEIGHT, min_size=len(parts), max_size=len(parts)))
    length = data.draw(st.one_of(st.none(), st.integers(min_value=1, max_value=3 * sum(sizes))))
    ints = integer_weights(weights)
    big = min(range(len(sizes)), key=lambda s: (-sizes[s], Fraction(ints[s]), s))
    assume(length is not None or Fraction(sizes[big] * sum(ints), ints[big]) < 20_000)  # one pass of a tiny weight is huge
    mixture = mix(parts, weights, seed=seed, length=length)
    if length is None:  # the largest source passed exactly once, ending the mixture
        assert mixture.counts().tolist()[big] == sizes[big]
    assert mixture.packed
    sources, numbers, rows = rows_in_order(mixture, batch_size, workers, world)
    assert np.array_equal(sources, mixture.sources())
    check_prefix_bound(sources, weights)
    for s, size in enumerate(sizes):  # each source: its exact epochs, concatenated; every target once per epoch
        got = numbers[sources == s]
        epochs = -(-got.size // size)
        expected = np.concatenate([source_order(size, seed, s, e) for e in range(epochs)]) if epochs else got
        assert np.array_equal(got, expected[: got.size])
        mine = [rows[i] for i in np.flatnonzero(sources == s).tolist()]
        for e in range(got.size // size):
            held: Counter[int] = Counter()
            for targets, inputs in mine[e * size : (e + 1) * size]:
                held.update(targets)
                assert all(t == i + 1 for t, i in zip(targets, inputs, strict=True))  # the document's own next token
            assert held == all_targets(s, lengths[s])
    at = data.draw(st.lists(st.integers(min_value=0, max_value=len(mixture) - 1), max_size=5))
    assert [mixture[i] for i in at] == [MixItem(int(sources[i]), int(numbers[i])) for i in at]  # random access
    run = sb.Run(mixture, batch_size=batch_size, seed=seed, epochs=2)
    assert run.pack
    every = [(b.epoch, b.index, b.sources.tolist(), b.inputs.tolist(), b.cu_seqlens.tolist()) for b in run]
    step = data.draw(st.integers(min_value=0, max_value=len(every)))
    again = sb.Run(mixture, batch_size=batch_size, seed=seed, epochs=2)
    again.load_state_dict(run.state_dict(run.position_of(step)) if step < len(every) else run.state_dict((2, 0)))
    assert [(b.epoch, b.index, b.sources.tolist(), b.inputs.tolist(), b.cu_seqlens.tolist()) for b in again] == every[step:]


def _mixture(**more: Any) -> Mixture:
    web = packed_source(0, [9, 13, 4, 1, 7], T=4)
    code = packed_source(1, [6, 3], T=4)
    return mix([web, code], [2, 1], seed=13, names=["web", "code"], **more)


def test_packed_mixture_batches_are_each_sources_packed_rows() -> None:
    mixture = _mixture()
    for batch in sb.materialize(sb.chunk(mixture, 3)):
        assert isinstance(batch, MiniBatch)
        assert batch.packed
        assert batch.sources is not None
        for s in range(2):  # the rows of source s are that source's own packed rows
            rows = batch.sources == s
            alone = sb.materialize(sb.chunk(mixture.parts[s][:], len(mixture.parts[s])))[0]
            picked = batch.row_numbers[rows]
            assert np.array_equal(batch.inputs[rows], alone.inputs[picked])
            assert np.array_equal(batch.segment_ids[rows], alone.segment_ids[picked])
            assert np.array_equal(batch.loss_mask[rows], alone.loss_mask[picked])
        assert batch.source_names == [("web", "code")[s] for s in batch.sources.tolist()]
    twin = pickle.loads(pickle.dumps(mixture))
    assert list(sb.materialize(sb.chunk(twin, 3))) == list(sb.materialize(sb.chunk(mixture, 3)))
    first = sb.materialize(sb.chunk(mixture, 3))[1]
    moved = first.in_epoch(4)
    assert isinstance(moved, MiniBatch)
    assert moved.packed
    assert moved.sources is not None
    assert (moved.epoch, moved.sources.tolist(), moved.document_ids) == (4, first.sources.tolist(), first.document_ids)


def test_epoch_over_a_packed_mixture_is_the_chained_stages() -> None:
    mixture = _mixture()
    epoch = sb.Epoch(mixture, batch_size=4, seed=13)
    chained = list(sb.materialize(sb.chunk(mixture, 4)))
    assert epoch.pack
    assert list(epoch) == chained
    assert [epoch.batch(i) for i in range(epoch.batch_count)] == chained
    assert sb.Epoch(mixture, batch_size=4, pack=True) == epoch
    assert "pack=True" in repr(sb.Run(mixture, batch_size=4, seed=None))


def expected_fields(mixture: Mixture, batch: MiniBatch) -> list[list[Any]]:
    """The batch's five arrays from each source's own packed rows (its whole epoch in row order), cu_seqlens from the ids."""
    alone = [sb.materialize(sb.chunk(part[:], len(part)))[0] for part in mixture.parts]
    picked = [alone[s] for s in batch.sources.tolist()]
    fields = [
        [getattr(a, name)[r].tolist() for a, r in zip(picked, batch.row_numbers.tolist(), strict=True)]
        for name in ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")
    ]
    T, flat = batch.context_length, np.asarray(fields[2]).reshape(-1)
    starts = [i for i in range(flat.size) if i % T == 0 or flat[i] != flat[i - 1]]
    return [*fields, [*starts, flat.size], [sum(map(sum, fields[4]))]]


def expected_provenance(mixture: Mixture, batch: MiniBatch) -> tuple[Any, ...]:
    """Each row's segments as its own source's packed batch of that row gives them (row moved to the batch's)."""
    found: list[Any] = []
    for r, (s, number) in enumerate(zip(batch.sources.tolist(), batch.row_numbers.tolist(), strict=True)):
        own = sb.materialize(sb.chunk(mixture.parts[s][number : number + 1], 1))[0]
        found += [dataclasses.replace(p, row=r) for p in own.provenance]
    return tuple(found)


@pytest.mark.kernels
@pytest.mark.parametrize("one_pass", [True, False])
def test_the_one_pass_gather_and_the_gather_by_source_agree(one_pass: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C kernel's one pass over every source, and each source's own gather placed row by row, give those rows."""
    parts = [packed_source(s, lengths, T=5) for s, lengths in enumerate([[13, 2, 27, 6], [9, 1, 4], [31, 3]])]
    mixture = mix(parts, [3, 2, 1], seed=5, length=60)
    gather = mixture.space.packed_gather()
    assert gather.one_pass == HAVE_C
    if one_pass and not HAVE_C:
        pytest.skip("the C gather is not built")
    monkeypatch.setattr(gather, "one_pass", one_pass)
    batches = list(sb.materialize(sb.chunk(mixture, 7)))
    assert len(batches) == 9
    alone = sb.materialize(sb.chunk(parts[0][:], 3))[0]  # one source's own packed batch: the arrays to match
    for batch in batches:
        assert isinstance(batch, MiniBatch)
        assert batch.packed
        assert batch.sources is not None
        got = [getattr(batch, name).tolist() for name in ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")]
        assert [*got, batch.cu_seqlens.tolist(), [batch.target_count]] == expected_fields(mixture, batch)
        for name in ("inputs", "targets", "segment_ids", "position_ids", "loss_mask", "cu_seqlens"):
            assert getattr(batch, name).dtype == getattr(alone, name).dtype, name
        assert batch.segment_ids.dtype == np.int16  # T < 2**15
        check_batch(batch)
        assert batch.provenance == expected_provenance(mixture, batch)


@pytest.mark.kernels
@pytest.mark.parametrize(("T", "dtype"), [(5, np.uint16), (5, np.uint32), (40_000, np.uint32)])
def test_the_numpy_gather_gives_the_same_batches(T: int, dtype: Any) -> None:
    """Every source gathered by numpy (no C kernel): the same batches, dtypes (int16 ids below T = 2**15, else int32)
    and provenance as the one-pass gather."""
    scale = max(1, T // 5)
    lengths = [[13 * scale, 2, 27 * scale, 6], [9 * scale, 1, 4 * scale], [31 * scale, 3]]

    parts = [packed_source(s, n, T=T, dtype=dtype) for s, n in enumerate(lengths)]
    mixture = mix(parts, [3, 2, 1], seed=5, length=40)
    with _kernels.use("packed_gather", "python"):
        assert not mixture.space.packed_gather().one_pass
        slow = list(sb.materialize(sb.chunk(mixture, 7)))
    assert mixture.space.packed_gather().one_pass == HAVE_C
    ids = np.int16 if T < 1 << 15 else np.int32
    for a, b in zip(sb.materialize(sb.chunk(mixture, 7)), slow, strict=True):
        assert a == b
        assert a.provenance == b.provenance
        for name in ("inputs", "targets", "segment_ids", "position_ids", "loss_mask", "cu_seqlens", "sources"):
            assert getattr(a, name).dtype == getattr(b, name).dtype, name
        assert (a.inputs.dtype, a.segment_ids.dtype, a.position_ids.dtype) == (np.dtype(dtype), ids, ids)


def test_mixed_dtypes_and_corpora_are_widened() -> None:
    narrow = packed_source(0, [9, 5], T=3, dtype=np.uint16)
    docs = [sb.Document("c0", "train", range(70_000, 70_011)), sb.Document("c1", "train", range(80_000, 80_004))]
    corpus = sb.pack(
        sb.Corpus([sb.DocumentStore.from_documents(docs[:1]), sb.DocumentStore.from_documents(docs[1:])]), context_length=3
    )
    mixture = mix([narrow, corpus], [1, 1], seed=2)
    seen: Counter[int] = Counter()
    for batch in sb.materialize(sb.chunk(mixture, 4)):
        assert batch.inputs.dtype == np.uint32
        mask = batch.loss_mask & (batch.sources == 1)[:, None]
        seen.update(batch.targets[mask].tolist())
    assert seen == Counter([*range(70_001, 70_011), *range(80_001, 80_004)])
    same = mix([packed_source(0, [9, 5], T=3), corpus], [1, 1], seed=2)  # one dtype: the one-pass gather over a corpus
    assert same.space.packed_gather().one_pass == HAVE_C
    for batch in sb.materialize(sb.chunk(same, 4)):
        assert isinstance(batch, MiniBatch)
        assert batch.packed
        assert batch.sources is not None
        assert [*(getattr(batch, n).tolist() for n in ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")),
                batch.cu_seqlens.tolist(), [batch.target_count]] == expected_fields(same, batch)  # fmt: skip


def test_per_source_token_sums_count_real_targets_only() -> None:
    mixture = _mixture()
    batch = sb.materialize(sb.chunk(mixture, 6))[0]
    assert isinstance(batch, MiniBatch)
    assert batch.packed
    assert batch.sources is not None
    assert batch.pad_count > 0  # padding is there, and never counted
    losses = (batch.loss_mask * 0.5).sum(axis=1)  # 0.5 per real target
    sums = sb.token_mean([source_sums(batch, losses)])
    assert sums.token_count == batch.target_count
    assert sums.sources is not None
    for s, mean in sums.sources.items():
        assert mean.token_count == int(batch.loss_mask[batch.sources == s].sum())
        assert mean.mean_loss == 0.5


def test_packed_mixture_refusals() -> None:
    rows = packed_source(0, [9, 5], T=3)
    windows = sb.windows(rows.store, context_length=3)
    with pytest.raises(ConfigError, match="one kind"):
        mix([rows, windows], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="context_length"):
        mix([rows, packed_source(1, [9], T=2)], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="already shuffled"):
        mix([sb.shuffle(rows, 3), rows], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="pad_id"):
        mix([rows, sb.pack(rows.store, context_length=3, pad_id=7)], [1, 1], seed=1)
    with pytest.raises(ConfigError, match="no rows"):
        mix([rows, packed_source(1, [1, 1], T=3)], [1, 1], seed=1)
    other = sb.windows(packed_source(1, [9, 5], T=3).store, context_length=3)
    with pytest.raises(ConfigError, match="blends windows"):
        sb.Epoch(mix([windows, other], [1, 1], seed=1), batch_size=2, pack=True)


def test_a_window_state_is_refused_by_a_packed_mixture_run() -> None:
    rows = [packed_source(s, [9, 5], T=3) for s in range(2)]
    packed = sb.Run(mix(rows, [1, 2], seed=4), batch_size=2, seed=None, epochs=1)
    plain = sb.Run(mix([sb.windows(r.store, context_length=3) for r in rows], [1, 2], seed=4), batch_size=2, seed=None)
    next(iter(plain))
    with pytest.raises(StateError, match="mode"):
        packed.load_state_dict(plain.state_dict())
    assert packed.position == (0, 0)
    next(iter(packed))
    with pytest.raises(StateError, match="mode"):
        plain.load_state_dict(packed.state_dict())


def test_plan_files_of_a_packed_mixture_are_shared(tmp_path: Path) -> None:
    rows = [sb.pack(packed_source(s, [9, 5, 12], T=3).store, context_length=3, plan_dir=tmp_path) for s in range(2)]
    mapped = mix(rows, [1, 2], seed=4, plan_dir=tmp_path)
    plain = mix([packed_source(s, [9, 5, 12], T=3) for s in range(2)], [1, 2], seed=4)
    assert mapped.space.plan_path is not None
    assert list(sb.materialize(sb.chunk(mapped, 3))) == list(sb.materialize(sb.chunk(plain, 3)))
    assert all(p.plan_path is not None for p in mapped.source_plans())
    assert (
        mapped.fingerprint
        == plain.fingerprint
        != mix([sb.windows(r.store, context_length=3) for r in rows], [1, 2], seed=4).fingerprint
    )


@pytest.mark.skipif(not HAVE_C, reason="the C gather is not built")
def test_the_kernel_refuses_bad_kinds_and_unlike_sources() -> None:
    parts = [packed_source(s, [9, 5], T=3) for s in range(2)]
    gather = mix(parts, [1, 1], seed=1).space.packed_gather()
    g0, g1 = gather.gatherers
    rows = np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="source 2 has no gatherer"):
        g0.gather(rows, np.array([0, 2], np.uint8), (g0, g1))
    with pytest.raises(ValueError, match="1 kinds for 2 rows"):
        g0.gather(rows, np.array([0], np.uint8), (g0, g1))
    with pytest.raises(TypeError, match="kinds must be uint8"):
        g0.gather(rows, np.array([0, 1], np.int64), (g0, g1))
    with pytest.raises(TypeError, match=r"sources\[1\] is not an initialised Gatherer"):
        g0.gather(rows, np.array([0, 1], np.uint8), (g0, "g1"))
    with pytest.raises(TypeError, match="a tuple of 1 to 256"):
        g0.gather(rows, np.array([0, 1], np.uint8), [g0, g1])
    with pytest.raises(TypeError, match="takes 1 argument"):
        g0.gather(rows, np.array([0, 1], np.uint8), (g0, g1), rows)
    with pytest.raises(TypeError, match="next must be int64"):  # two arguments: rows and the next batch's rows
        g0.gather(rows, np.array([0, 1], np.uint8))
    other = mix([packed_source(0, [9, 5], T=2)], [1], seed=1).space.packed_gather().gatherers[0]
    with pytest.raises(ValueError, match=r"sources\[1\] has T=2"):
        g0.gather(rows, np.array([0, 1], np.uint8), (g0, other))
    with pytest.raises(ValueError, match="row 1 of the batch"):  # a row beyond its own source's packing
        g0.gather(np.array([0, len(parts[1])], np.int64), np.array([0, 1], np.uint8), (g0, g1))
    made = g0.gather(np.array([1, 0], np.int64), np.array([1, 0], np.uint8), (g0, g1))  # any uint8 buffer as kinds
    again = g0.gather(np.array([1, 0], np.int64), bytes([1, 0]), (g0, g1))
    assert all(np.array_equal(a, b) for a, b in zip(made, again, strict=True))
