#!/usr/bin/env python3
"""Benchmark of the mixture order (issue 17): planning, memory, random access, and prefix drift.

    python scripts/bench_mix.py                      # 10**8 items; drift over 10**6 items
    python scripts/bench_mix.py --length 1e7 --drift-length 1e5

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
"""

from __future__ import annotations

import argparse
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's streambatch, not an installed one

from streambatch.stages import _mix_order
from streambatch.stages.mix import integer_weights, plan_mix

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
    print(f"backend: {_mix_order.BACKEND}; sources {sizes} at weights {weights}, {length:.3g} items")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=float, default=1e8, help="items of the 3-source mixture (default 1e8)")
    parser.add_argument("--drift-length", type=float, default=1e6, help="items for the drift table (default 1e6)")
    args = parser.parse_args()
    part_one(int(args.length))
    part_two(int(args.drift_length))


if __name__ == "__main__":
    main()
