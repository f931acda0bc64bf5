#!/usr/bin/env python3
"""streambatch, MosaicML Streaming and LitData streaming one corpus from one S3 server on loopback, side by side.

    python scripts/bench_remote_peers.py                        # 64 MB corpus, T=2048, B=8, 3 interleaved rounds
    python scripts/bench_remote_peers.py --corpus-mb 16 --rounds 1 --readers streambatch,mosaic
    python scripts/bench_remote_peers.py --step-ms 1            # a consumer that spends 1 ms per batch

The peers are extras of this benchmark, never dependencies of streambatch.  Install them into a venv of
their own (torch here is the CPU build; the peers' other heavy pins are left out with ``--no-deps``)::

    python -m venv /tmp/peers-venv && P=/tmp/peers-venv/bin/pip
    $P install torch==2.13.0 numpy msgspec more-itertools obstore 'moto[server]' boto3
    $P install --no-deps mosaicml-streaming litdata
    $P install lightning-utilities filelock requests urllib3 tifffile Brotli python-snappy 'xxhash<4' \\
        zstd tqdm catalogue 'transformers<5' pillow
    $P install --no-deps -e .                                   # streambatch (or PYTHONPATH=$PWD)
    /tmp/peers-venv/bin/python scripts/bench_remote_peers.py

What it does, all on 127.0.0.1:

1. Starts moto's ``ThreadedMotoServer`` on a free port.  moto answers a ranged GET by reading the
   whole object and slicing it (O(object) per request), which no real object store does and which
   would charge streambatch's range reads for moto's shortcut; the benchmark patches moto's GET so a
   single ``bytes=a-b`` range reads only those bytes (``--moto-as-is`` turns the patch off).
   Everything else (headers, ETags, ``If-Match``) is moto's own.
2. Starts a threaded HTTP/1.1 proxy (keep-alive, a process of its own) in front of it that holds
   the first byte of every response back by ``--delay-ms`` (20 ms) and counts requests, GETs and
   response bytes.  Every reader talks only to the proxy; uploads go to moto directly.
3. Writes one corpus (uint16 tokens, documents of lognormal lengths) three ways: a streambatch store
   (``sb.write_store``, then uploaded header last), a MosaicML MDS dataset (``MDSWriter``, one sample
   per window, column ``ndarray:uint16:T+1``, shards of ``--shard-mb``) and a LitData dataset
   (``litdata.optimize`` with ``TokensLoader``, chunks of ``--shard-mb``).  The samples of both peers
   are exactly the windows of streambatch's epoch (``stride = T + 1``: disjoint windows inside
   documents), so all three read the same tokens.
4. Reads each one epoch, shuffled, at batch size B, in a fresh process per run (``--rounds``
   rounds, readers interleaved; medians reported): streambatch's ``Epoch`` over
   ``sb.open_store("s3://...")``; the peers through their own loaders (``StreamingDataset`` +
   torch ``DataLoader``, ``StreamingDataset`` + ``StreamingDataLoader``), ``num_workers=0`` each (the
   machine is small and shared), each with a fresh empty local cache.  The consumer counts tokens,
   sums them (the sums must agree: the same windows were read) and optionally sleeps ``--step-ms``.
5. Prints tokens/s (whole epoch, open to last batch), time to the first batch (from the open),
   bytes fetched and GET requests (the proxy's counters), and each as a ratio to streambatch.

Endpoints: streambatch and LitData read ``AWS_ENDPOINT_URL`` (LitData also gets ``endpoint_url`` in
``storage_options``), MosaicML Streaming reads ``S3_ENDPOINT_URL``; all point at the proxy.  Not run
in CI.  Deletes what it wrote unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

BUCKET = "bench"
READERS = ("streambatch", "mosaic", "litdata")
HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
COUNTERS = ("requests", "gets", "bytes")
MODULES = {"streambatch": ["streambatch", "streambatch.io.remote.open", "obstore"],
           "mosaic": ["torch", "torch.utils.data", "streaming", "boto3"],
           "litdata": ["torch", "litdata", "litdata.streaming.downloader", "obstore", "boto3"]}  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the proxy: first byte of each response held back, requests and bytes counted ---------------------
def serve_proxy(port: int, upstream: int, delay: float, counts: Any, ready: Any) -> None:
    """Run the delaying, counting proxy on 127.0.0.1:*port* in front of 127.0.0.1:*upstream* (a process)."""
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _upstream(self) -> http.client.HTTPConnection:
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=120)
            return local.conn  # type: ignore[no-any-return]

        def _relay(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            for attempt in (0, 1):
                conn = self._upstream()
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    break
                except (ConnectionError, http.client.HTTPException):
                    conn.close()
                    local.conn = None
                    if attempt:
                        raise
            length = response.getheader("Content-Length")
            data = None if length is not None or self.command == "HEAD" else response.read()
            time.sleep(delay)  # the first byte waits
            self.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP and not (data is not None and key.lower() == "content-length"):
                    self.send_header(key, value)
            if data is not None:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            sent = 0
            if data is not None:
                self.wfile.write(data)
                sent = len(data)
            elif self.command != "HEAD":
                while chunk := response.read(1 << 20):
                    self.wfile.write(chunk)
                    sent += len(chunk)
            response.close()
            with counts.get_lock():
                counts[0] += 1
                counts[1] += self.command == "GET"
                counts[2] += sent

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ready.set()
    server.serve_forever()


# -- moto: a ranged GET reads its range, not the whole object ---------------------------------------
_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


def patch_moto() -> None:
    """moto's GET returns ``key.value`` (the whole object) and slices it for a Range; read only the range."""
    from moto.s3 import models, responses

    original_get = responses.S3Response.get_object
    original_value = models.FakeKey.value
    ranged = threading.local()

    class Slice:
        def __init__(self, key: Any) -> None:
            self.key = key

        def __len__(self) -> int:
            return int(self.key.size)

        def __getitem__(self, part: slice) -> bytes:
            with self.key.lock:
                self.key._value_buffer.seek(part.start)
                return bytes(self.key._value_buffer.read(part.stop - part.start))

    def value(self: Any) -> Any:
        return Slice(self) if getattr(ranged, "on", False) else original_value.fget(self)

    def get_object(self: Any) -> Any:
        found = _RANGE.match(self.headers.get("range") or "")
        ranged.on = bool(found) and int(found.group(1)) <= int(found.group(2)) and not self.querystring.get("partNumber")
        try:
            status, headers, content = original_get(self)
        finally:
            ranged.on = False
        if isinstance(content, Slice) and int(found.group(1)) >= len(content):  # type: ignore[union-attr]
            content = original_value.fget(content.key)  # moto's own answer to a range past the end
        return status, headers, content

    models.FakeKey.value = property(value, original_value.fset)
    responses.S3Response.get_object = get_object


