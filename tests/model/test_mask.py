"""Tests for loss masks through the data model, the store on disk and every item kind (`streambatch.model.mask`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.model.mask import document_targets, pack_mask, prefix_counts, target_mask


@st.composite
def masked_corpora(draw: Any) -> list[sb.Document]:
    """Random documents with random masks: all-true, single trained tokens, position 0 set, and plain (no mask)."""
    count = draw(st.integers(1, 6))
    docs = []
    for i in range(count):
        length = draw(st.integers(2, 24))
        tokens = draw(st.lists(st.integers(0, 300), min_size=length, max_size=length))
        kind = draw(st.sampled_from(["random", "all", "single", "none"]))
        if kind == "none":
            docs.append(sb.Document(f"d{i}", "train", tokens))
            continue
        if kind == "all":
            mask = [True] * length
        elif kind == "single":
            mask = [False] * length
            mask[draw(st.integers(1, length - 1))] = True
        else:
            mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
            mask[0] = draw(st.booleans())  # position 0 set or not: never a target either way
            if not any(mask[1:]):
                mask[length - 1] = True
        docs.append(sb.Document(f"d{i}", "train", tokens, mask))
    return docs


def _trained(store: Any, document: int) -> np.ndarray:
    return store.loss_mask(document)


def _check_windows(batch: Any, store: Any, length: int) -> None:
    """loss_mask equals the document's mask at every target; token_count counts it."""
    mask = batch.loss_mask if batch.loss_mask is not None else np.ones(batch.shape, bool)
    for row, (doc, start) in enumerate(zip(batch.document_indices.tolist(), batch.starts.tolist(), strict=True)):
        expected = _trained(store, doc)[start + 1 : start + 1 + length]
        assert expected.tolist() == mask[row].tolist()
    assert batch.token_count == int(mask.sum())


def _check_packed(batch: Any, stores: list[Any], sources: Any = None) -> None:
    """Each segment's targets carry its document's mask; padding never counts."""
    rows, docs, starts, lengths = batch._table()
    expected = np.zeros(batch.shape, bool)
    for row in range(batch.width):
        store = stores[0 if sources is None else int(sources[row])]
        for j, k in enumerate(np.flatnonzero(rows == row).tolist()):  # the row's segments, in order: segment id j
            start, size = int(starts[k]), int(lengths[k])
            expected[row, batch.segment_ids[row] == j] = _trained(store, int(docs[k]))[start + 1 : start + 1 + size]
    assert expected.tolist() == batch.loss_mask.tolist()
    assert batch.token_count == int(expected.sum())


@given(
    docs=masked_corpora(),
    length=st.integers(1, 6),
    size=st.integers(1, 5),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
    workers=st.integers(1, 3),
    world=st.integers(1, 3),
)
def test_windows_carry_the_mask(
    docs: list[sb.Document], length: int, size: int, seed: int | None, workers: int, world: int
) -> None:
    """Window batches, over every worker and rank share: mask at each target, count, and the token mean over shares."""
    store = sb.DocumentStore.from_documents(docs)
    windows = sb.windows(store, context_length=length)
    if seed is not None:
        windows = sb.shuffle(windows, seed=seed)
    chunks = sb.chunk(windows, size)
    loss_sum = count = 0.0
    for worker in range(workers):
        for rank in range(world):
            for batch in sb.materialize(sb.share(chunks, worker=worker, workers=workers, rank=rank, world_size=world)):
                _check_windows(batch, store, length)
                mask = batch.loss_mask if batch.loss_mask is not None else np.ones(batch.shape, bool)
                loss_sum += float(batch.targets[mask].astype(np.float64).sum())
                count += batch.token_count
    direct = [
        float(t)
        for d in range(len(store))
        for s in range(max(0, int(store.lengths[d]) - length))
        for t, m in zip(
            store.document(d).tokens[s + 1 : s + 1 + length].tolist(),
            _trained(store, d)[s + 1 : s + 1 + length].tolist(),
            strict=True,
        )
        if m
    ]
    assert count == len(direct)
    if direct:
        assert math.isclose(loss_sum / count, math.fsum(direct) / len(direct), rel_tol=1e-12)


@given(
    docs=masked_corpora(), length=st.integers(2, 8), size=st.integers(1, 4), seed=st.integers(0, 2**32), world=st.integers(1, 3)
)
def test_packed_rows_carry_the_mask(docs: list[sb.Document], length: int, size: int, seed: int, world: int) -> None:
    """Packed rows: the mask ANDed with real positions; every trained target of every document counted exactly once."""
    store = sb.DocumentStore.from_documents(docs)
    rows = sb.shuffle(sb.pack(store, context_length=length), seed=seed)
    total = 0
    values: list[float] = []
    for rank in range(world):
        for batch in sb.materialize(sb.share(sb.chunk(rows, size), rank=rank, world_size=world)):
            _check_packed(batch, [store])
            total += batch.token_count
            values.extend(batch.targets[batch.loss_mask].astype(float).tolist())
    trained = [float(t) for doc in docs for t, m in zip(doc.tokens.tolist(), doc.trained.tolist(), strict=True) if m]
    assert total == len(trained) == int(document_targets(store.loss_bits, store.starts, store.lengths).sum())
    assert sorted(values) == sorted(trained)


