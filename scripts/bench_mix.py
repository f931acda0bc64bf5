#!/usr/bin/env python3
"""Benchmark of the mixture order (issue 17): planning, memory, random access, and prefix drift.

    python scripts/bench_mix.py                      # 10**8 items; drift over 10**6 items
    python scripts/bench_mix.py --length 1e7 --drift-length 1e5
    python scripts/bench_mix.py --pipeline-only --scale 0.01    # part 3 only, sources 100x smaller

Part 1: three sources of 10**6, 3*10**6 and 10**7 items at weights 0.6/0.3/0.1,
mixed to --length items: seconds to plan the order (`plan_mix`), peak memory
growth of the process (VmHWM after - VmRSS before) per item, the plan's own
bytes per item, seconds to `locate` a batch (contiguous, as a training batch, and
scattered), and seconds to plan the default length (the 10**7 source once).

Part 2: the worst prefix drift max_n max_s |c_s(n) - w_s n| over --drift-length
items, for (a) streambatch's Tijdeman order, (b) Megatron's BlendedDataset rule
(helpers.cpp build_blending_indices: at 0-based sample i, the source with the
largest w_s * max(i, 1) - c_s in float64, ties to the lowest index), (c) weighted
random sampling (numpy default_rng(0).choice).  The drift is computed exactly
(Python integers) against the exact normalised weights (the floats' binary values).

Part 3, the pipeline (`streambatch.items.mix.mixture`): three stores on disk with
10**6, 3*10**6 and 10**7 windows of T=--context-length (times --scale) mixed at
0.6/0.3/0.1 to --length items, each step in a fresh process:
(a) open the stores, ``sb.mix`` (plan in memory) and gather the first batch:
seconds, and the process's peak memory growth per item beside the plan's own
bytes per item and the sources' epoch plans (4 B per window of each source
epoch the first batch reads), the budget being 2 B per item beyond those;
(b) the same with ``plan_dir`` (writes the mixture plan file and the first
source epochs' plan files), then --repeats fresh processes that map them and
gather the first batch (median ms, from opening the stores);
(c) emission: rows per second iterating the mixture vs single-source epochs in
the same process: the 10**7 store alone (shuffled), and the three stores read as
one source (a `Corpus`, shuffled: the same tokens, so the same memory touched),
alternated --repeats times, medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's streambatch, not an installed one

import streambatch as sb
from streambatch import _kernels
from streambatch.items.mix.mixture import mix
from streambatch.items.mix.plan import integer_weights, plan_mix

PIPE_SIZES = [10**6, 3 * 10**6, 10**7]
PIPE_WEIGHTS = [0.6, 0.3, 0.1]
DOC_WINDOWS = 2048  # windows per document of the stand-in stores

WEIGHT_SETS: dict[str, list[float]] = {
    "0.6/0.3/0.1": [0.6, 0.3, 0.1],
    "1/14, 3/14, 10/14 (by size)": [1 / 14, 3 / 14, 10 / 14],
    "0.5/0.5": [0.5, 0.5],
    "0.999/0.001": [0.999, 0.001],
    "0.4/0.25/0.2/0.1/0.05": [0.4, 0.25, 0.2, 0.1, 0.05],
    "6 random (rng 3)": [float(x) for x in np.random.default_rng(3).random(6)],
    "1/3 x 3": [1 / 3, 1 / 3, 1 / 3],
}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def megatron_order(weights: list[float], length: int) -> np.ndarray:
    """Megatron's build_blending_indices, literally (float64, strict '>' keeps the lowest index)."""
    w = np.asarray(weights, dtype=np.float64)
    w = (w / w.sum()).tolist()  # Megatron normalises the weights in Python first
    counts = [0] * len(w)
    out = np.empty(length, dtype=np.uint8)
    k = len(w)
    for i in range(length):
        x = float(max(i, 1))
        best, best_error = 0, w[0] * x - counts[0]
        for s in range(1, k):
            error = w[s] * x - counts[s]
            if error > best_error:
                best, best_error = s, error
        out[i] = best
        counts[best] += 1
    return out


