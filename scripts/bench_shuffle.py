#!/usr/bin/env python3
"""Side-by-side benchmark: streambatch's exact shuffle vs ``numpy.random.default_rng(0).permutation``.

    python scripts/bench_shuffle.py                        # 10**8 items, 3 repeats
    python scripts/bench_shuffle.py --count 1e7 --repeats 5 --fallback
    python scripts/bench_shuffle.py --big                  # 10**9 items, once each

Every measurement runs in its own subprocess, so its peak RSS (VmHWM from
/proc/self/status) is its own; the contenders are interleaved repeat by repeat
(alternating which goes first) because the machine may be shared and noisy.
Reported: median and min seconds, the ratio of medians against numpy, peak RSS,
and the scratch memory beyond the output array (peak RSS - RSS before - output
bytes).  streambatch writes a uint32 order (4 bytes per item below 2**32 items),
numpy an int64 one (8 bytes).  Times include allocating (and first touching) the
output, for both.  ``--fallback`` adds streambatch's numpy backend (slow).
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

ROOT = Path(__file__).resolve().parents[1]
SEED = 7
KINDS = {
    "streambatch": "streambatch.shuffled_order (default backend)",
    "streambatch-numpy": "streambatch.shuffled_order, the numpy path (_kernels.use('shuffle', 'python'))",
    "numpy-permutation": "numpy.random.default_rng(0).permutation",
}


def _status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(kind: str, count: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import numpy as np

    import streambatch.order.shuffle as shuffle
    from streambatch import _kernels

    if kind == "streambatch-numpy":
        _kernels.set_backend("shuffle", "python")
    before = _status_mb("VmRSS")
    start = time.perf_counter()
    if kind == "numpy-permutation":
        order = np.random.default_rng(0).permutation(count)
    else:
        order, _ = shuffle.shuffled_order(count, SEED)
    seconds = time.perf_counter() - start
    peak = _status_mb("VmHWM")
    return {
        "kind": kind,
        "seconds": seconds,
        "peak_rss_mb": peak,
        "scratch_mb": peak - before - order.nbytes / 2**20,
        "output_mb": order.nbytes / 2**20,
        "dtype": str(order.dtype),
        "backend": _kernels.backend("shuffle") if kind != "numpy-permutation" else "-",
        "head": order[:3].tolist(),
    }


def measure(kind: str, count: int) -> dict[str, Any]:
    """Run `worker` in a subprocess and return its result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--count", str(count)]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def verify() -> None:
    """Before timing: both streambatch backends equal the spec loop (tests/spec.py) on a small count."""
    import numpy as np

    import streambatch.order.shuffle as shuffle
    from streambatch import _kernels

    sys.path.insert(0, str(ROOT))
    from tests import spec

    expected = spec.fisher_yates(5000, SEED)
    for backend in dict.fromkeys([_kernels.backend("shuffle"), "python"]):
        with _kernels.use("shuffle", backend):
            order, state = shuffle.shuffled_order(5000, SEED)
        assert expected == (order.tolist(), state), f"backend {backend} differs from tests/spec.py"
        assert np.uint32 == order.dtype


def machine_note() -> str:
    """CPU model, cores, memory, load, Python, numpy and the shuffle backend."""
    import numpy as np

    from streambatch import _kernels

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text().split() if Path("/proc/meminfo").exists() else ["", "0"]
    load = "/".join(f"{value:.2f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{model}, {os.cpu_count()} cores, {int(meminfo[1]) / 2**20:.0f} GiB RAM, load {load}; "
        f"Python {platform.python_version()}, numpy {np.__version__}, streambatch backend {_kernels.backend('shuffle')!r}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=lambda text: int(float(text)), default=10**8, help="items to shuffle (default 1e8)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per contender (default 3)")
    parser.add_argument("--big", action="store_true", help="10**9 items, one repeat (unless --repeats/--count say otherwise)")
    parser.add_argument("--no-numpy", action="store_true", help="skip numpy's permutation (8 bytes per item)")
    parser.add_argument("--fallback", action="store_true", help="also time streambatch's numpy backend (slow)")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--worker", choices=sorted(KINDS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.count)))
        return 0
    if args.big:
        given = argv if argv is not None else sys.argv[1:]
        args.count = args.count if "--count" in given else 10**9
        args.repeats = args.repeats if "--repeats" in given else 1
    kinds = ["streambatch", *([] if args.no_numpy else ["numpy-permutation"]), *(["streambatch-numpy"] if args.fallback else [])]

    verify()
    print(machine_note())
    print(f"count={args.count:,}  repeats={args.repeats}  seed={SEED}  (each measurement in its own subprocess)")
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        for kind in kinds if repeat % 2 == 0 else kinds[::-1]:  # interleaved, alternating who goes first
            result = measure(kind, args.count)
            runs[kind].append(result)
            print(
                f"  repeat {repeat + 1}: {kind:<18} {result['seconds']:8.3f} s  peak RSS {result['peak_rss_mb']:8.0f} MB"
                f"  scratch {result['scratch_mb']:7.0f} MB",
                flush=True,
            )

    reference = statistics.median(r["seconds"] for r in runs["numpy-permutation"]) if "numpy-permutation" in runs else None
    print(f"\n{'contender':<18} {'median s':>9} {'min s':>8} {'ratio':>7} {'peak RSS MB':>12} {'scratch MB':>11}  dtype   what")
    for kind in kinds:
        seconds = [r["seconds"] for r in runs[kind]]
        median = statistics.median(seconds)
        ratio = f"{median / reference:7.3f}" if reference else f"{'-':>7}"
        peak = max(r["peak_rss_mb"] for r in runs[kind])
        scratch = max(r["scratch_mb"] for r in runs[kind])
        dtype = runs[kind][0]["dtype"]
        print(f"{kind:<18} {median:9.3f} {min(seconds):8.3f} {ratio} {peak:12.0f} {scratch:11.0f}  {dtype:<7} {KINDS[kind]}")
    if reference:
        print("ratio: median seconds / numpy permutation's median seconds (lower is faster)")
    if args.json:
        args.json.write_text(json.dumps({"count": args.count, "machine": machine_note(), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
