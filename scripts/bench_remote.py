"""Measure reading a store from object storage through a loopback proxy that adds 20 ms to every request's first byte.

    python scripts/bench_remote.py [--tokens 4000000] [--context-length 2048] [--batch-size 8] [--rounds 3]
    python scripts/bench_remote.py --pace 0.05 [--steps 200]    # a consumer training at a stated pace

``--pace S``: instead of the table below, a consumer that spends S seconds per step (50 ms for B=8 x T=2048 per rank:
about a 1B-parameter model on one H100) over shuffled windows, packed rows and a mixture of two stores, with no
disk cache: the share of its time spent waiting for data from the second step on (goal <= 1%), and the GETs and
bytes fetched per 10^6 trained tokens (whole checked 64 KiB blocks).

A small S3-compatible range server (GET/HEAD, Range, ETag, If-Match; path-style, signatures ignored) serves the
store on 127.0.0.1, with the proxy (`streambatch.tools.proxy`) in front of it, both in a process of their own (so
the reader's process does not share its interpreter with them); moto is far slower per request. For each order
(windows in document order, shuffled windows, packed rows in order) it measures, in ``--rounds`` interleaved
rounds: a consumer that spends 1 ms per batch, tokens/s after the first batch, remote (no cache, a 1%-of-store
cache) vs local; raw emission (no consumer delay) vs one bulk GET of the same bytes through the same proxy; GETs vs
the ranges each batch alone would fetch; bytes fetched vs needed; time to the first batch (from open_store); bytes
fetched before the first batch of a resume at 90%; the share of the 1 ms consumer's time (no cache) spent waiting
for its next batch, remote vs local (what prefetch failed to hide). It prints the medians side by side with each
goal, and the server's ceiling: ranged GETs/s of 4 KB with 64 in flight (a shuffled epoch of windows is one GET per
window: that ceiling bounds it on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
from streambatch.io.remote.client import STATS, ObjectClient
from streambatch.io.remote.location import Location
from streambatch.io.remote.prefetch import byte_ranges
from streambatch.io.remote.tokens import PART, WORKERS
from streambatch.tools.proxy import LoopbackProxy


async def _answer(root: Path, etags: dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive connection of the range server: GET/HEAD with Range and If-Match, answered from the files."""
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            line, *fields = head.decode("latin-1").split("\r\n")
            method, target = line.split(" ")[:2]
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
            path = root / target.lstrip("/").split("?")[0]
            if not path.is_file():
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            key = str(path)
            if key not in etags:
                etags[key] = '"' + hashlib.md5(path.read_bytes()).hexdigest() + '"'
            etag, size = etags[key], path.stat().st_size
            if headers.get("if-match", etag) != etag:
                writer.write(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n")
                continue
            lo, hi, ranged = 0, size, headers.get("range")
            if ranged:
                a, b = ranged.split("=")[1].split("-")
                lo, hi = int(a), min(size, int(b) + 1)
            status = "206 Partial Content" if ranged else "200 OK"
            extra = f"Content-Range: bytes {lo}-{hi - 1}/{size}\r\n" if ranged else ""
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Length: {hi - lo}\r\nETag: {etag}\r\n"
                f"Last-Modified: Tue, 01 Dec 2026 00:00:00 GMT\r\n{extra}\r\n".encode()
            )
            if method == "GET":
                with open(path, "rb") as handle:
                    writer.write(os.pread(handle.fileno(), hi - lo, lo))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_fast(root: str, ports: Any) -> None:
    """The range server on asyncio (a process of its own; far less CPU per request than http.server): puts its port."""

    async def run() -> None:
        etags: dict[str, str] = {}
        server = await asyncio.start_server(lambda r, w: _answer(Path(root), etags, r, w), "127.0.0.1", 0, backlog=1024)
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(run())


def proxy_to(port: int, delay: float, ports: Any) -> None:
    """The delaying proxy in front of 127.0.0.1:*port* (a process of its own): puts its port."""
    with LoopbackProxy(port, delay=delay) as proxy:
        ports.put(proxy.port)
        threading.Event().wait()


