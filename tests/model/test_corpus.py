"""Tests for `streambatch.model.corpus`: several stores read as one source, batch for batch the single store."""

from __future__ import annotations

import itertools
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
import streambatch.items.windows.windows as windowing
from streambatch import ConfigError
from streambatch.cli import main
from streambatch.errors import DuplicateIdError, StoreError
from streambatch.io.store import write_store
from streambatch.items.windows.gather import window_gather
from streambatch.model.corpus import corpus_fingerprint
from tests.strategies import configs, documents, seeds


def _split(docs: list[sb.Document], cuts: list[int]) -> list[list[sb.Document]]:
    bounds = [0, *sorted(min(c, len(docs)) for c in cuts), len(docs)]
    return [docs[a:b] for a, b in itertools.pairwise(bounds)]


def _rows(epoch: sb.Epoch) -> list[tuple[Any, ...]]:
    return [
        (b.index, b.inputs.tolist(), b.targets.tolist(), b.document_ids, b.document_indices.tolist(), b.starts.tolist())
        for b in epoch
    ]


@given(documents(max_docs=12), st.lists(st.integers(0, 12), max_size=4), configs, seeds)
def test_sharded_corpus_is_the_single_store(
    docs: list[sb.Document], cuts: list[int], config: dict[str, int], seed: int | None
) -> None:
    """k = 1..5 shards holding the documents in order give exactly the single store's epoch; rows know their shard."""
    parts = _split(docs, cuts)
    corpus = sb.open_corpus([sb.DocumentStore.from_documents(p) for p in parts])
    single = sb.Epoch(docs, seed=seed, **config)
    sharded = sb.Epoch(corpus, seed=seed, **config)
    assert _rows(single) == _rows(sharded)
    assert single.shuffle_state_after == sharded.shuffle_state_after
    owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    for batch in sharded:
        assert owner[batch.document_indices].tolist() == batch.shards.tolist()
        assert batch.shards.tolist() == [p.shard for p in batch.provenance]
        assert batch.inputs.flags.c_contiguous
        assert batch.targets.flags.c_contiguous


def test_batches_spanning_shards(tmp_path: Path) -> None:
    """A shuffled batch with rows from every shard of an on-disk corpus equals the single store's batch."""
    rng = np.random.default_rng(4)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 60_000, rng.integers(1, 90))) for i in range(40)]
    shards = [write_store(tmp_path / f"s{k}", part) for k, part in enumerate(_split(docs, [9, 10, 25]))]
    corpus = sb.open_corpus(shards)
    single = write_store(tmp_path / "all", docs)
    kwargs: dict[str, Any] = {"context_length": 5, "stride": 3, "batch_size": 32, "seed": 2}
    batches = list(sb.Epoch(corpus, **kwargs))
    assert _rows(sb.Epoch(single, **kwargs)) == _rows(sb.Epoch(corpus, **kwargs))
    assert any(len(set(b.shards.tolist())) == 4 for b in batches)
    assert all(b.inputs.dtype == np.uint16 for b in batches)


def test_mixed_dtype_shards_gather_uint32(tmp_path: Path) -> None:
    """A uint16 shard and a uint32 shard: batches are uint32, with the same token values."""
    docs = [sb.Document("a", "train", np.arange(50) * 3), sb.Document("b", "train", np.arange(40) + 70_000)]
    corpus = sb.open_corpus([write_store(tmp_path / "a", docs[:1]), write_store(tmp_path / "b", docs[1:])])
    assert (np.uint16, np.uint32, np.uint32) == (corpus.shards[0].dtype, corpus.shards[1].dtype, corpus.dtype)
    kwargs: dict[str, Any] = {"context_length": 4, "batch_size": 8, "seed": 1}
    assert _rows(sb.Epoch(docs, **kwargs)) == _rows(sb.Epoch(corpus, **kwargs))
    assert {np.dtype(np.uint32)} == {b.inputs.dtype for b in sb.Epoch(corpus, **kwargs)}


