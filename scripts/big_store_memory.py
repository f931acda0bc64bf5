#!/usr/bin/env python3
"""Show that iterating an epoch over a memory-mapped store keeps anonymous memory flat.

    python scripts/big_store_memory.py                     # builds a 2.1e9-token store once (~4 GB)
    python scripts/big_store_memory.py --tokens 2.1e9 --path bench-cache/big

Builds (once) a synthetic store of at least 2 billion uint16 tokens, then, in a
fresh process, opens it memory-mapped, plans a shuffled epoch and iterates every
batch, sampling RssAnon (anonymous memory: what the process allocated, as
opposed to page-cache file pages) from /proc/self/status.  Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import streambatch as sb
from streambatch.io.store import StoreWriter, open_store


def rss_anon_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("RssAnon is not reported on this system")


def build(path: Path, total: int) -> None:
    rng = np.random.default_rng(0)
    started, written, index = time.perf_counter(), 0, 0
    with StoreWriter(path, dtype=np.uint16) as writer:
        while written < total:
            lengths = np.clip(rng.lognormal(np.log(1500), 1.0, 20_000), 1, 50_000).astype(np.int64)
            tokens = rng.integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
            writer.add_block(tokens, lengths, [str(i) for i in range(index, index + lengths.size)], "train")
            written += tokens.size
            index += lengths.size
            print(f"\rwrote {written / 1e9:.2f}e9 tokens", end="", file=sys.stderr)
        writer.commit()
    print(f"\nbuilt {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def measure(path: Path, T: int, B: int) -> dict[str, float]:
    baseline = rss_anon_mb()
    store = open_store(path, verify=False)
    opened = rss_anon_mb()
    epoch = sb.Epoch(store, context_length=T, stride=T, batch_size=B, seed=7)
    epoch.shuffle_state_after  # noqa: B018 - plan now
    planned = rss_anon_mb()
    peak, tokens, started = planned, 0, time.perf_counter()
    for i, batch in enumerate(epoch):
        tokens += batch.token_count
        if i % 256 == 0:
            peak = max(peak, rss_anon_mb())
    seconds = time.perf_counter() - started
    batch_mb = 2 * B * T * store.tokens.dtype.itemsize / 2**20
    return {
        "tokens": float(store.tokens.size),
        "documents": float(len(store)),
        "windows": float(epoch.window_count),
        "plan_mb": epoch.plan_nbytes / 2**20,
        "per_document_mb": (opened - baseline),
        "rss_anon_after_plan_mb": planned,
        "rss_anon_peak_mb": peak,
        "growth_while_iterating_mb": peak - planned,
        "batch_mb": batch_mb,
        "target_tokens_per_s": tokens / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=2.1e9)
    parser.add_argument("--path", default="bench-cache/big")
    parser.add_argument("-T", type=int, default=1024)
    parser.add_argument("-B", type=int, default=32)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    path = Path(args.path)
    if args.measure:
        print(json.dumps(measure(path, args.T, args.B)))
        return
    if not (path / "header.json").exists():
        build(path, int(args.tokens))
    done = subprocess.run(
        [sys.executable, __file__, "--measure", "--path", str(path), "-T", str(args.T), "-B", str(args.B)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout)
    print(json.dumps(result, indent=1))
    print(
        f"{result['tokens'] / 1e9:.2f}e9 tokens, {result['windows']:,.0f} windows: plan {result['plan_mb']:.1f} MB, "
        f"RssAnon {result['rss_anon_after_plan_mb']:.0f} MB after planning, peak {result['rss_anon_peak_mb']:.0f} MB while "
        f"iterating every batch (+{result['growth_while_iterating_mb']:.1f} MB; one batch is {result['batch_mb']:.2f} MB)"
    )


if __name__ == "__main__":
    main()
