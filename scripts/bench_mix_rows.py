#!/usr/bin/env python3
"""Emission of a mixture of packed rows against single-source packed emission, in the same process.

    python scripts/bench_mix_rows.py                           # 10**6, 3*10**6, 10**7 tokens; T=1024, B=8
    python scripts/bench_mix_rows.py --scale 0.1 --reps 3

Three in-memory stores with the document lengths of scripts/bench.py (lognormal,
median ~1,500 tokens) and token ids (uniform below 50,257, uint16), of 10**6,
3*10**6 and 10**7 tokens (times --scale), each packed at ``T``
(``sb.pack(store, context_length=T)``) and mixed at 0.6/0.3/0.1 with the
default length (the largest source once).  Emission: positions per second
iterating a whole epoch of batches of B rows (inputs, targets, segment and
position ids, loss mask, cu_seqlens, and for the mixture sources), medians of
--reps interleaved repeats, for (a) the mixture (`sb.Epoch(mixture, ...)`:
one call of the packed gather per batch, each row read through its own source's
gatherer, every array made by it), (b) the largest source packed alone, (c) the three stores read as
one source (a `Corpus`, packed and shuffled: the same tokens).  Reported by the
wall clock and, for the ratios, by this process's CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's streambatch, and bench.py beside this file
from bench import synthetic_lengths  # noqa: E402 - the corpus of scripts/bench.py

import streambatch as sb  # noqa: E402
from streambatch import _kernels  # noqa: E402

TOKENS = [10**6, 3 * 10**6, 10**7]
WEIGHTS = [0.6, 0.3, 0.1]


def store(total_tokens: int, seed: int) -> sb.DocumentStore:
    lengths = synthetic_lengths(total_tokens, seed=seed)
    tokens = np.random.default_rng(seed + 1).integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
    return sb.DocumentStore.from_arrays(
        tokens, np.concatenate([[0], np.cumsum(lengths)]), ids=[f"s{seed}-{i}" for i in range(lengths.size)]
    )


def emit(epoch: sb.Epoch) -> tuple[float, float, int]:
    """Wall and CPU seconds to emit every batch of *epoch* (its plans made beforehand), and the positions emitted."""
    list(epoch.iter_batches(stop=1))  # the plans and gathers are built, not timed
    positions = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in epoch:
        positions += batch.inputs.size
    return time.perf_counter() - start, time.process_time() - cpu, positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every store's tokens (default 1)")
    parser.add_argument("-T", "--context-length", type=int, default=1024)
    parser.add_argument("-B", "--batch-size", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    T, B = args.context_length, args.batch_size
    stores = [store(int(n * args.scale), seed=s) for s, n in enumerate(TOKENS)]
    parts = [sb.pack(s, context_length=T) for s in stores]
    mixture = sb.mix(parts, WEIGHTS, seed=7, names=["small", "medium", "large"])
    print(
        f"packed gather: {_kernels.backend('packed_gather')}; T={T}, B={B}; "
        f"rows per source {[len(p) for p in parts]}; mixture {len(mixture)} rows"
    )
    print(
        f"rows per source in the mixture {mixture.counts().tolist()}, "
        f"source epochs {[round(e, 3) for e in mixture.source_epochs()]}"
    )
    epochs = {
        "mixture": sb.Epoch(mixture, batch_size=B, seed=7),
        "largest alone": sb.Epoch(stores[-1], context_length=T, batch_size=B, seed=7, pack=True),
        "three as one corpus": sb.Epoch(sb.Corpus(stores), context_length=T, batch_size=B, seed=7, pack=True),
    }
    wall: dict[str, list[float]] = {name: [] for name in epochs}
    cpu: dict[str, list[float]] = {name: [] for name in epochs}
    for _ in range(args.reps):
        for name, epoch in epochs.items():
            seconds, cpu_seconds, positions = emit(epoch)
            wall[name].append(positions / seconds / 1e6)
            cpu[name].append(positions / cpu_seconds / 1e6)
    print(f"{'epoch':<20} | {'Mpos/s (wall)':>13} | {'Mpos/s (CPU)':>12} | {'mixture / this (CPU)':>20}")
    mixed = statistics.median(cpu["mixture"])
    for name in epochs:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<20} | {w:>13.1f} | {c:>12.1f} | {mixed / c:>20.2f}")


if __name__ == "__main__":
    main()