def test_total_tokens_beyond_position_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A corpus of 2**32+ tokens (threshold forced low) keeps 4-byte window numbers, also in plan files; same batches."""
    rng = np.random.default_rng(5)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 1000, rng.integers(4, 30))) for i in range(30)]
    kwargs: dict[str, Any] = {"context_length": 3, "batch_size": 7, "seed": 9}
    expected = _rows(sb.Epoch(docs, **kwargs))
    corpus = sb.open_corpus([sb.DocumentStore.from_documents(p) for p in _split(docs, [10, 20])])
    monkeypatch.setattr(windowing, "POSITION_LIMIT", corpus.flat_size)
    for epoch in (sb.Epoch(corpus, **kwargs), sb.Epoch(corpus, plan_dir=tmp_path, **kwargs)):
        assert not epoch.order.space.plan_holds_positions
        assert (np.dtype(np.uint32), 4 * epoch.window_count) == (epoch.order.plan.dtype, epoch.plan_nbytes)
        assert expected == _rows(epoch)


def test_ids_must_be_unique_across_shards() -> None:
    """A document id in two shards is refused, naming both shards and positions."""
    a = sb.DocumentStore.from_documents([sb.Document("x", "train", [1, 2]), sb.Document("y", "train", [3])])
    b = sb.DocumentStore.from_documents([sb.Document("y", "train", [4, 5])])
    with pytest.raises(DuplicateIdError, match=r"id='y': first at shard 0 document index 1, repeated at shard 1 document"):
        sb.open_corpus([a, b])


def test_fingerprint_is_over_shard_fingerprints_in_order(tmp_path: Path) -> None:
    """The corpus fingerprint hashes the shards' fingerprints in order (content fingerprints in memory)."""
    a = sb.DocumentStore.from_documents([sb.Document("a", "train", [1, 2, 3])])
    b = sb.DocumentStore.from_documents([sb.Document("b", "train", [4, 5])])
    ab, ba = sb.Corpus([a, b]), sb.Corpus([b, a])
    assert (None, None) == (ab.fingerprint, ba.fingerprint)  # in memory: nothing recorded, computed on demand
    assert corpus_fingerprint([a.content_fingerprint(), b.content_fingerprint()]) == ab.content_fingerprint()
    assert ab.content_fingerprint() != ba.content_fingerprint()
    on_disk = sb.Corpus([write_store(tmp_path / "a", a), write_store(tmp_path / "b", b)])
    assert ab.content_fingerprint() == on_disk.fingerprint == on_disk.content_fingerprint()


def test_manifest_round_trip_with_relative_paths(tmp_path: Path) -> None:
    """write_corpus lists shards relative to the manifest: the folder can move; a changed shard is refused."""
    docs = [sb.Document(f"d{i}", "train", np.arange(i + 5) % 17) for i in range(9)]
    for k, part in enumerate(_split(docs, [3, 6])):
        write_store(tmp_path / "c" / f"shard-{k}", part)
    made = sb.write_corpus(tmp_path / "c" / "corpus.json", [tmp_path / "c" / f"shard-{k}" for k in range(3)])
    manifest = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert ["shard-0", "shard-1", "shard-2"] == [s["path"] for s in manifest["shards"]]
    shutil.move(tmp_path / "c", tmp_path / "moved")
    opened = sb.open_corpus(tmp_path / "moved" / "corpus.json")
    assert (made.fingerprint, made.ids) == (opened.fingerprint, opened.ids)
    assert sb.open_source(tmp_path / "moved" / "corpus.json").store.fingerprint == made.fingerprint
    write_store(tmp_path / "moved" / "shard-1", [sb.Document("other", "train", [1, 2, 3])])
    with pytest.raises(StoreError, match=r"shard 1 .* has fingerprint .* the shard changed"):
        sb.open_corpus(tmp_path / "moved" / "corpus.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "unreadable corpus manifest"),
        ('{"format": "other"}', "this is not a streambatch corpus manifest"),
        ('{"format": "streambatch.corpus", "version": 2, "shards": ["a"]}', "version=2 is not supported"),
        ('{"format": "streambatch.corpus", "version": 1, "shards": []}', "shards must be a non-empty list"),
        ('{"format": "streambatch.corpus", "version": 1, "shards": [3]}', "shard 0=3 is not a store path"),
        ('{"format": "streambatch.corpus", "version": 1, "shards": ["missing"]}', "not a streambatch store"),
    ],
    ids=["json", "format", "version", "empty", "entry", "missing-shard"],
)
def test_bad_manifests(tmp_path: Path, content: str, message: str) -> None:
    """Every broken manifest is a StoreError naming the file and the problem."""
    (tmp_path / "corpus.json").write_text(content)
    with pytest.raises(StoreError, match=message):
        sb.open_corpus(tmp_path / "corpus.json")


def test_invalid_corpus_arguments() -> None:
    """No shards, or something that is not a store, is a ConfigError."""
    with pytest.raises(ConfigError, match=r"shards=\[\] is empty"):
        sb.Corpus([])
    with pytest.raises(ConfigError, match="shard 1 is a list, not a DocumentStore"):
        sb.Corpus([sb.DocumentStore.from_arrays([1, 2], [0, 2]), []])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="is one store"):
        sb.open_corpus(sb.DocumentStore.from_arrays([1, 2], [0, 2]))  # type: ignore[arg-type]


