"""Tests for `TokenSource.flat()` (`streambatch.model.flat`): every store kind's flat view agrees with its documents.

A `DocumentStore`, a `Corpus` of the same documents cut into shards, the store
written to disk and reopened, the shards written and reopened as a corpus, and
a store in object storage (moto on loopback) each give a `Flat`; every
document's tokens, mask bits and counted targets read through it equal the
document's own, and the reads shard by shard agree across kinds.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.io.remote.client import STATS
from streambatch.model.flat import Flat
from streambatch.model.source import TokenSource
from tests.remote_server import BUCKET, moto_server, uploaded


@st.composite
def masked_documents(draw: st.DrawFn) -> list[sb.Document]:
    """1..8 documents of 0..30 tokens (some past uint16), each with or without a loss mask."""
    high = draw(st.sampled_from([60_000, 70_000]))
    docs = []
    for i in range(draw(st.integers(min_value=1, max_value=8))):
        tokens = draw(st.lists(st.integers(min_value=0, max_value=high), max_size=30))
        mask = draw(st.none() | st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens)))
        docs.append(sb.Document(f"d{i}", "train", tokens, loss_mask=mask))
    return docs


def cut(docs: list[sb.Document], cuts: list[int]) -> list[list[sb.Document]]:
    """*docs* cut into non-empty shards at *cuts* (any ints: taken modulo, deduplicated)."""
    at = sorted({c % len(docs) for c in cuts} - {0})
    edges = [0, *at, len(docs)]
    return [docs[lo:hi] for lo, hi in itertools.pairwise(edges)]


def sources(docs: list[sb.Document], cuts: list[int], tmp: Path) -> dict[str, TokenSource]:
    """Every local kind of source holding *docs*, in that order."""
    shards = cut(docs, cuts)
    paths = [tmp / f"shard-{k}" for k in range(len(shards))]
    for path, part in zip(paths, shards, strict=True):
        sb.write_store(path, part)
    return {
        "store": sb.DocumentStore.from_documents(docs),
        "corpus": sb.Corpus([sb.DocumentStore.from_documents(part) for part in shards]),
        "reopened": sb.write_store(tmp / "whole", docs),
        "reopened corpus": sb.open_corpus(paths),
    }


def check_flat(source: TokenSource, docs: list[sb.Document]) -> Flat:
    """*source*'s flat view against *docs*: shape, each document's tokens, shard, mask bits and counted targets."""
    flat = source.flat()
    assert source.flat() is flat  # one value per source
    shards = len(flat.tokens)
    assert len(flat.bits) == len(flat.files) == shards
    assert flat.bases.size == flat.document_bases.size == shards + 1
    assert np.array_equal(np.diff(flat.bases), [t.size for t in flat.tokens])
    assert flat.size == source.flat_size
    assert flat.document_bases[-1] == len(docs) == flat.starts.size
    assert flat.has_loss_mask == source.has_loss_mask == any(d.loss_mask is not None for d in docs)
    assert all(f is None for f in flat.files)  # local tokens
    for i, doc in enumerate(docs):
        k = int(flat.shard_of([i])[0])
        assert flat.document_bases[k] <= i < flat.document_bases[k + 1]
        start, length = int(flat.starts[i]), len(doc)
        local = start - int(flat.bases[k])
        assert np.array_equal(flat.tokens[k][local : local + length], doc.tokens)
        if length:  # a position of the document is in its shard
            assert flat.shard_at([start + length - 1]).tolist() == [k]
        trained = np.ones(length, np.bool_) if doc.loss_mask is None else doc.loss_mask
        if length > 1:  # the targets' bits: what a gather reads
            assert np.array_equal(flat.mask_at(start + np.arange(1, length)), trained[1:])
            window = flat.target_mask([start], length - 1)
            assert window is None if not flat.has_loss_mask else np.array_equal(window[0], trained[1:])
            assert np.array_equal(flat.window_tokens([start], length)[0], doc.tokens)
        counted = flat.counted_between(np.array([min(start + 1, start + length)]), np.array([start + length]))
        assert counted.tolist() == [int(np.count_nonzero(trained[1:]))]
    return flat


@given(docs=masked_documents(), cuts=st.lists(st.integers(min_value=0, max_value=7), max_size=4))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_store_kind_flat_agrees_with_its_documents(docs: list[sb.Document], cuts: list[int]) -> None:
    """A store, a corpus of the same documents, and both written and reopened: each flat view gives every
    document's tokens, shard, mask bits and counted targets; their reads of one document agree across kinds."""
    with tempfile.TemporaryDirectory() as tmp:
        found = {name: check_flat(source, docs) for name, source in sources(docs, cuts, Path(tmp)).items()}
        assert found["corpus"].sharded
        assert found["reopened corpus"].sharded
        assert not found["store"].sharded
        assert all(p is not None for p in found["reopened corpus"].paths)
        assert len(found["store"].tokens) == len(found["reopened"].tokens) == 1
        assert len(found["corpus"].tokens) == len(cut(docs, cuts))
        lengths = np.array([len(d) for d in docs])
        for i in np.flatnonzero(lengths > 1).tolist():  # one window of each document, read through every kind
            rows = [f.window_tokens([int(f.starts[i])], int(lengths[i])) for f in found.values()]
            assert all(np.array_equal(rows[0], r) for r in rows[1:])


