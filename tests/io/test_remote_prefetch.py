"""Tests for `streambatch.io.remote.prefetch`: many ranged GETs in flight (bounded), ranges coalesced across the
batches ahead within the byte budget, a resume fetching nothing before its position (moto's S3 on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.io.remote import client as client_module
from streambatch.io.remote.prefetch import byte_ranges
from streambatch.io.remote.ranges import coalesce, parts
from streambatch.io.remote.tokens import WORKERS
from streambatch.tools.proxy import LoopbackProxy
from tests.remote_server import BUCKET, documents, moto_server, uploaded

CONFIG: dict[str, Any] = {"context_length": 64, "batch_size": 4, "stride": 64}


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def local(server: int, tmp_path_factory: pytest.TempPathFactory) -> sb.DocumentStore:
    store, _ = uploaded(tmp_path_factory.mktemp("prefetch"), "ahead", documents(3000, seed=5))  # ~19 digest blocks
    return store


def _through(proxy: LoopbackProxy, **options: Any) -> sb.DocumentStore:
    return sb.open_store(f"s3://{BUCKET}/ahead", options={"endpoint": proxy.url}, **options)


def _needed(epoch: sb.Epoch, batches: range) -> tuple[int, int]:
    """(bytes, ranges) that *batches* need, each batch on its own."""
    chunks = epoch.chunks()
    found = [r for i in batches for r in byte_ranges(chunks[i].token_spans()).values()]
    return sum(sum(e) - sum(s) for s, e in found), sum(len(s) for s, _ in found)


@pytest.mark.parametrize("seed", [None, 4], ids=["in order", "shuffled"])
def test_requests_in_flight_are_bounded_and_overlap(server: int, local: sb.DocumentStore, seed: int | None) -> None:
    """Through a proxy adding 20 ms to each request: several GETs wait at once, never more than WORKERS;
    in document order the ranges of the batches ahead are coalesced (fewer GETs than each batch alone would
    make); the batches are the local ones."""
    expected = [b.inputs.tobytes() for b in sb.Epoch(local, seed=seed, **CONFIG)]
    with LoopbackProxy(server, delay=0.02) as proxy:
        epoch = sb.Epoch(_through(proxy), seed=seed, **CONFIG)
        opened, peak = proxy.requests, proxy.peak_waiting
        proxy.peak_waiting = 0
        got = [b.inputs.tobytes() for b in epoch]
        gets = proxy.requests - opened
        assert 2 <= proxy.peak_waiting <= WORKERS
    assert got == expected
    assert peak <= WORKERS
    _, ranges = _needed(epoch, range(len(epoch)))
    assert gets <= ranges
    if seed is None:
        assert gets < 0.9 * ranges


def test_bytes_fetched_stay_within_the_budget(server: int, local: sb.DocumentStore) -> None:
    """Whole checked blocks, each fetched once: an epoch fetches at most the blocks its batches touch (here, every
    block of the store, once), in document order or shuffled."""
    for seed in (None, 4):
        with LoopbackProxy(server) as proxy:
            epoch = sb.Epoch(_through(proxy), seed=seed, **CONFIG)
            before = client_module.STATS.bytes
            for _ in epoch:
                pass
            fetched = client_module.STATS.bytes - before
        assert fetched <= local.tokens.nbytes


def test_a_resume_requests_only_ranges_of_its_batches(
    server: int, local: sb.DocumentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume at p: every range requested until batch p is served lies in the digest blocks of batch p or of the
    one after it (started once p is served), never in blocks only the earlier batches touch."""
    from streambatch.io.remote.blocks import BLOCK

    asked: list[tuple[int, int]] = []
    original = client_module.ObjectClient.get_range_async

    async def recording(self: Any, name: str, start: int, end: int, etag: Any, into: memoryview) -> None:
        asked.append((start, end))
        await original(self, name, start, end, etag, into)

    monkeypatch.setattr(client_module.ObjectClient, "get_range_async", recording)
    with LoopbackProxy(server, delay=0.02) as proxy:
        epoch = sb.Epoch(_through(proxy), seed=3, **CONFIG)
        late = len(epoch) - 5
        epoch.batches()[late]
        seen = list(asked)
    chunks = epoch.chunks()
    allowed = [r for i in (late, late + 1) for r in byte_ranges(chunks[i].token_spans()).values()]
    lo = np.concatenate([np.asarray(s) for s, _ in allowed]) // BLOCK * BLOCK
    hi = -(-np.concatenate([np.asarray(e) for _, e in allowed]) // BLOCK) * BLOCK
    assert seen
    for start, end in seen:
        for block in range(start // BLOCK, -(-end // BLOCK)):  # each block requested is one of those batches'
            assert ((lo <= block * BLOCK) & (block * BLOCK < hi)).any(), (start, end)


def test_a_fixed_prefetch_keeps_that_many_batches_ahead(server: int, local: sb.DocumentStore) -> None:
    """prefetch=2: never more than two batches scheduled ahead; the batches are the local ones."""
    expected = [b.inputs.tobytes() for b in sb.Epoch(local, seed=1, **CONFIG)]
    with LoopbackProxy(server) as proxy:
        batches = sb.Epoch(_through(proxy, prefetch=2), seed=1, **CONFIG).batches()
        got, depths = [], []
        for i in range(len(batches)):
            got.append(batches[i].inputs.tobytes())
            depths.append(batches._reader.depth)
    assert got == expected
    assert max(depths) == 2


def test_paths_that_change_step_read_the_local_batches_and_give_the_memory_back(server: int, local: sb.DocumentStore) -> None:
    """Along 1, then every 3rd, every 2nd, a jump back and a step of 5: each batch is the local one, the reader never
    schedules a batch twice (every group's memory comes back), and none is held once the reader is closed."""
    import time

    from streambatch.io.remote.prefetch import remote_files

    expected = sb.Epoch(local, seed=2, **CONFIG).batches()
    with LoopbackProxy(server) as proxy:
        store = _through(proxy)
        batches = sb.Epoch(store, seed=2, **CONFIG).batches()
        count = len(batches)
        order = [*range(6), *range(6, 30, 3), *range(30, 44, 2), *range(3, 20), *range(20, count, 5)]
        for i in order:
            assert batches[i].inputs.tobytes() == expected[i].inputs.tobytes(), i
        reader = batches._reader
        scheduled = list(reader._groups)
        assert scheduled == sorted(set(scheduled))
        reader.close()
        (file,) = remote_files(store)
        deadline = time.monotonic() + 10
        while file.held_bytes() and not file.complete and time.monotonic() < deadline:
            time.sleep(0.01)
        assert file.held_bytes() == 0 or file.complete  # complete: every block here, checked, held until close
        store.close()
        assert file.held_bytes() == 0


def test_an_iteration_starts_the_batches_after_its_first_at_once(server: int, local: sb.DocumentStore) -> None:
    """Iterating names the path (step 1): the first batch starts those after it while its own ranges arrive.
    Indexing does not: one batch ahead until a second request shows the step."""
    expected = [b.inputs.tobytes() for b in sb.Epoch(local, seed=None, **CONFIG)]
    with LoopbackProxy(server, delay=0.02) as proxy:
        walked = sb.Epoch(_through(proxy), seed=None, **CONFIG).batches()
        batches = iter(walked)
        got = [next(batches).inputs.tobytes()]
        assert walked._reader.depth > 2
        got += [b.inputs.tobytes() for b in batches]
        indexed = sb.Epoch(_through(proxy), seed=None, **CONFIG).batches()
        indexed[0]
        assert indexed._reader.depth <= 1
    assert got == expected


spans = st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 5000)), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(spans, st.integers(0, 1 << 17), st.floats(0, 0.2))
def test_coalescing_covers_every_range_within_the_spare(found: list[tuple[int, int]], gap: int, spare: float) -> None:
    starts = np.array([s for s, _ in found], dtype=np.int64)
    ends = starts + np.array([n for _, n in found], dtype=np.int64)
    lo, hi = (np.asarray(x, dtype=np.int64) for x in coalesce(starts, ends, gap, spare))
    assert (lo[1:] > hi[:-1]).all()  # sorted, apart
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        k = int(np.searchsorted(lo, s, side="right")) - 1
        assert k >= 0
        assert hi[k] >= e
    covered = np.zeros(int(ends.max()) + 1, dtype=bool)
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        covered[s:e] = True
    assert int((hi - lo).sum()) <= (1 + spare) * int(covered.sum()) + 1e-6
    assert ((lo[1:] - hi[:-1]) > 0).all()


@settings(max_examples=200, deadline=None)
@given(spans, st.integers(1, 9000))
def test_parts_cut_ranges_into_pieces_of_at_most_size(found: list[tuple[int, int]], size: int) -> None:
    starts = np.array(sorted({s for s, _ in found}), dtype=np.int64)
    ends = starts + 1 + np.arange(starts.size) % 7000
    lo, hi = parts(starts, ends, size)
    assert ((hi - lo) <= size).all()
    assert ((hi - lo) > 0).all()
    assert int((hi - lo).sum()) == int((ends - starts).sum())
    assert set(lo.tolist()) >= set(starts.tolist())