@contextlib.contextmanager
def servers(delay: float, patched: bool) -> Any:
    """``(moto_url, proxy_url, counts)``: moto and the proxy in front of it, both on 127.0.0.1."""
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 31))  # objects stay in memory
    from moto.server import ThreadedMotoServer

    if patched:
        patch_moto()
    moto_port, proxy_port = free_port(), free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    context = mp.get_context("spawn")
    counts, ready = context.Array("q", len(COUNTERS)), context.Event()
    proxy = context.Process(target=serve_proxy, args=(proxy_port, moto_port, delay, counts, ready), daemon=True)
    proxy.start()
    ready.wait(60)
    try:
        yield f"http://127.0.0.1:{moto_port}", f"http://127.0.0.1:{proxy_port}", counts
    finally:
        proxy.terminate()
        proxy.join(10)
        moto.stop()


# -- the corpus, written three ways -----------------------------------------------------------------
def corpus(megabytes: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    total, docs = int(megabytes * (1 << 20)) // 2, []
    while total > 0:
        length = int(min(max(rng.lognormal(7.5, 1.0), 64), 60_000, total))
        docs.append(rng.integers(0, 50_000, length, dtype=np.uint16))
        total -= length
    return docs


def windows(docs: list[np.ndarray], context: int) -> np.ndarray:
    """Every window of streambatch's epoch at stride T + 1: ``(N, T + 1)`` uint16, document by document."""
    span = context + 1
    rows = [d[: (len(d) // span) * span].reshape(-1, span) for d in docs if len(d) >= span]
    return np.concatenate(rows)


def write_streambatch(docs: list[np.ndarray], folder: Path, moto: str) -> str:
    import streambatch as sb
    from streambatch.io.remote.upload import upload_store

    sb.write_store(folder, (sb.Document(f"d{i}", "train", d) for i, d in enumerate(docs)))
    url = f"s3://{BUCKET}/streambatch/store"
    upload_store(folder, url, options={"endpoint": moto})
    return url


def upload_folder(folder: Path, prefix: str, moto: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=moto)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder)}")
    return f"s3://{BUCKET}/{prefix}"


def write_mosaic(rows: np.ndarray, folder: Path, shard_bytes: int, moto: str) -> str:
    from streaming import MDSWriter

    with MDSWriter(out=str(folder), columns={"tokens": f"ndarray:uint16:{rows.shape[1]}"}, size_limit=shard_bytes) as out:
        for row in rows:
            out.write({"tokens": row})
    return upload_folder(folder, "mosaic", moto)


def _litdata_rows(block: tuple[str, int, int]) -> Any:
    import torch

    path, lo, hi = block
    rows = np.load(path, mmap_mode="r")
    for row in rows[lo:hi]:
        yield torch.from_numpy(np.array(row))


def write_litdata(rows: np.ndarray, folder: Path, shard_bytes: int, moto: str) -> str:
    from litdata import TokensLoader, optimize

    source = folder.parent / "windows.npy"
    np.save(source, rows)
    step = 4096
    blocks = [(str(source), lo, min(lo + step, len(rows))) for lo in range(0, len(rows), step)]
    optimize(fn=_litdata_rows, inputs=blocks, output_dir=str(folder), chunk_bytes=shard_bytes,
             item_loader=TokensLoader(), num_workers=1, verbose=False, reorder_files=False)  # fmt: skip
    source.unlink()
    return upload_folder(folder, "litdata", moto)


# -- one run of one reader (a fresh process) ---------------------------------------------------------
def read_streambatch(url: str, context: int, batch: int, seed: int, _: Path, prefetch: int | None = None) -> Any:
    import streambatch as sb

    store = sb.open_store(url, prefetch=prefetch)
    for b in sb.Epoch(store, context_length=context, batch_size=batch, stride=context + 1, seed=seed):
        yield b.inputs.shape[0], int(b.inputs.sum(dtype=np.int64)) + int(b.targets[:, -1].sum(dtype=np.int64))


def read_mosaic(url: str, context: int, batch: int, seed: int, cache: Path) -> Any:
    import torch
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    data = StreamingDataset(remote=url, local=str(cache), shuffle=True, shuffle_seed=seed, batch_size=batch)
    for b in DataLoader(data, batch_size=batch, num_workers=0):
        tokens = b["tokens"]
        yield tokens.shape[0], int(tokens.sum(dtype=torch.int64))


def read_litdata(url: str, context: int, batch: int, seed: int, cache: Path) -> Any:
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    from litdata.streaming import downloader

    # LitData fetches chunks with obstore under fixed client options; a plain-http loopback server needs allow_http
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    data = StreamingDataset(url, cache_dir=str(cache), item_loader=TokensLoader(block_size=context + 1),
                            shuffle=True, seed=seed, storage_options=options)  # fmt: skip
    for b in StreamingDataLoader(data, batch_size=batch, num_workers=0):
        yield b.shape[0], int(b.sum(dtype=torch.int64))


def child(args: argparse.Namespace) -> None:
    if args.child == "mosaic":
        _stub_torchvision()
    name, _, depth = args.child.partition("@")  # streambatch@N: prefetch fixed at N batches
    reader = {"streambatch": read_streambatch, "mosaic": read_mosaic, "litdata": read_litdata}[name]
    if depth:
        reader = functools.partial(reader, prefetch=int(depth))
    for module in MODULES[name]:  # imports are not part of the timing
        __import__(module)
    cache = Path(tempfile.mkdtemp(prefix=f"peers-{args.child}-", dir=args.work))
    rows = total = batches = 0
    step = args.step_ms / 1000
    start = time.perf_counter()
    first = None
    for count, checksum in reader(args.url, args.context, args.batch, args.seed, cache):
        if first is None:
            first = time.perf_counter() - start
        rows, total, batches = rows + count, total + checksum, batches + 1
        if step:
            time.sleep(step)
    elapsed = time.perf_counter() - start
    shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({"rows": rows, "sum": total, "batches": batches, "seconds": elapsed, "first": first}))


def _stub_torchvision() -> None:
    """MosaicML Streaming imports torchvision at import time (its vision datasets, unused here); PyPI's
    torchvision is a CUDA build that does not load beside the CPU torch, so give it empty stand-ins."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        import importlib.machinery
        import types

        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
        sys.modules["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        sys.modules["torchvision.datasets"].CIFAR10 = object  # type: ignore[attr-defined]
        sys.modules["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]


def run(reader: str, url: str, proxy: str, counts: Any, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy, S3_ENDPOINT_URL=proxy, AWS_ALLOW_HTTP="true", PYTHONWARNINGS="ignore")
    command = [sys.executable, __file__, "--child", reader, "--url", url, "--work", str(args.work),
               "--context", str(args.context), "--batch", str(args.batch), "--seed", str(args.seed),
               "--step-ms", str(args.step_ms)]  # fmt: skip
    with counts.get_lock():
        counts[:] = [0] * len(COUNTERS)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    if done.returncode:
        raise SystemExit(f"{reader} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    with counts.get_lock():
        result.update(zip(COUNTERS, counts[:], strict=True))
    result["tokens_per_s"] = result["rows"] * args.context / result["seconds"]
    return result


def table(results: dict[str, list[dict[str, Any]]], needed: int) -> str:
    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    base = "streambatch" if "streambatch" in results else next(iter(results))
    cols = [("tokens_per_s", "tokens/s", "{:,.0f}"), ("first", "first batch s", "{:.3f}"),
            ("bytes", "bytes fetched", "{:,.0f}"), ("gets", "GET requests", "{:,.0f}")]  # fmt: skip
    head = "| reader | " + " | ".join(f"{label} | ×{base}" for _, label, _ in cols) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(cols))]
    for name in results:
        cells = []
        for key, _, fmt in cols:
            value, ref = med(name, key), med(base, key)
            cells += [fmt.format(value), f"{value / ref:.3g}" if ref else "-"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(f"\nbytes the epoch's windows hold: {needed:,}; runs per reader: {len(results[base])} (medians)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-mb", type=float, default=64)
    parser.add_argument("--context", type=int, default=2048, help="T")
    parser.add_argument("--batch", type=int, default=8, help="B")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each reader, interleaved")
    parser.add_argument("--delay-ms", type=float, default=20)
    parser.add_argument("--step-ms", type=float, default=0, help="consumer time per batch")
    parser.add_argument("--shard-mb", type=float, default=8, help="MDS shard / LitData chunk size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--readers", default=",".join(READERS), help="streambatch@N: prefetch fixed at N batches")
    parser.add_argument("--moto-as-is", action="store_true", help="do not patch moto's ranged GET")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    readers = [r for r in args.readers.split(",") if r]
    args.work = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.work))
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    try:
        with servers(args.delay_ms / 1000, not args.moto_as_is) as (moto, proxy, counts):
            import urllib.request

            urllib.request.urlopen(urllib.request.Request(f"{moto}/{BUCKET}", method="PUT"), timeout=30).close()
            docs = corpus(args.corpus_mb, args.seed)
            rows = windows(docs, args.context)
            shard = int(args.shard_mb * (1 << 20))
            t = time.perf_counter()
            urls = {}
            writers = {"streambatch": lambda: write_streambatch(docs, args.work / "sb", moto),
                       "mosaic": lambda: (_stub_torchvision(), write_mosaic(rows, args.work / "mds", shard, moto))[1],
                       "litdata": lambda: write_litdata(rows, args.work / "lit", shard, moto)}  # fmt: skip
            for name in dict.fromkeys(r.partition("@")[0] for r in readers):
                urls[name] = writers[name]()
            print(f"corpus: {len(docs):,} documents, {sum(map(len, docs)):,} tokens; {len(rows):,} windows of "
                  f"T+1={args.context + 1}; written and uploaded in {time.perf_counter() - t:.0f}s", flush=True)  # fmt: skip
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in readers}
            for round_ in range(args.rounds):
                for name in readers if round_ % 2 == 0 else readers[::-1]:
                    result = run(name, urls[name.partition("@")[0]], proxy, counts, args)
                    results[name].append(result)
                    print(f"round {round_ + 1} {name}: {result['tokens_per_s']:,.0f} tokens/s, first batch "
                          f"{result['first']:.3f}s, {result['bytes']:,} bytes, {result['gets']} GETs, "
                          f"{result['rows']:,} rows", flush=True)  # fmt: skip
            sums = {name: {r["sum"] for r in runs} | set() for name, runs in results.items()}
            counted = {name: {r["rows"] for r in runs} for name, runs in results.items()}
            print(f"\nrows read per reader: {counted} (epoch: {len(rows):,}); token sums agree: "
                  f"{len(set().union(*sums.values())) == 1}")  # fmt: skip
            print(f"moto ranged GET {'as is (O(object))' if args.moto_as_is else 'patched to read its range'}; "
                  f"delay {args.delay_ms:g} ms; T={args.context} B={args.batch}; step {args.step_ms:g} ms; "
                  f"peers' shards {args.shard_mb:g} MB; num_workers=0\n")  # fmt: skip
            print(table(results, rows.nbytes))
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
