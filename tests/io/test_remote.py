"""Tests for `streambatch.io.remote`: stores in object storage (moto's S3 on loopback) read like local ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch.errors import DataError, StoreError
from streambatch.io.remote.client import STATS
from streambatch.io.remote.ranges import coalesce
from streambatch.items.mix.mixture import mix
from tests.remote_server import BUCKET, SECRET, current_version, documents, environment, moto_server, uploaded


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def stores(server: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("stores")
    web = uploaded(tmp, "web", documents(24, seed=1))
    code = uploaded(tmp, "code", documents(10, seed=2, high=70_000, prefix="c"))  # uint32
    return {"web": web, "code": code, "tmp": tmp}


def same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.index == y.index
        assert x.inputs.dtype == y.inputs.dtype
        assert x.inputs.tobytes() == y.inputs.tobytes()
        assert x.targets.tobytes() == y.targets.tobytes()
        for name in ("loss_mask", "segment_ids", "position_ids", "cu_seqlens"):
            if getattr(x, name, None) is not None:
                assert np.array_equal(getattr(x, name), getattr(y, name)), name


def same_upload(local: sb.DocumentStore, remote: sb.DocumentStore, address: str) -> None:
    """What an upload gives back, on any object store: header, offsets and ids whole; *address* opens the same store."""
    assert remote.ids == local.ids
    assert remote.fingerprint == local.fingerprint
    assert np.array_equal(remote.lengths, local.lengths)
    assert sb.open_store(address).fingerprint == local.fingerprint


EPOCHS = [  # the epochs a remote store must give byte for byte as its local copy does (S3 and GCS alike)
    pytest.param({"seed": 3, "stride": 16}, id="shuffled-windows"),
    pytest.param({"seed": None, "stride": 16}, id="sequential-windows"),
    pytest.param({"seed": None, "stride": 8}, id="overlapping-windows"),
    pytest.param({"seed": 5, "pack": True}, id="shuffled-packed-rows"),
]


def same_epochs(local: Any, remote: Any, **options: Any) -> None:
    """``sb.Epoch(remote, **options)`` (T = 16, B = 8 unless given) is the epoch over *local*, batch for batch."""
    options = {"context_length": 16, "batch_size": 8, **options}
    same(list(sb.Epoch(local, **options)), list(sb.Epoch(remote, **options)))


def test_a_remote_store_reads_what_was_uploaded(stores: dict[str, Any]) -> None:
    """Header, offsets and ids come back whole; tokens read through the remote array equal the local ones."""
    local, remote = stores["web"]
    same_upload(local, remote, f"s3://{BUCKET}/web")


@pytest.mark.parametrize("options", EPOCHS)
@pytest.mark.parametrize("name", ["web", "code"])
def test_remote_epochs_equal_local_epochs(stores: dict[str, Any], options: dict[str, Any], name: str) -> None:
    """Windows and packed rows, shuffled or not, uint16 or uint32: byte-identical batches."""
    local, remote = stores[name]
    same_epochs(local, remote, **options)


@pytest.mark.parametrize("packed", [False, True], ids=["windows", "packed"])
def test_remote_mixtures_equal_local_mixtures(stores: dict[str, Any], packed: bool) -> None:
    """A mixture of two remote stores (one uint16, one uint32) gives the local mixture's batches."""

    def blend(which: int) -> Any:
        if packed:
            parts = [sb.pack(stores[n][which], context_length=16) for n in ("web", "code")]
        else:
            parts = [sb.windows(stores[n][which], context_length=16, stride=16) for n in ("web", "code")]
        return mix(parts, [3, 1], seed=11, names=["web", "code"])

    same(list(sb.Epoch(blend(0), batch_size=8)), list(sb.Epoch(blend(1), batch_size=8)))


def test_two_ranks_read_only_their_rows(stores: dict[str, Any]) -> None:
    """Each rank's share of every batch equals the local share."""
    local, remote = stores["web"]
    for rank in range(2):
        a = sb.Epoch(local, context_length=16, batch_size=8, stride=16, seed=4).batches(rank=rank, world_size=2)
        b = sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=4).batches(rank=rank, world_size=2)
        same(list(a), list(b))


def test_a_corpus_of_remote_shards(stores: dict[str, Any]) -> None:
    """Remote shards read as one corpus, and a remote manifest names them."""
    from streambatch.io.remote.upload import write_remote_corpus

    (lw, _), (lc, _) = stores["web"], stores["code"]
    corpus = write_remote_corpus(f"s3://{BUCKET}/corpus.json", [f"s3://{BUCKET}/web", f"s3://{BUCKET}/code"])
    opened = sb.open_corpus(f"s3://{BUCKET}/corpus.json")
    assert opened.fingerprint == corpus.fingerprint == sb.open_corpus([lw, lc]).fingerprint
    a = list(sb.Epoch(sb.open_corpus([lw, lc]), context_length=16, batch_size=8, stride=16, seed=2))
    same(a, list(sb.Epoch(opened, context_length=16, batch_size=8, stride=16, seed=2)))


