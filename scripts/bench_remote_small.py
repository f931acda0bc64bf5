"""A small store read whole from object storage: a 600 KB store on moto (loopback), T=4, stride 4, B=8, remote (no
cache folder) vs local, in document order and shuffled.  Goal: within 3x of the local time.

    python scripts/bench_remote_small.py [--rounds 3]

Whole checked 64 KiB blocks, each fetched once and kept for the next batch, make an epoch's GETs follow the blocks
it touches (about 10 here), not its 37,000 windows (one GET each before block reads: 44 s in document order).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import streambatch as sb
from streambatch.io.remote.client import STATS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.remote_server import BUCKET, moto_server


def run(store: sb.DocumentStore, seed: int | None) -> float:
    began = time.perf_counter()
    for batch in sb.Epoch(store, context_length=4, stride=4, batch_size=8, seed=seed):
        del batch
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from streambatch.io.remote.upload import upload_store

    rng = np.random.default_rng(1)
    lengths = rng.integers(20, 400, size=1400)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.uint16)
    with tempfile.TemporaryDirectory() as tmp, moto_server():
        local = sb.write_store(Path(tmp) / "small", sb.DocumentStore.from_arrays(tokens, offsets))
        upload_store(Path(tmp) / "small", f"s3://{BUCKET}/small")
        print(f"store: {local.tokens.nbytes / 1e3:.0f} KB, {local.token_count:,} tokens; T=4, stride 4, B=8; moto on loopback")
        from streambatch.io.remote.tokens import remote_file

        opened = sb.open_store(f"s3://{BUCKET}/small")
        file = remote_file(opened.tokens)
        assert file is not None
        floor = []
        for _ in range(args.rounds):  # the floor: one GET of the whole object, what any reader of it must wait for
            began = time.perf_counter()
            file.client.get_range(file.name, 0, file.nbytes, None)
            floor.append(time.perf_counter() - began)
        print(f"one GET of the whole object (the floor): {statistics.median(floor):.3f} s")
        print(f"{'order':<16}{'local s':>9}{'remote s':>10}{'remote/local (goal <= 3)':>26}{'GETs':>6}{'beyond the floor s':>20}")
        for seed in (None, 7):
            found = []
            for _ in range(args.rounds):
                here = run(local, seed)
                gets = STATS.range_requests
                there = run(sb.open_store(f"s3://{BUCKET}/small"), seed)  # a fresh open: nothing kept from before
                found.append((here, there, STATS.range_requests - gets))
            here, there = statistics.median(f[0] for f in found), statistics.median(f[1] for f in found)
            name = "document order" if seed is None else "shuffled"
            beyond = there - statistics.median(floor)
            print(f"{name:<16}{here:>9.3f}{there:>10.3f}{there / here:>26.2f}{found[0][2]:>6}{beyond:>20.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
