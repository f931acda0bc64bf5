#!/usr/bin/env python3
"""Packing on the web-like corpus of scripts/bench.py: coverage, padding, rows, and the cost of packing.

    python scripts/bench_pack.py                  # T = 1024, 2048, 8192; 10**7 pieces, 3 runs; emission
    python scripts/bench_pack.py --pieces 1e6 --runs 1 --emit-tokens 5e6 --emit-reps 3
    python scripts/bench_pack.py --emission-only --emit-reps 9   # only window vs packed emission
    python scripts/bench_pack.py --kernels 11     # only the two C gathers, kernel against kernel, by row kind
    python scripts/bench_pack.py --resolve 3e7    # only the cost of making a packed gatherer of 3e7 documents
    python scripts/bench_pack.py --splits 11      # only rows of two segments: equal halves vs a random split

Only document lengths are needed: ``bench.synthetic_lengths`` (lognormal, median
~1,500 tokens, clipped to [1, 50,000], ~20,000 documents for 5e7 tokens).
Per ``T`` it reports the target tokens the window mode covers (the chapter's rule
at stride ``T``: windows of ``T + 1`` tokens of one document, tails dropped)
against packing (every target), the pad share of positions for best-fit
decreasing (`streambatch.items.pack.pack`) and for next-fit in document order
(one open row, closed when the next piece does not fit), and rows against the
lower bound ``ceil(targets / T)``.  Then it packs 10**7 pieces (the same length
distribution, and a worst case where every piece is a tail) and reports the
median time and the peak memory growth per piece: tracemalloc's peak (numpy and
the C kernel's scratch both report to it) and the process's peak RSS growth
(``VmHWM`` after a reset through ``/proc/self/clear_refs``).

Emission: on the same corpus with token ids (uniform below 50,257, uint16, in
memory), a whole seeded epoch of each mode, in the same process, repeats
interleaved: the window mode (``sb.Epoch(store, T, stride=T, seed=7)``, the
configurations of bench.py) against the packed mode
(``sb.Epoch(store, T, pack=True, seed=7)``, whose batches carry inputs, targets, segment ids,
position ids, loss mask and cu_seqlens); positions per second, median of the
repeats, and their ratio.  A window batch writes 4 bytes per position (uint16
inputs and targets), a packed one 9 (plus int16 segment and position ids and a
bool mask), and per segment its provenance.

``--kernels N``: the C gathers alone, no Python around them, N interleaved repeats
over the first 300 batches of each epoch (T = 1024, B = 32 unless ``--emit``
says otherwise): the window gather; the packed gather's token pass on the
epoch's mix of rows, on full rows only (a window's exact bytes), on packed rows
of tails only; the window gather on the full rows' own token positions; and the
window gather on twice as many rows of ``T // 2`` tokens from random places (a
tail row is about two such segments).
``--splits N``: what variable segment lengths cost alone: the packed gather on a synthetic packing whose rows
are two segments from random places, split in equal halves or at a random column, against the window gather
on rows of T and on rows of T/2 from the same places (N interleaved repeats).
``--resolve D``: seconds to make a packed C gatherer (it resolves the packing
once: ``resolve_packing`` in ``_gather_packed.c``) of D synthetic documents of 3
full rows and a tail each, and the bytes its tables take.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's streambatch, and bench.py beside this file
from bench import synthetic_lengths  # noqa: E402 - the corpus of scripts/bench.py

import streambatch as sb  # noqa: E402
from streambatch import _kernels  # noqa: E402
from streambatch.items.pack import pack  # noqa: E402


def next_fit_rows(lengths: np.ndarray, T: int) -> int:
    """Rows of next-fit in document order over every piece (full pieces and tails alike)."""
    index = pack.PieceIndex(lengths, T)
    m = index.locate(np.arange(index.piece_count))[2]
    sizes = (m - 1)[m > 1].tolist()
    rows, room = 0, 0
    for size in sizes:
        if size > room:
            rows += 1
            room = T
        room -= size
    return rows


def pieces_corpus(pieces: int, T: int, tails_only: bool) -> np.ndarray:
    """Document lengths holding exactly *pieces* pieces at *T*: web-like, or all shorter than T + 1 (tails only)."""
    if tails_only:
        return np.random.default_rng(2).integers(2, T + 1, pieces).astype(np.int64)  # 1 .. T - 1 targets each
    lengths = synthetic_lengths(int(pieces * T * 1.2), seed=3)
    while True:
        counts = pack.PieceIndex(lengths, T).counts()
        total = np.cumsum(counts)
        if total[-1] >= pieces:
            return lengths[: int(np.searchsorted(total, pieces)) + 1]
        lengths = np.concatenate([lengths, lengths])


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(lengths: np.ndarray, T: int, runs: int) -> dict[str, float]:
    """Median seconds of pack_lengths, tracemalloc peak growth and peak RSS growth (bytes)."""
    seconds, hwm = [], []
    for _ in range(runs):
        gc.collect()
        before = rss_kb("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            resettable = True
        except OSError:
            resettable = False
        start = time.perf_counter()
        rows = pack.pack_lengths(lengths, T)
        seconds.append(time.perf_counter() - start)
        hwm.append((rss_kb("VmHWM") - before) * 1024 if resettable else float("nan"))
        pieces = rows.report.pieces
        del rows
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rows = pack.pack_lengths(lengths, T)
    peak = tracemalloc.get_traced_memory()[1] - base
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "pieces": pieces,
        "tails": int(rows.tails.size),
        "seconds": statistics.median(seconds),
        "peak_bytes": peak,
        "kept_bytes": kept,
        "rss_bytes": statistics.median(hwm),
    }


def emission_store(total_tokens: int) -> sb.DocumentStore:
    """The bench.py corpus with token ids, in memory (uint16, deterministic)."""
    lengths = synthetic_lengths(total_tokens)
    tokens = np.random.default_rng(1).integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
    return sb.DocumentStore.from_arrays(tokens, np.concatenate([[0], np.cumsum(lengths)]))


def emit_epoch(epoch: sb.Epoch) -> tuple[float, float, int]:
    """Wall and CPU seconds to emit every batch of *epoch* (its plan made beforehand), and the positions emitted."""
    epoch.order  # noqa: B018 - the plan is not emission
    positions = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in epoch:
        positions += batch.inputs.size
    return time.perf_counter() - start, time.process_time() - cpu, positions


def emission(store: sb.DocumentStore, configs: list[tuple[int, int]], reps: int) -> None:
    """Window vs packed emission per position, same run, repeats interleaved; medians and their ratio."""
    print(f"emission, same process, median of {reps} interleaved repeats (packed gather: {_kernels.backend('packed_gather')})")
    print("(Mpos/s by the wall clock; the ratio also by this process's CPU time, which other load does not inflate)")
    header = f"{'T':>5} | {'B':>3} | {'window Mpos/s':>13} | {'packed Mpos/s':>13} | {'packed / window':>15} | {'(CPU time)':>10}"
    print(header)
    print("-" * len(header))
    for T, B in configs:
        window = sb.Epoch(store, context_length=T, stride=T, batch_size=B, seed=7)
        packed = sb.Epoch(store, context_length=T, batch_size=B, seed=7, pack=True)
        wall: dict[str, list[float]] = {"window": [], "packed": []}
        cpu: dict[str, list[float]] = {"window": [], "packed": []}
        for _ in range(reps):
            for name, epoch in (("window", window), ("packed", packed)):
                seconds, cpu_seconds, positions = emit_epoch(epoch)
                wall[name].append(positions / seconds / 1e6)
                cpu[name].append(positions / cpu_seconds / 1e6)
        w, p = statistics.median(wall["window"]), statistics.median(wall["packed"])
        ratio = statistics.median(cpu["packed"]) / statistics.median(cpu["window"])
        print(f"{T:>5} | {B:>3} | {w:>13.1f} | {p:>13.1f} | {p / w:>15.2f} | {ratio:>10.2f}")


def kernels(store: sb.DocumentStore, T: int, B: int, reps: int) -> None:
    """ns per position of each C gather on 300 batches of each kind, repeats interleaved; medians and vs windows."""
    WindowGatherer = _kernels.built("window_gather").WindowGatherer
    from streambatch.items.pack.rows import packed_gatherer

    window = sb.Epoch(store, context_length=T, stride=T, batch_size=B, seed=7)
    packed = sb.Epoch(store, context_length=T, batch_size=B, seed=7, pack=True)
    positions = np.concatenate([b.positions.astype(np.int64) for b in window])
    numbers = np.concatenate([b.positions.astype(np.int64) for b in packed])
    first = next(iter(packed))
    gather, full = packed_gatherer(first.spaces[0]), first.spaces[0].packing.full_rows
    windows, halves = WindowGatherer(store.tokens, T), WindowGatherer(store.tokens, T // 2)
    batches = 300
    random_starts = np.random.default_rng(3).integers(0, store.tokens.size - T, (batches, 2 * B), dtype=np.int64)

    def cut(rows: np.ndarray) -> list[np.ndarray]:
        return [rows[i * B : (i + 1) * B].copy() for i in range(min(batches, rows.size // B))]

    full_rows = cut(numbers[numbers < full])
    full_at = [store.starts[p[1]] + p[2] for p in (gather.gather_tokens(r)[6] for r in full_rows)]
    kinds = {
        "window rows": (windows.gather, cut(positions)),
        "packed: the epoch's mix": (gather.gather_tokens, cut(numbers)),
        "packed: full rows only": (gather.gather_tokens, full_rows),
        "packed: tail rows only": (gather.gather_tokens, cut(numbers[numbers >= full])),
        "window rows at the full rows' tokens": (windows.gather, [np.asarray(a, dtype=np.int64) for a in full_at]),
        "window rows of T/2 from random places": (halves.gather, list(random_starts)),  # 2B rows: as many positions
    }
    title = f"C gathers alone, T={T}, B={B}, {batches} batches each, median of {reps} interleaved repeats"
    time_kinds(title, kinds, B * T, reps)


def time_kinds(title: str, kinds: dict[str, tuple[Any, list[np.ndarray]]], positions: int, reps: int) -> None:
    """ns per position of each kind's call over its batches (*positions* each), repeats interleaved; the medians,
    and each against the first kind's rate."""
    seen: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(reps):
        for name, (call, work) in kinds.items():
            start = time.perf_counter()
            for r in work:
                call(r)
            seen[name].append((time.perf_counter() - start) / (len(work) * positions) * 1e9)
    first = next(iter(kinds))
    base = statistics.median(seen[first])
    print(title)
    for name, values in seen.items():
        m = statistics.median(values)
        print(f"{name:>38} | {m:.3f} ns/position | {base / m:.2f}x the {first}' rate")


