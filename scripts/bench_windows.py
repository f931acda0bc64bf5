#!/usr/bin/env python3
"""Side-by-side benchmark: the stage path ``sb.shuffle(sb.windows(store))`` on ONE long document vs numpy's permutation.

    python scripts/bench_windows.py                          # 10**8 windows, 3 interleaved repeats
    python scripts/bench_windows.py --windows 1e7 --repeats 5 --stride 3
    python scripts/bench_windows.py --windows 1e9 --repeats 1 --stages-only   # 4 GB plan; skips numpy's 8 GB

The store holds a single document of ``windows + T`` tokens (T = --context-length,
stride 1: one window per token), written once under --cache and memory-mapped
(its tokens are never read by these stages).  Each measurement runs in its own
subprocess, so its peak RSS (VmHWM from /proc/self/status) is its own; the two
contenders alternate which goes first, repeat by repeat, because the machine may
be shared and noisy.  Times include allocating and first touching the output.

Issue 18's targets: the stage path takes at most 0.35x the time of
``numpy.random.default_rng(0).permutation(n)`` (same n) and peaks at most at
4 bytes per window + 400 MiB (the enumeration used to make 16 bytes per window
of temporaries: 1.65 GB at 10**8 windows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SEED = 7
KINDS = ("stages", "numpy-permutation")


def _status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def store_path(cache: Path, windows: int, context_length: int, stride: int) -> Path:
    """The one-document store of exactly *windows* windows, written on first use."""
    import numpy as np

    import streambatch as sb

    length = (windows - 1) * stride + context_length + 1
    path = cache / f"one-document-{length}"
    if not (path / "header.json").exists():
        sb.write_store(path, sb.DocumentStore.from_arrays(np.zeros(length, dtype=np.uint16), [0, length]))
    return path


def worker(kind: str, store: str, windows: int, context_length: int, stride: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import numpy as np

    import streambatch as sb
    from streambatch import _kernels

    source = sb.open_store(store, verify=False)
    before = _status_mib("VmRSS")
    start = time.perf_counter()
    if kind == "stages":
        order = sb.shuffle(sb.windows(source, context_length=context_length, stride=stride), SEED)
        if len(order) != windows or order.plan is None:
            raise SystemExit(f"expected a shuffled plan of {windows} windows, got {order!r}")
        nbytes, head = order.plan_nbytes, order.plan[:3].tolist()
    else:
        plan = np.random.default_rng(0).permutation(windows)
        nbytes, head = plan.nbytes, plan[:3].tolist()
    seconds = time.perf_counter() - start
    peak = _status_mib("VmHWM")
    return {
        "kind": kind,
        "seconds": seconds,
        "peak_rss_mib": peak,
        "before_mib": before,
        "output_mib": nbytes / 2**20,
        "backend": _kernels.backend("shuffle") if kind == "stages" else "-",
        "head": head,
    }


def measure(kind: str, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run `worker` in a subprocess and return its result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--store", str(store)]
    command += ["--windows", str(args.windows), "--context-length", str(args.context_length), "--stride", str(args.stride)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"worker {kind} failed:\n{result.stderr}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=float, default=1e8, help="windows of the one document (default 1e8)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements per contender (medians)")
    parser.add_argument("--context-length", type=int, default=8, help="T (default 8)")
    parser.add_argument("--stride", type=int, default=1, help="window stride (default 1)")
    parser.add_argument("--cache", default="bench-cache", help="folder for the one-document store")
    parser.add_argument("--stages-only", action="store_true", help="measure the stage path alone (no ratio)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.windows = int(args.windows)
    if args.worker:
        print(json.dumps(worker(args.worker, args.store, args.windows, args.context_length, args.stride)))
        return

    store = store_path(Path(args.cache), args.windows, args.context_length, args.stride)
    print(f"one document, {args.windows:,} windows (T={args.context_length}, stride {args.stride}), store {store}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    kinds = KINDS[:1] if args.stages_only else KINDS
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):  # alternate which goes first
        for kind in kinds if repeat % 2 == 0 else kinds[::-1]:
            runs[kind].append(measure(kind, store, args))
    seconds = {kind: statistics.median(r["seconds"] for r in rows) for kind, rows in runs.items()}
    peak = {kind: max(r["peak_rss_mib"] for r in rows) for kind, rows in runs.items()}
    print("\n| contender | median s | min s | peak RSS MiB | output MiB |\n|---|---|---|---|---|")
    for kind, rows in runs.items():
        least = min(r["seconds"] for r in rows)
        print(f"| {kind} | {seconds[kind]:.3f} | {least:.3f} | {peak[kind]:.0f} | {rows[0]['output_mib']:.0f} |")
    ratio = None if args.stages_only else seconds["stages"] / seconds["numpy-permutation"]
    bound = 4 * args.windows / 2**20 + 400
    per_window = (peak["stages"] - max(r["before_mib"] for r in runs["stages"])) * 2**20 / args.windows
    if ratio is not None:
        print(
            f"\nstage path / numpy permutation: {ratio:.2f}x (medians of {args.repeats}; target <= 0.35x: "
            f"{'met' if ratio <= 0.35 else 'NOT met'})"
        )
    print(
        f"stage path peak RSS: {peak['stages']:.0f} MiB, {per_window:.2f} B/window above the process before it "
        f"(bound 4 B/window + 400 MiB = {bound:.0f} MiB: {'met' if peak['stages'] <= bound else 'NOT met'})"
        + ("" if args.stages_only else f"; numpy permutation peak {peak['numpy-permutation']:.0f} MiB")
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