@given(a=masked_corpora(), b=masked_corpora(), length=st.integers(1, 5), size=st.integers(1, 5), seed=st.integers(0, 99))
def test_mixtures_count_per_source(a: list[sb.Document], b: list[sb.Document], length: int, size: int, seed: int) -> None:
    """A mixture's rows read each source's own mask (windows and packed rows)."""
    stores = [sb.DocumentStore.from_documents(a), sb.DocumentStore.from_documents(b)]
    windows = [sb.windows(s, context_length=length) for s in stores]
    if all(len(w) for w in windows):
        for batch in sb.materialize(sb.chunk(sb.mix(windows, [1, 2], seed=seed), size)):
            mask = batch.loss_mask if batch.loss_mask is not None else np.ones(batch.shape, bool)
            for row, (src, doc, start) in enumerate(
                zip(batch.sources.tolist(), batch.document_indices.tolist(), batch.starts.tolist(), strict=True)
            ):
                assert _trained(stores[src], doc)[start + 1 : start + 1 + length].tolist() == mask[row].tolist()
            assert batch.token_count == int(mask.sum())
    packed = [sb.pack(s, context_length=length + 1) for s in stores]
    for batch in sb.materialize(sb.chunk(sb.mix(packed, [1, 1], seed=seed), size)):
        _check_packed(batch, stores, batch.sources)


def test_position_zero_is_never_a_target() -> None:
    """A mask set at a document's first token is cleared, in Document and in from_arrays."""
    assert sb.Document("a", "train", [1, 2], [True, True]).loss_mask.tolist() == [False, True]
    store = sb.DocumentStore.from_arrays([1, 2, 3, 4], [0, 2, 4], loss_mask=[1, 1, 1, 1])
    assert [store.loss_mask(i).tolist() for i in range(2)] == [[False, True], [False, True]]


def test_store_round_trip_and_size(tmp_path: Path) -> None:
    """On disk: at most one bit per token (plus the last byte), same fingerprint, same mask; unmasked stores unchanged."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 1000, 10_001)
    offsets = [0, 17, 4000, 10_001]
    mask = rng.random(tokens.size) < 0.3
    store = sb.DocumentStore.from_arrays(tokens, offsets, loss_mask=mask)
    written = sb.write_store(tmp_path / "m", store)
    plain = sb.write_store(tmp_path / "p", sb.DocumentStore.from_arrays(tokens, offsets))
    extra = sum(f.stat().st_size for f in (tmp_path / "m").iterdir()) - sum(f.stat().st_size for f in (tmp_path / "p").iterdir())
    assert (tmp_path / "m" / "loss_mask.bin").stat().st_size == -(-tokens.size // 8)
    assert extra - -(-tokens.size // 8) < 200  # the header's entry
    assert not (tmp_path / "p" / "loss_mask.bin").exists()
    assert not plain.has_loss_mask
    assert plain.fingerprint == sb.DocumentStore.from_arrays(tokens, offsets).content_fingerprint()
    opened = sb.open_store(tmp_path / "m")
    assert opened.fingerprint == store.content_fingerprint() == written.fingerprint != plain.fingerprint
    for i in range(3):
        assert opened.loss_mask(i).tolist() == store.loss_mask(i).tolist()


def test_a_damaged_mask_is_refused(tmp_path: Path) -> None:
    """A truncated or changed mask file is a StoreError naming it."""
    sb.write_store(tmp_path / "m", sb.DocumentStore.from_arrays(list(range(20)), [0, 20], loss_mask=[1] * 20))
    path = tmp_path / "m" / "loss_mask.bin"
    data = path.read_bytes()
    path.write_bytes(bytes([data[0] ^ 4]) + data[1:])
    with pytest.raises(StoreError, match="fingerprint mismatch"):
        sb.open_store(tmp_path / "m")
    path.write_bytes(data[:-1])
    with pytest.raises(sb.DataError, match=r"loss_mask\.bin"):
        sb.open_store(tmp_path / "m")


def test_bit_helpers_match_numpy() -> None:
    """target_mask and prefix_counts equal plain numpy over random masks, near the end of the bits too."""
    rng = np.random.default_rng(2)
    for size in (3, 9, 64, 1001):
        mask = rng.random(size) < 0.5
        bits = pack_mask(mask)
        for length in (1, 2, 8, 17):
            if size > length:
                positions = rng.integers(0, size - length, 40)
                assert (target_mask(bits, positions, length) == mask[positions[:, None] + 1 + np.arange(length)]).all()
        at = rng.integers(0, size + 1, 30)
        assert prefix_counts(bits, at).tolist() == [int(mask[:p].sum()) for p in at]


def test_corpus_reads_each_shards_mask() -> None:
    """A corpus of a masked and an unmasked store: batches read the right bits, counts add up."""
    a = sb.DocumentStore.from_arrays([0, 1, 2, 3, 4], [0, 5], ids=["a"], loss_mask=[0, 1, 0, 1, 0])
    b = sb.DocumentStore.from_arrays([0, 5, 6, 7], [0, 4], ids=["b"])
    corpus = sb.Corpus([a, b])
    total = sum(batch.token_count for batch in sb.Epoch(corpus, context_length=2, batch_size=2, seed=None))
    assert total == 1 + 1 + 1 + 2 + 2  # a@0: [1,0], a@1: [0,1], a@2: [1,0]; b@0, b@1: all trained
    assert corpus.loss_mask(0).tolist() == [False, True, False, True, False]
