"""Measure reading a store from object storage through a loopback proxy that adds 20 ms to every request's first byte.

    python scripts/bench_remote.py [--tokens 16000000] [--context-length 2048] [--batch-size 8]

A small S3-compatible range server (GET/HEAD, Range, ETag, If-Match; path-style, signatures ignored) serves the
store on 127.0.0.1; moto is far too slow per request for a benchmark.  Prints, for sequential and shuffled orders:
consumer (1 ms per batch) tokens/s remote vs local, with no cache and a 1%-of-store cache; raw emission vs one bulk
transfer of the same bytes; GETs vs coalesced ranges; bytes fetched vs needed; time to the first batch; bytes
fetched before the first batch of a resume at 90%.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
from streambatch.io.remote.client import STATS, ObjectClient
from streambatch.io.remote.location import Location
from streambatch.io.remote.prefetch import byte_ranges
from streambatch.io.remote.tokens import PART
from streambatch.tools.proxy import LoopbackProxy


class _Objects(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root: Path
    etags: dict[str, str]

    def log_message(self, *args: Any) -> None:
        pass

    def _path(self) -> Path:
        return self.root / self.path.lstrip("/").split("?")[0]

    def _etag(self, path: Path) -> str:
        key = str(path)
        if key not in self.etags:
            self.etags[key] = '"' + hashlib.md5(path.read_bytes()).hexdigest() + '"'
        return self.etags[key]

    def do_PUT(self) -> None:
        path = self._path()
        path.parent.mkdir(parents=True, exist_ok=True)
        size = int(self.headers.get("Content-Length", 0))
        path.write_bytes(self.rfile.read(size))
        self.etags.pop(str(path), None)
        self.send_response(200)
        self.send_header("ETag", self._etag(path))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self._path()
        if not path.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag, size = self._etag(path), path.stat().st_size
        if self.headers.get("If-Match") not in (None, etag):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        lo, hi = 0, size
        ranged = self.headers.get("Range")
        if ranged:
            a, b = ranged.split("=")[1].split("-")
            lo, hi = int(a), min(size, int(b) + 1)
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(hi - lo))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT")
        if ranged:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.end_headers()
        if body:
            with open(path, "rb") as handle:
                handle.seek(lo)
                self.wfile.write(handle.read(hi - lo))


def serve(root: Path) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Objects,), {"root": root, "etags": {}})
    http.server.ThreadingHTTPServer.request_queue_size = 512  # many connections at once (the default backlog is 5)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def consume(batches: Any, pause: float) -> tuple[float, float, int]:
    """(seconds to the first batch, tokens/s after it, tokens)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    for batch in batches:
        if first is None:
            first = time.perf_counter()
        else:
            tokens += batch.inputs.size
        if pause:
            time.sleep(pause)
    end = time.perf_counter()
    assert first is not None
    return first - start, tokens / max(end - first, 1e-9), tokens


def needed(epoch: sb.Epoch) -> tuple[int, int]:
    """(bytes the batches need, coalesced ranges): from the spans the prefetcher fetches."""
    total = ranges = 0
    chunks = epoch.chunks()
    for i in range(len(chunks)):
        for file, (starts, ends) in byte_ranges(chunks[i].token_spans()).items():
            del file
            total += sum(e - s for s, e in zip(starts, ends, strict=True))
            ranges += sum(-(-(e - s) // PART) for s, e in zip(starts, ends, strict=True))
    return total, ranges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16_000_000)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args()
    T, B = args.context_length, args.batch_size
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    rng = np.random.default_rng(0)
    lengths = rng.integers(T // 2, 8 * T, size=args.tokens // (4 * T) + 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.uint16)
    local = sb.write_store(tmp / "local", sb.DocumentStore.from_arrays(tokens, offsets))
    server = serve(tmp / "objects")
    os.environ.update(AWS_ACCESS_KEY_ID="bench-key", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_REGION="us-east-1")
    with LoopbackProxy(server.server_address[1], delay=args.delay) as proxy:
        options = {"endpoint": proxy.url}
        (tmp / "objects" / "bench").mkdir(parents=True)
        shutil.copytree(tmp / "local", tmp / "objects" / "bench" / "store")  # the server's files (no multipart upload)
        size = local.tokens.nbytes
        print(
            f"store: {local.token_count:,} tokens ({size / 1e6:.1f} MB), T={T}, batch={B}, +{args.delay * 1e3:.0f} ms per request"
        )
        client = ObjectClient(Location.parse("s3://bench/store", options))
        t = time.perf_counter()
        client.get("tokens.bin")
        bulk = size / (time.perf_counter() - t)
        print(f"bulk: one GET of tokens.bin {bulk / 1e6:.0f} MB/s")
        for name, seed in (("sequential", None), ("shuffled", 7)):
            config = {"context_length": T, "batch_size": B, "stride": T}
            _, local_rate, _ = consume(sb.Epoch(local, seed=seed, **config), 0.001)
            for cache in (None, 0.01):
                extra = {"cache_dir": tmp / f"cache-{name}", "cache_bytes": int(cache * size)} if cache else {}
                t0 = time.perf_counter()
                remote = sb.open_store("s3://bench/store", options=options, **extra)
                epoch = sb.Epoch(remote, seed=seed, **config)
                opened = time.perf_counter() - t0
                first, rate, _ = consume(epoch, 0.001)
                label = "no cache" if cache is None else "1% cache"
                print(
                    f"{name} {label}: consumer 1 ms/batch {rate / local_rate:.2f}x local "
                    f"({rate / 1e6:.1f} vs {local_rate / 1e6:.1f} M tokens/s); "
                    f"first batch {opened + first:.3f} s after open_store"
                )
            remote = sb.open_store("s3://bench/store", options=options)
            epoch = sb.Epoch(remote, seed=seed, **config)
            need, ranges = needed(epoch)
            gets, got = STATS.range_requests, STATS.bytes
            t = time.perf_counter()
            for _ in epoch:
                pass
            seconds = time.perf_counter() - t
            gets, got = STATS.range_requests - gets, STATS.bytes - got
            t = time.perf_counter()
            ObjectClient(Location.parse("s3://bench/store", options)).get_range("tokens.bin", 0, min(need, size), None)
            same_bulk = min(need, size) / (time.perf_counter() - t)
            print(
                f"{name} raw emission: {need / seconds / 1e6:.0f} MB/s = "
                f"{need / seconds / same_bulk:.2f}x one GET of the same bytes; "
                f"GETs {gets} / coalesced ranges {ranges} = {gets / max(ranges, 1):.2f}; bytes {got / max(need, 1):.3f}x needed"
            )
            late = int(0.9 * len(epoch))
            before = STATS.bytes
            resumed = sb.open_store("s3://bench/store", options=options)
            sb.Epoch(resumed, seed=seed, **config).batches()[late]
            print(f"{name} resume at 90%: {(STATS.bytes - before) / size * 100:.3f}% of the store fetched before its first batch")
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
