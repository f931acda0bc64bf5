#!/usr/bin/env python3
"""Resuming costs the same at any position: batch 0 vs near the end of a 10^7-window epoch.

    python scripts/bench_resume.py                    # 10,000,000 windows, 5 interleaved repeats
    python scripts/bench_resume.py --windows 1e6 --repeats 5
    python scripts/bench_resume.py --loader           # also sbt.RankLoader through torch.distributed.checkpoint

One in-memory corpus (uint16 tokens, documents of 1,000 windows each at T = 128,
stride 1), B = 32.  Each measurement builds a fresh `Run`, loads a saved state
for epoch 3 at batch 0, or at the last batch of the epoch, and takes the next
batch: ``load`` is `Run.load_state_dict` alone (checks, corpus fingerprint),
``first batch`` adds the epoch's shuffle plan (computed once, whatever the
position) and one gather.  For comparison, a loader that replays to find its
place would gather every batch before the position: its cost is extrapolated
from the measured rate over the first 2,000 batches.

``--loader``: a `streambatch.torch.RankLoader` (rank 0 of 2, 2 worker threads,
accumulation 2) saved with ``dcp.save`` at 90% of the epoch and resumed in a
fresh run with ``dcp.load`` under another setting (rank 0 of 3, no workers,
accumulation 1): ``first batch`` is the fresh run, the DCP load and the first
micro-batch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time

import numpy as np

import streambatch as sb

T, B, PER_DOCUMENT, SEED, EPOCH = 128, 32, 1000, 7, 3


def corpus(windows: int) -> sb.DocumentStore:
    """Documents of ``PER_DOCUMENT`` windows each (the last one shorter), random uint16 tokens."""
    documents = -(-windows // PER_DOCUMENT)
    lengths = np.full(documents, PER_DOCUMENT + T, dtype=np.int64)
    lengths[-1] = windows - (documents - 1) * PER_DOCUMENT + T
    tokens = np.random.default_rng(0).integers(0, 50_257, int(lengths.sum()), dtype=np.uint16)
    return sb.DocumentStore.from_arrays(tokens, np.concatenate([[0], np.cumsum(lengths)]))


def resume(store: sb.DocumentStore, state: dict[str, object]) -> tuple[float, float, sb.MiniBatch]:
    """Seconds to load *state* into a fresh run, and to its first batch; the batch."""
    start = time.perf_counter()
    run = sb.Run(store, context_length=T, batch_size=B, seed=SEED)
    run.load_state_dict(json.loads(json.dumps(state)))
    loaded = time.perf_counter()
    batch = next(iter(run))
    return loaded - start, time.perf_counter() - start, batch


def loader_resume(store: sb.DocumentStore, folder: str, at: int, repeats: int) -> list[float]:
    """Seconds from a fresh run to the first micro-batch of a RankLoader loaded with DCP at step *at*."""
    import warnings

    import torch.distributed.checkpoint as dcp

    import streambatch.torch as sbt

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    run = sb.Run(store, context_length=T, batch_size=B, seed=SEED)
    saved = sbt.RankLoader(run, rank=0, world_size=2, num_workers=2, accumulation=2)
    saved.load_state_dict(run.state_dict(run.position_of(at)))
    dcp.save({"loader": saved}, checkpoint_id=folder)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loader = sbt.RankLoader(sb.Run(store, context_length=T, batch_size=B, seed=SEED), rank=0, world_size=3)
        dcp.load({"loader": loader}, checkpoint_id=folder)
        batch = next(iter(loader))
        times.append(time.perf_counter() - start)
        assert (batch.epoch, batch.index) == run.position_of(at)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--windows", type=float, default=1e7, help="windows per epoch (default 1e7)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per position (default 5)")
    parser.add_argument("--loader", action="store_true", help="also time sbt.RankLoader resumed through DCP at 90%%")
    args = parser.parse_args()
    store = corpus(int(args.windows))
    run = sb.Run(store, context_length=T, batch_size=B, seed=SEED)
    last = run.batches_per_epoch - 1
    print(f"{run.window_count:,} windows, {run.batches_per_epoch:,} batches per epoch (T={T}, B={B}), epoch {EPOCH}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")

    states = {}
    for index in (0, last):
        run.set_position(EPOCH, index)
        states[index] = run.state_dict()
    times: dict[int, list[tuple[float, float]]] = {0: [], last: []}
    for repeat in range(args.repeats):
        for index in (0, last) if repeat % 2 == 0 else (last, 0):  # interleaved, alternating: drift hits both alike
            loaded, first, batch = resume(store, states[index])
            assert (EPOCH, index) == (batch.epoch, batch.index)
            times[index].append((loaded, first))

    sample = 2000
    replayed = run.epoch(EPOCH)
    replayed.shuffle_state_after  # noqa: B018 - plan first: time the replay alone
    started = time.perf_counter()
    for _ in itertools.islice(replayed, sample):
        pass
    per_batch = (time.perf_counter() - started) / sample

    print(f"{'position':>22} | {'load s':>7} | {'first batch s: min':>18} | {'median':>6} | all")
    for index in (0, last):
        loads = statistics.median(t[0] for t in times[index])
        firsts = [t[1] for t in times[index]]
        shown = ", ".join(f"{t:.2f}" for t in firsts)
        position = f"epoch {EPOCH}, batch {index:,}"
        print(f"{position:>22} | {loads:>7.3f} | {min(firsts):>18.3f} | {statistics.median(firsts):>6.3f} | {shown}")
    ratios = [min(t[1] for t in times[last]) / min(t[1] for t in times[0])]
    ratios.append(statistics.median(t[1] for t in times[last]) / statistics.median(t[1] for t in times[0]))
    print(f"near the end / at the start: {ratios[0]:.2f}x (min), {ratios[1]:.2f}x (median)")
    print(f"replaying to batch {last:,} instead: ~{per_batch * last:.1f} s ({per_batch * 1e6:.0f} us per batch over {sample:,})")
    if args.loader:
        import tempfile

        at = run.step_of(EPOCH, int(run.batches_per_epoch * 0.9))
        with tempfile.TemporaryDirectory() as folder:
            firsts = loader_resume(store, folder, at, args.repeats)
        shown = ", ".join(f"{t:.2f}" for t in firsts)
        print(f"RankLoader via DCP at 90% (2 ranks, 2 workers, acc 2 -> 3 ranks, 0, 1): first micro-batch "
              f"{min(firsts):.3f} s min, {statistics.median(firsts):.3f} s median | {shown}")  # fmt: skip


if __name__ == "__main__":
    main()
