#!/usr/bin/env python3
"""Audit a shuffled epoch of 10**8 windows from a memory-mapped store: time and peak memory.

    python scripts/bench_audit.py                      # 10**8 windows, T=8, stride 1, B=1024, seed 7
    python scripts/bench_audit.py --windows 1e7 --batch-size 4096

Builds a synthetic uint16 store in a temporary directory (lognormal document
lengths, trimmed so the epoch has exactly --windows windows: ~200 MB of tokens
at 10**8), then in a fresh process opens it memory-mapped and runs
`streambatch.tools.audit.audit_epoch` (primary pass with every check, a replay that
re-plans the shuffle, the other seed's order and membership, the direct token
mean), reporting wall time, windows/s and peak RSS (VmHWM, which includes the
store's page-cache pages the process touched).  The store is deleted at the end.
Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} is not reported on this system")


def build(path: Path, windows: int, T: int) -> dict[str, float]:
    from streambatch.io.store import StoreWriter

    rng = np.random.default_rng(0)
    started, made, index, tokens = time.perf_counter(), 0, 0, 0
    with StoreWriter(path, dtype=np.uint16) as writer:
        while made < windows:
            lengths = np.clip(rng.lognormal(np.log(4000), 1.0, 10_000), 1, 200_000).astype(np.int64)
            counts = np.maximum(0, lengths - T)  # stride 1: L - T windows per document
            reach = made + np.cumsum(counts)
            if reach[-1] >= windows:  # trim the last document so the epoch has exactly `windows`
                last = int(np.searchsorted(reach, windows))
                lengths = lengths[: last + 1].copy()
                lengths[last] -= int(reach[last]) - windows
                counts = np.maximum(0, lengths - T)
            block = rng.integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
            writer.add_block(block, lengths, [f"doc-{i}" for i in range(index, index + lengths.size)], "train")
            made += int(counts.sum())
            index += lengths.size
            tokens += block.size
        writer.commit()
    return {"documents": index, "tokens": tokens, "build_s": time.perf_counter() - started}


def child(path: str, T: int, B: int, seed: int) -> None:
    from streambatch.epoch import Epoch
    from streambatch.io.store import open_store
    from streambatch.tools.audit import audit_epoch

    store = open_store(path, verify=False)
    epoch = Epoch(store, context_length=T, batch_size=B, seed=seed)
    started = time.perf_counter()
    result = audit_epoch(epoch, progress=None)
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "proof": result.proof_line(),
                "ok": result.ok,
                "windows": result.expected_windows,
                "batches": result.batches,
                "seconds": seconds,
                "windows_per_s": result.expected_windows / seconds,
                "vm_hwm_mb": status_mb("VmHWM"),
                "rss_anon_end_mb": status_mb("RssAnon"),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=float, default=1e8)
    parser.add_argument("--context-length", "-T", type=int, default=8)
    parser.add_argument("--batch-size", "-B", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.context_length, args.batch_size, args.seed)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    try:
        built = build(root / "store", int(args.windows), args.context_length)
        print(f"built {built['documents']} documents, {built['tokens']} tokens in {built['build_s']:.0f} s", file=sys.stderr)
        command = [sys.executable, __file__, "--child", str(root / "store"), "-T", str(args.context_length)]
        command += ["-B", str(args.batch_size), "--seed", str(args.seed)]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        report = {**built, **json.loads(done.stdout.splitlines()[-1])}
        report.update(context_length=args.context_length, batch_size=args.batch_size, seed=args.seed)
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
