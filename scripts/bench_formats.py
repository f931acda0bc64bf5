#!/usr/bin/env python3
"""Time opening a Megatron index of 10^8 sequences (memory-mapped), and its first use.

    python scripts/bench_formats.py                      # 10^8 sequences: a 2 GB .idx + a sparse .bin in /tmp
    python scripts/bench_formats.py --sequences 1e6 --keep

1. Writes (once, unless present) ``PREFIX.idx`` for ``--sequences`` one-token
   documents, as IndexedDatasetBuilder would (uint16; lengths 1, pointers 0, 2,
   4, ..., document indices 0..N), and ``PREFIX.bin`` as a sparse file of the
   right size (no disk used for its zeros).  Checks the free space first.
2. In fresh processes (``--repeats``, streambatch imported before the clock
   starts): ``sb.open_source(PREFIX)`` -- what every command does with a
   SOURCE -- then, unless ``--open-only``, the first use of the documents
   (``store.lengths``: the three arrays checked and the per-document arrays made)
   and one document's tokens.
3. Prints the times (best and median) and each process's peak RSS.

Deletes what it wrote unless ``--keep``.  Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

import numpy as np

_BLOCK = 1 << 24

_CHILD = r"""
import json, resource, sys, time
import streambatch as sb
prefix, open_only = sys.argv[1], sys.argv[2] == "1"
t0 = time.perf_counter()
source = sb.open_source(prefix)
t1 = time.perf_counter()
result = {"open_s": t1 - t0, "documents": len(source.store)}
if not open_only:
    lengths = source.store.lengths
    t2 = time.perf_counter()
    tokens = source.store.document(len(lengths) // 2).tokens
    t3 = time.perf_counter()
    result.update(first_use_s=t2 - t1, document_s=t3 - t2, tokens=int(lengths.sum()))
result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def write_index(prefix: str, sequences: int) -> None:
    """PREFIX.idx of *sequences* one-token sequences, one per document (uint16), and a sparse PREFIX.bin."""
    with open(prefix + ".idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, sequences, sequences + 1))
        for lo in range(0, sequences, _BLOCK):
            out.write(np.ones(min(_BLOCK, sequences - lo), dtype="<i4").tobytes())
        for lo in range(0, sequences, _BLOCK):
            out.write((np.arange(lo, min(lo + _BLOCK, sequences), dtype="<i8") * 2).tobytes())
        for lo in range(0, sequences + 1, _BLOCK):
            out.write(np.arange(lo, min(lo + _BLOCK, sequences + 1), dtype="<i8").tobytes())
    with open(prefix + ".bin", "wb") as out:
        out.truncate(2 * sequences)  # sparse: every token 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=float, default=1e8)
    parser.add_argument("--dir", default=None, help="where to write (default: a new folder in the temp directory)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--open-only", action="store_true", help="time the open only (no first use)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    sequences = int(args.sequences)
    folder = args.dir or tempfile.mkdtemp(prefix="bench-formats-")
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, f"megatron-{sequences}")
    size = 34 + 12 * sequences + 8 * (sequences + 1)
    free = shutil.disk_usage(folder).free
    if not os.path.exists(prefix + ".idx"):
        if free < 2 * size:
            print(f"needs {size / 1e9:.1f} GB in {folder} and only {free / 1e9:.1f} GB is free", file=sys.stderr)
            return 2
        write_index(prefix, sequences)
    runs = []
    for _ in range(args.repeats):
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, prefix, "1" if args.open_only else "0"], capture_output=True, text=True, check=True
        )
        runs.append(json.loads(child.stdout))
    print(f"Megatron index: {sequences:,} sequences, .idx {size / 1e9:.2f} GB, {args.repeats} fresh processes")
    for key in ("open_s", "first_use_s", "document_s"):
        if key in runs[0]:
            values = [r[key] * 1000 for r in runs]
            print(f"  {key[:-2]:10s} best {min(values):9.2f} ms   median {statistics.median(values):9.2f} ms")
    print(f"  peak RSS   {max(r['peak_rss_mb'] for r in runs):.0f} MB")
    if not args.keep:
        for suffix in (".idx", ".bin"):
            os.unlink(prefix + suffix)
        if args.dir is None:
            os.rmdir(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