def test_a_store_and_its_select_view_share_tokens_not_starts() -> None:
    """A partition view shares the flat tokens (no copy) and has its own documents' starts."""
    store = sb.DocumentStore.from_arrays([1, 2, 3, 4, 5], [0, 2, 5], partition=["train", "test"])
    view = store.select("test")
    assert view.flat().tokens[0] is store.tokens
    assert view.flat().starts.tolist() == [2]
    assert store.flat().starts.tolist() == [0, 2]


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """moto on loopback; the process's request counts are put back afterwards, so a later command's report
    (``object storage: ...``) counts only its own requests."""
    counts = dataclasses.replace(STATS)
    with moto_server() as port:
        yield port
    for name in ("requests", "range_requests", "bytes", "retries", "puts", "cache_hits", "cache_misses", "cache_bytes"):
        setattr(STATS, name, getattr(counts, name))


def test_a_remote_store_flat_names_its_file_and_agrees_with_the_local_one(
    server: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A store in object storage is a `TokenSource` too: its flat view names the remote token file the reader
    fetches from, and holds the local store's starts, bases and mask bits; a corpus of it and a local store names
    the file of its remote shard only."""
    rng = np.random.default_rng(5)
    docs = [sb.Document(f"r{i}", "train", rng.integers(0, 50_000, 20 + i), loss_mask=rng.random(20 + i) < 0.7) for i in range(6)]
    local, remote = uploaded(tmp_path_factory.mktemp("flat"), "flat", docs)
    flat, near = remote.flat(), local.flat()
    assert flat.files[0] is not None
    assert near.files == (None,)
    assert np.array_equal(flat.starts, near.starts)
    assert np.array_equal(flat.bases, near.bases)
    assert flat.bits[0] is not None
    assert np.array_equal(flat.bits[0], near.bits[0])
    for i, doc in enumerate(docs):
        start = int(flat.starts[i])
        assert np.array_equal(flat.mask_at(start + np.arange(1, len(doc))), doc.loss_mask[1:])
        assert np.array_equal(remote.document(i).tokens, doc.tokens)  # read through the remote file
    other = sb.DocumentStore.from_documents([sb.Document("x", "train", [1, 2, 3])])
    both: Any = sb.Corpus([other, remote]).flat()
    assert both.files[0] is None
    assert both.files[1] is flat.files[0]
    assert both.bits[1] is flat.bits[0]
    assert both.tokens[1] is remote.tokens
    assert sb.open_store(f"s3://{BUCKET}/flat").flat().files[0] is not None