def test_pickled_corpus_epoch_reopens_the_shards(tmp_path: Path) -> None:
    """A corpus of memory-mapped shards pickles as file names; the unpickled epoch gives the same batches."""
    docs = [sb.Document(f"d{i}", "train", np.arange(4000, dtype=np.uint32) % 300) for i in range(10)]
    corpus = sb.open_corpus([write_store(tmp_path / f"s{k}", p) for k, p in enumerate(_split(docs, [4, 7]))])
    epoch = sb.Epoch(corpus, context_length=8, stride=8, batch_size=16, seed=3, plan_dir=tmp_path / "plans")
    payload = pickle.dumps(epoch)
    assert len(payload) < sum(s.tokens.nbytes for s in corpus.shards) / 10
    assert _rows(epoch) == _rows(pickle.loads(payload))


def test_select_keeps_the_virtual_token_space() -> None:
    """corpus.select(p) keeps one partition's documents, with positions in the same token space."""
    a = sb.DocumentStore.from_arrays(np.arange(10), [0, 5, 10], ids=["a0", "a1"], partition=["train", "test"])
    b = sb.DocumentStore.from_arrays(np.arange(8), [0, 4, 8], ids=["b0", "b1"], partition=["test", "train"])
    corpus = sb.Corpus([a, b]).select("train")
    assert (("a0", "b1"), [0, 14], 18) == (corpus.ids, corpus.starts.tolist(), corpus.flat_size)
    batch = next(iter(sb.Epoch(corpus, context_length=2, batch_size=8, seed=None)))
    assert [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6]] == batch.inputs.tolist()
    assert [0, 0, 0, 1, 1] == batch.shards.tolist()


def test_cli_reads_a_manifest_wherever_a_store_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """epoch, inspect and plan accept corpus.json; epoch rows name their shard and match the single store's rows."""
    docs = [sb.Document(f"d{i}", "train", np.arange(i + 6) % 23) for i in range(8)]
    write_store(tmp_path / "all", docs)
    for k, part in enumerate(_split(docs, [3, 5])):
        write_store(tmp_path / f"s{k}", part)
    sb.write_corpus(tmp_path / "corpus.json", [tmp_path / f"s{k}" for k in range(3)])
    common = ["-T", "3", "-B", "5", "--seed", "4"]
    assert 0 == main(["epoch", str(tmp_path / "all"), *common])
    single = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert 0 == main(["epoch", str(tmp_path / "corpus.json"), *common, "--plan-dir", str(tmp_path / "plans")])
    sharded = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    shards = {row.pop("shard") for batch in sharded for row in batch["rows"]}
    assert ({0, 1, 2}, single) == (shards, sharded)
    assert 1 == len(list((tmp_path / "plans").glob("*.plan")))
    assert 0 == main(["inspect", str(tmp_path / "corpus.json"), "-T", "3", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert (8, 3, ["s0", "s1", "s2"]) == (
        summary["documents"],
        len(summary["shards"]),
        [Path(s["path"]).name for s in summary["shards"]],
    )
    assert 0 == main(["plan", str(tmp_path / "corpus.json"), *common, "-o", str(tmp_path / "plans")])
    assert not json.loads(capsys.readouterr().out)["created"]


def test_per_shard_gather_equals_the_spanning_view(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the spanning record view (mixed dtypes, unaligned shards) each shard's rows are copied: same batches."""
    import streambatch.items.windows.gather as materializing

    rng = np.random.default_rng(8)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 60_000, rng.integers(1, 60))) for i in range(30)]
    shards = [write_store(tmp_path / f"s{k}", part) for k, part in enumerate(_split(docs, [5, 6, 20]))]
    kwargs: dict[str, Any] = {"context_length": 4, "stride": 2, "batch_size": 16, "seed": 6}
    spanning = sb.Epoch(sb.open_corpus(shards), **kwargs)
    assert window_gather(spanning.batch(0).space)._span is not None  # type: ignore[union-attr]
    monkeypatch.setattr(materializing, "spanning_records", lambda *args: None)
    per_shard = sb.Epoch(sb.open_corpus(shards), **kwargs)
    assert window_gather(per_shard.batch(0).space)._span is None  # type: ignore[union-attr]
    assert _rows(sb.Epoch(docs, **kwargs)) == _rows(spanning) == _rows(per_shard)


def test_gather_refuses_positions_outside_every_shard() -> None:
    """A position between shards or past a shard's last window start (a tampered plan) is a DataError, never a read."""
    from streambatch.items.windows.gather import ShardedGather

    a = sb.DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"])
    b = sb.DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
    gather = ShardedGather(sb.Corpus([a, b]).flat(), context_length=2)
    assert gather(np.array([6, 2], dtype=np.intp))[0].tolist() == [[20, 21], [11, 12]]
    for bad in (3, 7, 9, -1, 10**9):
        with pytest.raises(sb.DataError, match="is not a window start inside a shard"):
            gather(np.array([0, bad], dtype=np.intp))