def test_resume_fetches_nothing_before_its_position(stores: dict[str, Any]) -> None:
    """Batches from position p on: only the digest blocks their windows touch are requested (the first p batches'
    are not)."""
    from streambatch.io.remote.blocks import BLOCK

    _, remote = stores["web"]
    epoch = sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=9)
    late = len(epoch) - 2
    before = STATS.bytes
    first = epoch.batches()[late]
    fetched = STATS.bytes - before
    size = remote.dtype.itemsize
    flat = remote.starts[first.document_indices] + first.starts  # each window's first token
    touched = {b for p in flat.tolist() for b in range(p * size // BLOCK, ((p + 17) * size - 1) // BLOCK + 1)}
    assert fetched <= min(len(touched) * BLOCK, remote.tokens.nbytes)  # blocks kept from before: not fetched again


def test_prefetch_holds_only_batches_in_flight(stores: dict[str, Any]) -> None:
    """Memory of consumed batches is given back: after an epoch nothing is held, unless the whole store is here
    (checked, within KEEP): then it is held for good and nothing is fetched again."""
    from streambatch.io.remote.tokens import remote_file

    _, remote = stores["web"]
    for _ in sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=1):
        pass
    file = remote_file(remote.tokens)
    assert file is not None
    time.sleep(0.2)
    assert file.held_bytes() == 0 or (file.complete and file.held_bytes() >= file.nbytes)


def test_coalesce_keeps_gap_bytes_within_the_spare() -> None:
    starts = np.array([0, 100, 200, 10_000])
    ends = starts + 90
    lo, hi = coalesce(starts, ends, gap=4096, spare=0.1)
    assert sum(b - a for a, b in zip(lo, hi, strict=True)) <= 1.1 * 360
    assert coalesce(starts, ends, gap=4096, spare=1.0) == ([0, 10_000], [290, 10_090])


def test_missing_object_bucket_and_credentials_are_one_line(server: int) -> None:
    with pytest.raises(StoreError, match="no such object") as missing:
        sb.open_store(f"s3://{BUCKET}/nothing-here")
    assert "\n" not in str(missing.value)
    with pytest.raises(StoreError, match="no such bucket"):
        sb.open_store("s3://no-such-bucket/store")
    with environment(AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None), pytest.raises(StoreError, match="no credentials"):
        sb.open_store(f"s3://{BUCKET}/web")


def test_secrets_are_never_shown(stores: dict[str, Any]) -> None:
    """Neither messages nor reprs carry the secret key (from the environment or from options)."""
    from streambatch.io.remote.client import ObjectClient
    from streambatch.io.remote.location import Location

    _, remote = stores["web"]
    shown = [repr(remote), repr(remote.tokens.remote), repr(ObjectClient(Location.parse(f"s3://{BUCKET}/web")))]
    with pytest.raises(StoreError) as refused:
        sb.open_store("s3://no-such-bucket/x", options={"secret_access_key": SECRET + "2"})
    shown.append(str(refused.value))
    where = Location.parse("s3://b/p", {"secret_access_key": SECRET})
    shown += [repr(where), str(where)]
    assert not any(SECRET in text for text in shown)


def test_a_replaced_object_is_a_data_error_naming_it(stores: dict[str, Any]) -> None:
    """Tokens replaced after the open (ETag changed): a DataError naming tokens.bin, never other tokens."""
    from streambatch.io.remote.client import ObjectClient
    from streambatch.io.remote.location import Location

    tmp: Path = stores["tmp"]
    _, remote = uploaded(tmp, "changing", documents(6, seed=7))
    size = remote.tokens.nbytes
    version = current_version(f"s3://{BUCKET}/changing")  # the objects the pointer names
    ObjectClient(Location.parse(version)).put("tokens.bin", bytes(size))
    with pytest.raises(DataError, match=r"changing/v/[0-9a-f-]+/tokens\.bin.*changed"):
        list(sb.Epoch(remote, context_length=4, batch_size=4, seed=1))
    with pytest.raises(DataError, match=r"changing/v/[0-9a-f-]+/tokens\.bin: ETag"):
        sb.open_store(f"s3://{BUCKET}/changing")
    ObjectClient(Location.parse(version)).put("tokens.bin", bytes(size + 2))
    with pytest.raises(DataError, match=r"changing/v/[0-9a-f-]+/tokens\.bin: size"):
        sb.open_store(f"s3://{BUCKET}/changing")


def test_https_is_read_only(tmp_path: Path) -> None:
    from streambatch.io.remote.upload import upload_store

    with pytest.raises(StoreError, match="read-only"):
        upload_store(tmp_path, "https://example.invalid/store")


def test_the_cache_never_exceeds_its_limit(stores: dict[str, Any], tmp_path: Path) -> None:
    """Sampled while an epoch runs (twice: the second reads blocks back), the cache folder stays within the limit."""
    local, _ = stores["web"]
    limit = 3 << 20
    big = uploaded(tmp_path, "big", documents(40, seed=5, high=60_000) * 1)  # ~ 16 KB: blocks of the tail only
    del big
    remote = sb.open_store(f"s3://{BUCKET}/web", cache_dir=tmp_path / "cache", cache_bytes=limit)
    sizes: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            sizes.append(
                sum(
                    p.stat().st_size for p in (tmp_path / "cache").iterdir() if p.name.endswith(".block") or ".partial-" in p.name
                )
            )
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for _ in range(2):
            same_epochs(local, remote, batch_size=64, seed=None)
    finally:
        stop.set()
        sampler.join()
    assert sizes
    assert max(sizes) <= limit


def test_a_cache_folder_must_be_a_cache(stores: dict[str, Any], tmp_path: Path) -> None:
    """A folder holding anything else is refused: a cache never deletes data it did not put there."""
    (tmp_path / "shard.bin").write_bytes(b"data")
    with pytest.raises(sb.StreamBatchError, match="not a streambatch cache"):
        sb.open_store(f"s3://{BUCKET}/web", cache_dir=tmp_path, cache_bytes=1 << 20)


def test_prepare_uploads_a_store_with_its_header_last(server: int, tmp_path: Path) -> None:
    """`prepare -o s3://...`: the data parts go up before the header, the pointer switches to them last, and the
    store reads back whole."""
    from streambatch.cli import main

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(f'{{"id": "x{i}", "tokens": [{", ".join(str(j + i) for j in range(30))}]}}\n' for i in range(5)))
    from streambatch.io.remote import client as client_module

    order: list[str] = []
    put = client_module.ObjectClient.put

    def recording(self: Any, name: str, data: Any) -> Any:
        order.append(name)
        return put(self, name, data)

    client_module.ObjectClient.put = recording  # type: ignore[method-assign]
    try:
        assert main(["prepare", str(source), "-o", f"s3://{BUCKET}/prepared", "--quiet"]) == 0
    finally:
        client_module.ObjectClient.put = put  # type: ignore[method-assign]
    assert order[-2:] == ["header.json", "current.json"]
    assert set(order[:-2]) == {"tokens.bin", "offsets.bin", "digests.bin"}
    local = sb.open_store(
        sb.write_store(tmp_path / "local", sb.open_source(str(source)).store).fingerprint and tmp_path / "local"
    )
    remote = sb.open_source(f"s3://{BUCKET}/prepared").store
    assert remote.fingerprint == local.fingerprint
    same_epochs(local, remote, context_length=4, batch_size=3, seed=1)