def consume(batches: Any, pause: float) -> tuple[float, float, int, float]:
    """(seconds to the first batch, tokens/s after it, tokens, the share of the time after it spent waiting for
    the next batch: in the loader, not in the consumer's own 1 ms)."""
    start = asked = time.perf_counter()
    first = None
    tokens = 0
    waiting = 0.0
    for batch in batches:
        now = time.perf_counter()
        if first is None:
            first = now
        else:
            waiting += now - asked
            tokens += batch.inputs.size
        if pause:
            time.sleep(pause)
        asked = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return first - start, tokens / max(end - first, 1e-9), tokens, waiting / max(end - first, 1e-9)


def needed(epoch: sb.Epoch) -> tuple[int, int]:
    """(bytes the batches need, ranges each batch alone would fetch): from the batches' own spans."""
    total = ranges = 0
    chunks = epoch.chunks()
    for i in range(len(chunks)):
        for file, (starts, ends) in byte_ranges(chunks[i].token_spans()).items():
            del file
            total += sum(e - s for s, e in zip(starts, ends, strict=True))
            ranges += sum(-(-(e - s) // PART) for s, e in zip(starts, ends, strict=True))
    return total, ranges


def ceiling(client: ObjectClient, size: int, count: int = 1000, in_flight: int = 64) -> float:
    """Ranged GETs/s of 4 KB at random offsets, *in_flight* at once: what the server sustains."""
    offsets = np.random.default_rng(3).integers(0, max(size - 4096, 1), count).tolist()
    with ThreadPoolExecutor(in_flight) as threads:
        list(threads.map(lambda lo: client.get_range("tokens.bin", lo, lo + 4096, None), offsets[:100]))
        t = time.perf_counter()
        list(threads.map(lambda lo: client.get_range("tokens.bin", lo, lo + 4096, None), offsets))
    return count / (time.perf_counter() - t)


def one_round(name: str, config: dict[str, Any], local: sb.DocumentStore, options: dict[str, Any], tmp: Path) -> dict[str, float]:
    """Every measurement of one order, once."""
    url, size, out = "s3://bench/store", local.tokens.nbytes, {}
    seed, config = config["seed"], {k: v for k, v in config.items() if k != "seed"}
    _, local_rate, _, out["local waiting"] = consume(sb.Epoch(local, seed=seed, **config), 0.001)
    for cache in (None, 0.01):
        extra = {"cache_dir": tmp / f"cache-{name}-{time.monotonic_ns()}", "cache_bytes": int(cache * size)} if cache else {}
        t0 = time.perf_counter()
        remote = sb.open_store(url, options=options, **extra)
        opened = time.perf_counter() - t0
        first, rate, _, waiting = consume(sb.Epoch(remote, seed=seed, **config), 0.001)
        out["cache" if cache else "no cache"] = rate / local_rate
        if not cache:
            out["waiting"] = waiting
        out["first batch s"] = max(out.get("first batch s", 0.0), opened + first)
    epoch = sb.Epoch(sb.open_store(url, options=options), seed=seed, **config)
    need, ranges = needed(epoch)
    gets, got, peak = STATS.range_requests, STATS.bytes, STATS.peak_in_flight
    STATS.peak_in_flight = 0
    t = time.perf_counter()
    for _ in epoch:
        pass
    seconds = time.perf_counter() - t
    gets, got = STATS.range_requests - gets, STATS.bytes - got
    out["in flight"] = STATS.peak_in_flight
    STATS.peak_in_flight = max(peak, STATS.peak_in_flight)
    client = ObjectClient(Location.parse(url, options))
    t = time.perf_counter()
    client.get_range("tokens.bin", 0, min(need, size), None)
    bulk = min(need, size) / (time.perf_counter() - t)
    out["raw"] = need / seconds / bulk
    out["raw MB/s"], out["bulk MB/s"], out["GET/s"] = need / seconds / 1e6, bulk / 1e6, gets / seconds
    out["GETs"], out["ranges"], out["bytes"] = gets / max(ranges, 1), ranges, got / max(need, 1)
    late = int(0.9 * len(epoch))
    before = STATS.bytes
    resumed = sb.Epoch(sb.open_store(url, options=options), seed=seed, **config)
    resumed.batches()[late]
    out["resume %"] = (STATS.bytes - before) / size * 100
    return out


def stage(folder: Path, target: Path) -> None:
    """Write the local store *folder* as `upload_store` would upload it to *target*: one version and its pointer."""
    import json

    from streambatch.io.remote.upload import pointer_to, version_objects

    header = json.loads((folder / "header.json").read_bytes())
    objects, written = version_objects(folder, header, sb.open_store(folder, verify=False).token_count)
    version = target / "v" / "bench"
    version.mkdir(parents=True)
    for name, body in objects:
        if isinstance(body, Path):
            shutil.copyfile(body, version / name)
        else:
            (version / name).write_bytes(body)
    (version / "header.json").write_bytes(written)
    (target / "current.json").write_bytes(pointer_to("v/bench", written))


def paced(name: str, epoch: sb.Epoch, pace: float, steps: int) -> dict[str, float]:
    """A consumer spending *pace* s per step over *steps* steps: its waiting share from the second step on, and GETs
    and bytes per 10^6 trained tokens."""
    gets, got = STATS.range_requests, STATS.bytes
    waited = tokens = 0
    started = asked = None
    for i, batch in enumerate(epoch):
        now = time.perf_counter()
        if i == 1:
            started = now
        elif i > 1:
            waited += now - asked
        if i >= 1:
            tokens += int(batch.token_count)
        time.sleep(pace)  # the training step
        asked = time.perf_counter()
        if i + 1 >= steps:
            break
    end = time.perf_counter()
    assert started is not None
    return {
        "waiting %": 100 * waited / (end - started),
        "GETs/1e6": (STATS.range_requests - gets) / tokens * 1e6,
        "MB/1e6": (STATS.bytes - got) / tokens,
        "steps": float(i + 1),
    }


def pace_table(args: argparse.Namespace, options: dict[str, Any]) -> None:
    """``--pace``: the consumer at a stated pace over shuffled windows, packed rows and a mixture (no disk cache)."""
    T, B = args.context_length, args.batch_size

    def store(name: str) -> sb.DocumentStore:
        return sb.open_store(f"s3://bench/{name}", options=options)

    kinds = {
        "windows, shuffled": lambda: sb.Epoch(store("store"), context_length=T, batch_size=B, stride=T, seed=7),
        "packed rows, shuffled": lambda: sb.Epoch(store("store"), context_length=T, batch_size=B, seed=7, pack=True),
        "mixture 0.7/0.3, shuffled": lambda: sb.Epoch(
            sb.mix([sb.windows(sb.open_store(f"s3://bench/{n}", options=options), context_length=T, stride=T)
                    for n in ("first", "second")], [0.7, 0.3], seed=7), batch_size=B),
    }  # fmt: skip
    print(f"consumer: {args.pace * 1e3:.0f} ms per step of B={B} x T={T}, {args.steps} steps, no disk cache")
    print(f"{'kind':<28}{'waiting % (goal <= 1)':>22}{'GETs per 1e6 tokens':>21}{'MB per 1e6 tokens':>19}")
    for name, make in kinds.items():
        found = [paced(name, make(), args.pace, args.steps) for _ in range(args.rounds)]
        m = {key: statistics.median(r[key] for r in found) for key in found[0]}
        print(f"{name:<28}{m['waiting %']:>22.2f}{m['GETs/1e6']:>21.1f}{m['MB/1e6']:>19.1f}")


ORDERS = {
    "windows, document order": {"seed": None},
    "windows, shuffled": {"seed": 7},
    "packed rows, in order": {"seed": None, "pack": True},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4_000_000)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pace", type=float, help="seconds per training step: measure the waiting share instead")
    parser.add_argument("--steps", type=int, default=200, help="with --pace: steps per run")
    args = parser.parse_args()
    T, B = args.context_length, args.batch_size
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    rng = np.random.default_rng(0)
    lengths = rng.integers(T // 2, 8 * T, size=args.tokens // (4 * T) + 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.uint16)
    local = sb.write_store(tmp / "local", sb.DocumentStore.from_arrays(tokens, offsets))
    half = int(offsets[len(offsets) // 2])
    sb.write_store(tmp / "first", sb.DocumentStore.from_arrays(tokens[:half], offsets[: len(offsets) // 2 + 1], ids=None))
    rest = offsets[len(offsets) // 2 :] - half
    sb.write_store(tmp / "second", sb.DocumentStore.from_arrays(tokens[half:], rest, ids=[f"s{i}" for i in range(rest.size - 1)]))
    for name in ("local", "first", "second"):  # the server's files, laid out as an upload lays them (no S3 PUT here)
        stage(tmp / name, tmp / "objects" / "bench" / ("store" if name == "local" else name))
    spawn = mp.get_context("spawn")
    ports = spawn.Queue()
    server = spawn.Process(target=serve_fast, args=(str(tmp / "objects"), ports), daemon=True)
    server.start()
    proxy = spawn.Process(target=proxy_to, args=(ports.get(timeout=30), args.delay, ports), daemon=True)
    proxy.start()
    os.environ.update(AWS_ACCESS_KEY_ID="bench-key", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_REGION="us-east-1")
    options = {"endpoint": f"http://127.0.0.1:{ports.get(timeout=30)}"}
    size = local.tokens.nbytes
    print(
        f"store: {local.token_count:,} tokens ({size / 1e6:.1f} MB), T={T}, batch={B}, +{args.delay * 1e3:.0f} ms per "
        f"request, {args.rounds} interleaved rounds (medians), at most {WORKERS} GETs in flight"
    )
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in ORDERS}
    limit = []
    if args.pace is not None:
        try:
            pace_table(args, options)
        finally:
            proxy.kill()
            server.kill()
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    try:
        for _ in range(args.rounds):
            for name, order in ORDERS.items():
                config = {"context_length": T, "batch_size": B, **({} if order.get("pack") else {"stride": T}), **order}
                rounds[name].append(one_round(name, config, local, options, tmp))
            limit.append(ceiling(ObjectClient(Location.parse("s3://bench/store", options)), size))
    finally:
        proxy.kill()
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    top = statistics.median(limit)
    print(f"server ceiling: {top:,.0f} ranged GETs/s of 4 KB with 64 in flight")
    print(f"{'order':<26}{'1ms no cache':>13}{'1ms 1% cache':>13}{'raw/bulk':>10}{'GETs/ranges':>12}{'bytes':>7}"
          f"{'first s':>8}{'resume %':>9}{'GET/s':>8}{'raw MB/s':>9}{'bulk MB/s':>10}{'in flight':>10}"
          f"{'waited %':>9}")  # fmt: skip
    print(f"{'goal':<26}{'>= 0.9':>13}{'>= 0.9':>13}{'>= 0.8':>10}{'<= 1.1':>12}{'<=1.05':>7}{'<= 0.5':>8}{'< 1':>9}")
    for name, found in rounds.items():
        m = {key: statistics.median(r[key] for r in found) for key in found[0]}
        print(
            f"{name:<26}{m['no cache']:>13.2f}{m['cache']:>13.2f}{m['raw']:>10.2f}{m['GETs']:>12.3f}{m['bytes']:>7.3f}"
            f"{m['first batch s']:>8.3f}{m['resume %']:>9.3f}{m['GET/s']:>8.0f}{m['raw MB/s']:>9.0f}{m['bulk MB/s']:>10.0f}"
            f"{m['in flight']:>10.0f}{100 * m['waiting']:>5.1f} vs {100 * m['local waiting']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