def random_order(weights: list[float], length: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return np.random.default_rng(0).choice(len(w), size=length, p=w / w.sum()).astype(np.uint8)


def worst_drift(weights: list[float], sources: np.ndarray) -> float:
    """max over n and s of |c_s(n) - w_s n|, exactly: |D c - a n| / D in Python integers."""
    ints = integer_weights(weights)
    total = sum(ints)
    n = np.arange(1, sources.size + 1, dtype=np.int64).astype(object)
    worst = 0
    for s, a in enumerate(ints):
        counts = np.cumsum(sources == s, dtype=np.int64).astype(object)
        worst = max(worst, int(np.max(np.abs(counts * total - n * a))))
    return float(Fraction(worst, total))


def part_one(length: int) -> None:
    sizes, weights = [10**6, 3 * 10**6, 10**7], [0.6, 0.3, 0.1]
    print(f"backend: {_kernels.backend('mix_order')}; sources {sizes} at weights {weights}, {length:.3g} items")
    rss_before = _status_kb("VmRSS")
    start = time.perf_counter()
    plan = plan_mix(weights, length=length)
    planned = time.perf_counter() - start
    peak = _status_kb("VmHWM") - rss_before
    print(f"  plan the order:             {planned:7.3f} s   ({planned / length * 1e9:.1f} ns per item)")
    held = plan.nbytes / length
    print(f"  peak memory growth:         {peak * 1024 / length:7.3f} B per item   (plan holds {held:.3f} B per item)")
    rng = np.random.default_rng(0)
    for batch in (1024, 65536):
        for kind in ("contiguous", "scattered"):
            if kind == "contiguous":
                first = int(rng.integers(0, length - batch))
                positions = np.arange(first, first + batch, dtype=np.int64)
            else:
                positions = rng.integers(0, length, batch)
            times = []
            for _ in range(5):
                start = time.perf_counter()
                plan.locate(positions)
                times.append(time.perf_counter() - start)
            print(f"  locate {batch:6d} {kind:10s}:  {min(times) * 1e3:7.3f} ms (best of 5)")
    counts = plan.counts().tolist()
    epochs = [c / n for c, n in zip(counts, sizes, strict=True)]
    print(f"  counts {counts}: source epochs {[round(e, 2) for e in epochs]}")
    del plan
    start = time.perf_counter()
    one_pass = plan_mix(weights, sizes=sizes)
    print(
        f"  default length (the 10**7 source once): {len(one_pass)} items, "
        f"counts {one_pass.counts().tolist()}, planned in {time.perf_counter() - start:.3f} s"
    )


def part_two(length: int) -> None:
    print(f"\nworst prefix drift max_n max_s |c_s(n) - w_s n| over {length:.3g} items")
    print(f"  {'weights':32s} {'k':>2s} {'bound 1-mu':>10s} {'streambatch':>12s} {'Megatron':>10s} {'random':>10s}")
    for name, weights in WEIGHT_SETS.items():
        k = len(weights)
        ours = worst_drift(weights, plan_mix(weights, length=length).sources)
        megatron = worst_drift(weights, megatron_order(weights, length))
        random = worst_drift(weights, random_order(weights, length))
        bound = 1 - 1 / (2 * k - 2)
        print(f"  {name:32s} {k:2d} {bound:10.4f} {ours:12.4f} {megatron:10.4f} {random:10.1f}")
    sets, steps = 200, 4000
    rng = np.random.default_rng(5)
    worst = {"ours": 0.0, "megatron": 0.0, "ratio": 0.0}
    for _ in range(sets):
        k = int(rng.integers(2, 7))
        weights = [float(x) for x in rng.random(k) + 1e-3]
        ours = worst_drift(weights, plan_mix(weights, length=steps).sources)
        worst["ours"] = max(worst["ours"], ours)
        worst["ratio"] = max(worst["ratio"], ours / (1 - 1 / (2 * k - 2)))
        worst["megatron"] = max(worst["megatron"], worst_drift(weights, megatron_order(weights, steps)))
    print(
        f"  {sets} random sets, k = 2..6, {steps} items each: streambatch worst {worst['ours']:.4f} "
        f"(at most its bound: worst drift / (1 - mu) = {worst['ratio']:.4f}), Megatron worst {worst['megatron']:.4f}"
    )


def _write_stores(folder: Path, sizes: list[int], T: int) -> list[str]:
    """One store per size: documents of DOC_WINDOWS windows (the last shorter), random uint16 tokens."""
    rng = np.random.default_rng(1)
    paths = []
    for s, size in enumerate(sizes):
        windows = [DOC_WINDOWS] * (size // DOC_WINDOWS) + ([size % DOC_WINDOWS] if size % DOC_WINDOWS else [])
        lengths = np.array(windows, dtype=np.int64) + T
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
        ids = [f"s{s}-{d}" for d in range(len(windows))]
        path = folder / f"source-{s}"
        sb.write_store(path, sb.DocumentStore.from_arrays(tokens, offsets, ids=ids))
        paths.append(str(path))
    return paths


def _mixture(paths: list[str], T: int, length: int, plan_dir: str | None) -> object:
    parts = [sb.windows(sb.open_store(p, verify=False), context_length=T) for p in paths]
    return mix(parts, PIPE_WEIGHTS, seed=7, length=length, plan_dir=plan_dir)


def child(mode: str, paths: list[str], T: int, B: int, length: int, plan_dir: str | None, batches: int, repeats: int) -> dict:
    """One measurement in this (fresh) process; the result as a dict."""
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    mixture = _mixture(paths, T, length, plan_dir)
    planned = time.perf_counter() - start
    first = sb.materialize(sb.chunk(mixture, B))[0]
    seconds = time.perf_counter() - start
    result = {"plan_s": planned, "first_batch_s": seconds, "rows": first.width}
    result["peak_growth_B_per_item"] = (_status_kb("VmHWM") - before) * 1024 / length
    result["plan_B_per_item"] = mixture.plan_nbytes / length
    result["source_plans_B_per_item"] = 4 * sum(len(p) for p in mixture.parts) / length
    if mode != "emit":
        return result
    single = sb.Epoch(mixture.parts[2], batch_size=B, seed=7)  # the 10**7 source alone, shuffled
    corpus = sb.Epoch(sb.Corpus([p.store for p in mixture.parts]), context_length=T, batch_size=B, seed=7)  # same tokens
    chunks = sb.chunk(mixture, B)
    for part in mixture.parts:  # every token page mapped once, for both
        int(np.asarray(part.store.tokens).sum(dtype=np.int64))
    for it in (iter(single), iter(corpus), iter(sb.materialize(chunks))):  # warm: plans, source orders
        for _ in range(min(batches, 50)):
            next(it)
    rates: dict[str, list[float]] = {"single": [], "corpus": [], "mixture": []}
    for r in range(repeats):
        runs = [("single", single.batches()), ("corpus", corpus.batches()), ("mixture", sb.materialize(chunks))]
        for name, source in runs[r % 3 :] + runs[: r % 3]:  # each goes first in turn
            offset = ((r + 1) * batches) % max(1, len(source) - batches)
            start = time.perf_counter()
            rows = sum(b.width for b in source[offset : offset + batches])
            rates[name].append(rows / (time.perf_counter() - start))
    result.update({f"{k}_rows_per_s": statistics.median(v) for k, v in rates.items()})
    result["ratio"] = result["mixture_rows_per_s"] / result["single_rows_per_s"]
    result["ratio_corpus"] = result["mixture_rows_per_s"] / result["corpus_rows_per_s"]
    return result


def _spawn(mode: str, paths: list[str], args: argparse.Namespace, plan_dir: str | None) -> dict:
    argv = [sys.executable, __file__, "--child", mode, "--paths", *paths, "--context-length", str(args.context_length)]
    argv += ["--batch-size", str(args.batch_size), "--length", str(args.length), "--batches", str(args.batches)]
    argv += ["--repeats", str(args.repeats)] + (["--plan-dir", plan_dir] if plan_dir else [])
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def part_three(args: argparse.Namespace) -> None:
    T, B, length = args.context_length, args.batch_size, int(args.length)
    sizes = [max(1, int(n * args.scale)) for n in PIPE_SIZES]
    print(f"\npipeline: stores of {sizes} windows (T={T}) at {PIPE_WEIGHTS}, {length:.3g} items, batches of {B}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        paths = _write_stores(Path(folder), sizes, T)
        a = _spawn("first", paths, args, None)
        print(f"  (a) open + mix + first batch, plan in memory: {a['first_batch_s']:.3f} s (mix {a['plan_s']:.3f} s)")
        print(
            f"      peak memory growth {a['peak_growth_B_per_item']:.3f} B per item: mixture plan "
            f"{a['plan_B_per_item']:.3f} B per item; the sources' epoch plans {a['source_plans_B_per_item']:.3f} B per item"
        )
        beyond = a["peak_growth_B_per_item"] - a["source_plans_B_per_item"]
        print(f"      beyond the sources' own plans: {beyond:.3f} B per item (budget 2)")
        plans = os.path.join(folder, "plans")
        b = _spawn("first", paths, args, plans)
        times = [_spawn("first", paths, args, plans)["first_batch_s"] * 1e3 for _ in range(args.repeats)]
        print(f"  (b) writing the plan files + first batch: {b['first_batch_s']:.3f} s")
        print(f"      first batch from existing plan files (fresh processes): median {statistics.median(times):.1f} ms "
              f"of {[round(t, 1) for t in times]}")  # fmt: skip
        c = _spawn("emit", paths, args, None)
        print(
            f"  (c) emission, {args.batches} batches x {args.repeats} alternations, medians (rows/s): mixture "
            f"{c['mixture_rows_per_s']:,.0f}; the 10**7 store alone {c['single_rows_per_s']:,.0f} (ratio {c['ratio']:.3f}); "
            f"the three stores as one corpus {c['corpus_rows_per_s']:,.0f} (ratio {c['ratio_corpus']:.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=float, default=1e8, help="items of the 3-source mixture (default 1e8)")
    parser.add_argument("--drift-length", type=float, default=1e6, help="items for the drift table (default 1e6)")
    parser.add_argument("--context-length", type=int, default=128, help="T of the pipeline's windows (default 128)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch in part 3 (default 256)")
    parser.add_argument("--batches", type=int, default=1000, help="batches per emission timing (default 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes / alternations (default 5)")
    parser.add_argument("--scale", type=float, default=1.0, help="scale the pipeline's source sizes (default 1)")
    parser.add_argument("--dir", help="where part 3 writes its stores (default: the temp folder)")
    parser.add_argument("--pipeline-only", action="store_true", help="run part 3 only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--paths", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--plan-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = child(args.child, args.paths, args.context_length, args.batch_size, int(args.length), args.plan_dir,
                    args.batches, args.repeats)  # fmt: skip
        print(json.dumps(out))
        return
    if not args.pipeline_only:
        part_one(int(args.length))
        part_two(int(args.drift_length))
    part_three(args)


if __name__ == "__main__":
    main()
