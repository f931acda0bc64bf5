#!/usr/bin/env python3
"""Audit a packed epoch of the `scripts/bench.py` corpus: time, peak memory, and the packed PROOF line.

    python scripts/bench_audit_pack.py                         # 49 M tokens, T=2048, B=64, seed 7
    python scripts/bench_audit_pack.py --tokens 5e6 -T 1024 --workers 2 --world-size 2

Builds the bench corpus (lognormal lengths, median ~1,500 tokens) as a uint16
store in a temporary directory, then in a fresh process runs ``streambatch audit
--pack`` on it (every packed check of `streambatch.tools.audit`: tiling of every
target, segment and position ids, padding, content against the store, replay and
the other seed from row chunks, the stand-in token mean), and reports wall
time, targets/s and peak RSS (VmHWM).  The store is deleted at the end.  Not run in CI.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=float, default=49e6, help="corpus size in tokens (bench.py uses ~49 M)")
    parser.add_argument("--context-length", "-T", type=int, default=2048)
    parser.add_argument("--batch-size", "-B", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "corpus"
        started = time.perf_counter()
        build = (
            f"import sys, pathlib; sys.path.insert(0, {str(HERE)!r}); from bench import build_corpus; "
            f"build_corpus(pathlib.Path({str(store)!r}), {int(args.tokens)})"
        )
        subprocess.run([sys.executable, "-c", build], check=True)
        print(f"built {int(args.tokens):,}-token store in {time.perf_counter() - started:.1f} s")
        audit = [
            sys.executable,
            "-c",
            "import sys, streambatch.cli as c; status = c.main(sys.argv[1:]); "
            "print('VmHWM', [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]); sys.exit(status)",
            "audit", str(store), "-T", str(args.context_length), "-B", str(args.batch_size), "--seed", str(args.seed),
            "--pack", "--workers", str(args.workers), "--world-size", str(args.world_size), "--no-verify",
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(audit, capture_output=True, text=True)
        wall = time.perf_counter() - started
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        peak = re.search(r"VmHWM (\d+)", done.stdout)
        rss = int(peak.group(1)) / 1024 if peak else float("nan")
        print(f"audit --pack: {wall:.1f} s wall (process included), peak RSS {rss:.0f} MB")
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