def test_a_masked_store_keeps_its_mask_in_object_storage(stores: dict[str, Any]) -> None:
    """The loss mask goes up with the store (before the header) and comes back: the same counted targets and
    masks, windows and packed rows; a mask object of the wrong size is a DataError naming it."""
    rng = np.random.default_rng(4)
    docs = [
        sb.Document(d.id, d.partition, d.tokens, loss_mask=np.r_[False, rng.random(len(d.tokens) - 1) < 0.5])
        for d in documents(16, seed=9)
    ]
    local, remote = uploaded(stores["tmp"], "masked", docs)
    assert remote.has_loss_mask
    assert np.array_equal(np.asarray(remote.loss_bits), np.asarray(local.loss_bits))
    for options in ({"seed": 3, "stride": 16}, {"seed": 5, "pack": True}):
        here = list(sb.Epoch(local, context_length=16, batch_size=8, **options))
        there = list(sb.Epoch(remote, context_length=16, batch_size=8, **options))
        same(here, there)
        assert [b.token_count for b in here] == [b.token_count for b in there]
        assert all(np.array_equal(a.loss_mask, b.loss_mask) for a, b in zip(here, there, strict=True))
    from streambatch.io.remote.client import ObjectClient
    from streambatch.io.remote.location import Location

    ObjectClient(Location.parse(current_version(f"s3://{BUCKET}/masked"))).put("loss_mask.bin", b"\x00")
    with pytest.raises(DataError, match=r"loss_mask\.bin"):
        sb.open_store(f"s3://{BUCKET}/masked")


def test_indexing_remote_tokens_fetches_what_it_reads(stores: dict[str, Any]) -> None:
    """Reading a remote store outside a batch (documents, slices, single tokens, index arrays, strided views) fetches
    those bytes then and there: the local store's tokens, never the zeros of a range no batch fetched."""
    local, remote = stores["code"]
    L, R = local.tokens, remote.tokens
    n = len(L)
    keys: list[Any] = [5, -1, slice(10, 50), slice(None, None, 7), slice(50, 10, -3), slice(n - 5, None), slice(0, 0)]
    keys += [np.array([3, 900, 3]), np.asarray(L) % 3 == 0]
    for key in keys:
        assert np.array_equal(np.asarray(L[key]), np.asarray(R[key])), key
    assert np.array_equal(L[::2][5:40], np.asarray(R[::2][5:40]))
    assert np.array_equal(L[100:300][7:20], np.asarray(R[100:300][7:20]))
    assert all(np.array_equal(np.asarray(x.tokens), np.asarray(y.tokens)) for x, y in zip(local, remote, strict=True))
    with pytest.raises(IndexError):
        R[n]