def splits(T: int, B: int, reps: int, tokens_count: int = 50_000_000, rows: int = 20_000) -> None:
    """The packed gather on rows of two segments from random places, split in equal halves or at a uniformly random
    column, against the window gather on rows of T and of T/2 at the same places: what variable lengths cost alone.

    A synthetic packing with no full rows: packed row i holds two one-tail documents placed at random in the
    tokens (a document of n + 1 tokens is a tail of n targets), so the rows hold the same bytes from the same
    places in every kind; only the split differs.
    """
    Gatherer, WindowGatherer = _kernels.built("packed_gather").Gatherer, _kernels.built("window_gather").WindowGatherer

    tokens = np.random.default_rng(1).integers(0, 50_257, tokens_count, dtype=np.uint16)
    rng = np.random.default_rng(5)
    starts = rng.integers(0, tokens_count - 2 * T - 2, 2 * rows).astype(np.int64)
    cut = rng.integers(1, T, rows)
    none = np.zeros(0, dtype=np.int64)
    offsets, tails = np.arange(0, 2 * rows + 1, 2, dtype=np.int64), np.arange(2 * rows, dtype=np.uint32)

    def packed(targets: np.ndarray) -> Any:
        return Gatherer(tokens, starts, targets.astype(np.int64) + 1, none, none, offsets, tails, T, 0, 0).gather_tokens

    halves, split = np.full(2 * rows, T // 2), np.empty(2 * rows, dtype=np.int64)
    split[0::2], split[1::2] = cut, T - cut
    order = rng.permutation(rows)
    batches = [order[i : i + B].astype(np.int64) for i in range(0, rows - B + 1, B)]
    pairs = [np.stack([starts[2 * b], starts[2 * b + 1]], 1).ravel() for b in batches]
    kinds = {
        "window rows": (WindowGatherer(tokens, T).gather, [starts[2 * b] for b in batches]),
        "window rows of T/2, two per row": (WindowGatherer(tokens, T // 2).gather, pairs),
        "packed rows, halves": (packed(halves), batches),
        "packed rows, random split": (packed(split), batches),
    }
    title = f"rows of two segments, T={T}, B={B}, {len(batches)} batches each, median of {reps} interleaved repeats"
    time_kinds(title, kinds, B * T, reps)


def resolve_cost(documents: int, T: int = 1024, runs: int = 3) -> None:
    """Seconds to make a packed C gatherer of *documents* documents of 3 full rows and a tail each."""
    Gatherer = _kernels.built("packed_gather").Gatherer

    lengths = np.full(documents, 3 * T + T // 2, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = np.zeros(int(lengths.sum()) if documents <= 10**6 else 1, dtype=np.uint16)  # big ones: every piece refused
    full_docs = np.arange(documents, dtype=np.int64)
    full_ends = 3 * np.arange(1, documents + 1, dtype=np.int64)
    offsets = np.arange(0, documents + 1, 2, dtype=np.int64)
    tails = np.arange(documents, dtype=np.uint32)
    rows = int(full_ends[-1])
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        Gatherer(tokens, starts, lengths, full_docs, full_ends, offsets, tails, T, rows, 0)
        seconds.append(time.perf_counter() - start)
    tables = 4 * rows + 32 * documents + 24 * documents  # resolve_packing: per full row, full piece, tail
    own = 16 * documents + 8 * offsets.size + 4 * tails.size  # the packing's arrays it reads (full pieces, rows)
    print(
        f"packed gatherer of {documents:,} documents, {rows:,} full rows: {statistics.median(seconds):.2f} s "
        f"(median of {runs}); its tables {tables / 2**30:.2f} GiB, {tables / own:.1f}x the packing's arrays"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens (default 5e7, as bench.py)")
    parser.add_argument("--lengths", default="1024,2048,8192", help="context lengths T")
    parser.add_argument("--pieces", type=float, default=1e7, help="pieces for the packing cost (default 1e7)")
    parser.add_argument("--cost-T", type=int, default=2048, help="T for the packing cost")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per cost measurement (median)")
    parser.add_argument("--emit-tokens", type=float, default=50e6, help="corpus tokens for the emission comparison")
    parser.add_argument("--emit", default="1024:32,2048:8", help="T:B configurations for emission (bench.py's)")
    parser.add_argument("--emit-reps", type=int, default=5, help="interleaved repeats per emission measurement")
    parser.add_argument("--emission-only", action="store_true", help="only the window vs packed emission comparison")
    parser.add_argument("--kernels", type=int, default=0, help="only the C gathers by row kind, this many repeats")
    parser.add_argument("--resolve", type=float, default=0, help="only the cost of a packed gatherer of D documents")
    parser.add_argument("--splits", type=int, default=0, help="only rows of two segments by split, this many repeats")
    args = parser.parse_args()
    configs = [(int(t), int(b)) for t, b in (c.split(":") for c in args.emit.split(","))]
    if args.resolve:
        resolve_cost(int(args.resolve))
        return
    if args.splits:
        splits(*configs[0], args.splits)
        return
    if args.kernels:
        kernels(emission_store(int(args.emit_tokens)), *configs[0], args.kernels)
        return
    if args.emission_only:
        emission(emission_store(int(args.emit_tokens)), configs, args.emit_reps)
        return
    print(f"backend: {_kernels.backend('best_fit')}")

    lengths = synthetic_lengths(int(args.tokens))
    print(f"corpus: {lengths.size:,} documents, {int(lengths.sum()):,} tokens, median length {int(np.median(lengths))}")
    print()
    header = (
        f"{'T':>5} | {'targets':>11} | {'window cover':>12} | {'packed cover':>12} | {'BFD pad':>8} | "
        f"{'next-fit pad':>12} | {'BFD rows':>8} | {'lower bound':>11} | {'next-fit rows':>13} | {'pack s':>6}"
    )
    print(header)
    print("-" * len(header))
    for T in (int(t) for t in args.lengths.split(",")):
        start = time.perf_counter()
        rows = pack.pack_lengths(lengths, T)
        took = time.perf_counter() - start
        r = rows.report
        covered = r.targets  # every target lies in exactly one packed piece (tests/items/test_pack.py checks it)
        nf_rows = next_fit_rows(lengths, T)
        nf_pad = 1 - r.targets / (nf_rows * T)
        print(
            f"{T:>5} | {r.targets:>11,} | {r.window_coverage:>12.1%} | {covered / r.targets:>12.1%} | "
            f"{r.pad_share:>8.3%} | {nf_pad:>12.2%} | {r.rows:>8,} | {r.lower_bound:>11,} | {nf_rows:>13,} | {took:>6.3f}"
        )
    print()
    pieces = int(args.pieces)
    T = args.cost_T
    print(f"packing cost, T={T}, median of {args.runs} runs (growth: bytes per piece)")
    header = (
        f"{'corpus':>22} | {'pieces':>11} | {'tails':>11} | {'seconds':>7} | "
        f"{'tracemalloc peak':>16} | {'RSS peak':>8} | {'kept':>5}"
    )
    print(header)
    print("-" * len(header))
    for name, tails_only in (("web-like lengths", False), ("every piece a tail", True)):
        sizes = pieces_corpus(pieces, T, tails_only)
        m = measure(sizes, T, args.runs)
        n = m["pieces"]
        print(
            f"{name:>22} | {int(n):>11,} | {int(m['tails']):>11,} | {m['seconds']:>7.2f} | "
            f"{m['peak_bytes'] / n:>16.1f} | {m['rss_bytes'] / n:>8.1f} | {m['kept_bytes'] / n:>5.1f}"
        )
        del sizes
    print()
    emission(emission_store(int(args.emit_tokens)), configs, args.emit_reps)


if __name__ == "__main__":
    main()
