#!/usr/bin/env python3
"""Time to first batch of a 10^9-window epoch whose plan file exists; then a corpus beyond 2**32 tokens.

    python scripts/bench_first_batch.py                       # 10^9 windows: 2 GB store + 4 GB plan in /tmp
    python scripts/bench_first_batch.py --windows 1e7 --keep  # smaller; keep the files
    python scripts/bench_first_batch.py --stand-in            # time opening only, with a stand-in plan (see below)

1. Builds (once) a store of 1,000 documents whose windows at T=1, stride 1 number
   ``--windows`` (10^9 + 1,000 uint16 tokens by default).
2. Plans its shuffled epoch (seed 7) into a plan file.  With a bounded-memory
   shuffle (``shuffled_order(..., out=)``, the C extension) this is the real
   ``streambatch plan``.  Without one (the numpy shuffle needs ~25 bytes per
   window: 25 GB here), or with ``--stand-in``, the plan file is written by the
   library's own writer (same header, key, atomic rename) but filled with a
   stand-in permutation (window ``i`` -> ``(a*i + c) mod n``, a valid order but NOT
   the chapter's seed-7 order; its state_after is a placeholder).  That is enough
   to time opening; the output says which one was used.
3. In fresh processes (``--repeats``): ``open_store`` (verify=False) ->
   ``Epoch(..., plan_dir=)`` -> map the plan -> first batch; times each step and
   RssAnon/RssFile after the first batch (the plan is mapped, not read).
4. A corpus of 2**32+ tokens: shards that hard-link the store's token file (no
   extra disk) under other document ids; T=1023, stride 1024; its plan (real
   shuffle, 4-byte window numbers) in a plan file; rows from shards beyond
   position 2**32 checked token by token against the shard files.

Deletes everything it wrote unless ``--keep``.  Not run in CI.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
import streambatch.order.plan as planning
from streambatch.io.store import HEADER, StoreWriter, fingerprint_files, open_store
from streambatch.order.shuffle import shuffled_order
from streambatch.order.splitmix import state_after

DOCUMENTS = 1000
SEED = 7


def status() -> dict[str, float]:
    with open("/proc/self/status") as handle:
        return {
            k: int(v.split()[0]) / 1024 for k, _, v in (line.partition(":") for line in handle) if k in ("RssAnon", "RssFile")
        }


def build(path: Path, windows: int) -> None:
    per_document = windows // DOCUMENTS + 1
    rng = np.random.default_rng(0)
    with StoreWriter(path, dtype=np.uint16) as writer:
        for k in range(DOCUMENTS):
            writer.add(f"doc-{k}", "train", rng.integers(0, 50_257, per_document, dtype=np.uint16))
        writer.commit()


def bounded_shuffle() -> bool:
    return "out" in inspect.signature(shuffled_order).parameters


def stand_in_plan(store: Path, plans: Path, batch_size: int) -> dict[str, Any]:
    """Write the plan file through the library's writer, permuted by an affine stand-in (timing only)."""
    windows = sb.windows(open_store(store, verify=False), context_length=1)
    count = len(windows)
    a = int(count * 0.6180339887) | 1
    while math.gcd(a, count) != 1:
        a += 2
    c = SEED % count

    def affine(values: np.ndarray, seed: int) -> int:  # overwrites every entry: no read of the old order
        for lo in range(0, values.size, 1 << 22):
            hi = min(lo + (1 << 22), values.size)
            numbers = (np.arange(lo, hi, dtype=np.int64) * a + c) % count
            values[lo:hi] = windows.window_index.positions(numbers)
        return state_after(seed, max(count - 1, 0))  # placeholder: not the real shuffle's state

    real = planning.permute
    planning.permute = affine  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        order = planning.build_plan(windows, SEED, plans, run={"seed": SEED, "epoch": 0, "stand_in": 1})[0]
        seconds = time.perf_counter() - started
    finally:
        planning.permute = real
    return {"plan": order.plan_path, "windows": count, "bytes": order.plan_nbytes, "seconds": seconds, "stand_in": True}


def real_plan(store: Path, plans: Path, batch_size: int) -> dict[str, Any]:
    argv = ["plan", str(store), "-T", "1", "-B", str(batch_size), "--seed", str(SEED), "-o", str(plans)]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "streambatch", *argv], capture_output=True, text=True, check=True)
    summary: dict[str, Any] = json.loads(done.stdout)
    summary.update(seconds=time.perf_counter() - started, stand_in=False)
    return summary


def first_batch(store_path: str, plans: str, context_length: int, stride: int, batch_size: int) -> dict[str, Any]:
    """One fresh process: open, map, first batch; the times of each step."""
    t0 = time.perf_counter()
    store = sb.open_source(store_path, verify=False).store
    t1 = time.perf_counter()
    epoch = sb.Epoch(store, context_length=context_length, stride=stride, batch_size=batch_size, seed=SEED, plan_dir=plans)
    t2 = time.perf_counter()
    order = epoch.order
    t3 = time.perf_counter()
    mapped = status()
    batch = next(iter(epoch))
    t4 = time.perf_counter()
    memory = status()
    return {
        "open_store_s": t1 - t0,
        "epoch_s": t2 - t1,
        "map_plan_s": t3 - t2,
        "first_batch_s": t4 - t3,
        "total_s": t4 - t0,
        "rss_anon_mb": memory["RssAnon"],
        "rss_file_after_map_mb": mapped["RssFile"],
        "rss_file_mb": memory["RssFile"],
        "windows": epoch.window_count,
        "plan_dtype": str(order.plan.dtype) if order.plan is not None else None,
        "plan_mb": epoch.plan_nbytes / 2**20,
        "plan_holds_positions": order.space.plan_holds_positions,
        "shape": list(batch.shape),
    }


def verify_once(store_path: str, plans: str) -> dict[str, Any]:
    """One fresh process: open the plan with verify=True (one read: digest, every entry, no window twice)."""
    store = sb.open_source(store_path, verify=False).store
    windows = sb.windows(store, context_length=1)
    started = time.perf_counter()
    planning.plan_file(windows, SEED, plans, verify=True)
    return {"verify_s": time.perf_counter() - started, "windows": len(windows)}


def timed_runs(source: Path, plans: Path, T: int, stride: int, B: int, repeats: int) -> list[dict[str, Any]]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_first_batch as b; "
        "print(json.dumps(b.first_batch(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))))"
    )
    runs = []
    for _ in range(repeats):
        args = [str(Path(__file__).parent), str(source), str(plans), str(T), str(stride), str(B)]
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout))
    return runs


def report(title: str, runs: list[dict[str, Any]]) -> None:
    med = {
        k: statistics.median(r[k] for r in runs) for k in ("open_store_s", "epoch_s", "map_plan_s", "first_batch_s", "total_s")
    }
    worst = max(r["total_s"] for r in runs)
    last = runs[-1]
    print(
        f"{title}: {last['windows']:,} windows, plan {last['plan_mb']:.0f} MB ({last['plan_dtype']}); time to first batch "
        f"median {med['total_s'] * 1e3:.1f} ms, max {worst * 1e3:.1f} ms over {len(runs)} fresh processes "
        f"(open_store {med['open_store_s'] * 1e3:.1f}, Epoch {med['epoch_s'] * 1e3:.1f}, map plan "
        f"{med['map_plan_s'] * 1e3:.1f}, first batch {last['shape']} {med['first_batch_s'] * 1e3:.1f} ms); "
        f"RssAnon {last['rss_anon_mb']:.0f} MB after it; RssFile {last['rss_file_after_map_mb']:.0f} MB after mapping "
        f"the plan (not read), {last['rss_file_mb']:.0f} MB after the first batch (page-cache pages mapped around "
        "its random rows: shared, not process memory)"
    )


def linked_corpus(store: Path, root: Path) -> Path:
    """Shards that hard-link *store*'s token and offset files under new ids, enough for 2**32+ tokens."""
    header = json.loads((store / HEADER).read_text())
    copies = (1 << 32) // header["token_count"] + 1
    names = []
    for k in range(copies):
        shard = root / f"shard-{k}"
        shard.mkdir(parents=True)
        for name in os.listdir(store):
            if name != HEADER and not name.startswith("ids"):
                os.link(store / name, shard / name)
        ids = [f"s{k}-doc-{i}" for i in range(header["document_count"])]
        codes = np.zeros(len(ids), dtype=np.uint8)
        mine = dict(header, ids=ids, partitions=["train"] * len(ids))
        mine.pop("ids_file", None)
        mine.pop("partitions_file", None)
        tokens_fd, offsets_fd = os.open(shard / "tokens.bin", os.O_RDONLY), os.open(shard / "offsets.bin", os.O_RDONLY)
        try:
            mine["fingerprint"] = fingerprint_files(tokens_fd, offsets_fd, ids, codes)
        finally:
            os.close(tokens_fd)
            os.close(offsets_fd)
        (shard / HEADER).write_text(json.dumps(mine))
        names.append(shard)
    sb.write_corpus(root / "corpus.json", names)
    return root / "corpus.json"


def check_corpus(manifest: Path, plans: Path, T: int, stride: int, B: int, batches: int) -> dict[str, Any]:
    """Rows of shards beyond position 2**32 equal the shard files' tokens."""
    corpus = sb.open_corpus(manifest, verify=False)
    started = time.perf_counter()
    epoch = sb.Epoch(corpus, context_length=T, stride=stride, batch_size=B, seed=SEED, plan_dir=plans)
    epoch.order  # noqa: B018 - computes the plan file (real shuffle)
    planned = time.perf_counter() - started
    checked = beyond = 0
    for batch in epoch.iter_batches(0, batches):
        for row, (doc, start, shard) in enumerate(zip(batch.document_indices, batch.starts, batch.shards, strict=True)):
            _, local = corpus.locate_document(int(doc))
            store = corpus.shards[int(shard)]
            at = int(store.starts[local]) + int(start)
            assert np.array_equal(store.tokens[at : at + T], batch.inputs[row])
            assert np.array_equal(store.tokens[at + 1 : at + T + 1], batch.targets[row])
            checked += 1
            beyond += int(corpus.bases[int(shard)]) + at >= 1 << 32
    return {
        "tokens": corpus.flat_size,
        "shards": len(corpus.shards),
        "windows": epoch.window_count,
        "plan_holds_positions": epoch.order.space.plan_holds_positions,
        "plan_dtype": str(epoch.order.plan.dtype) if epoch.order.plan is not None else None,
        "plan_bytes_per_window": epoch.plan_nbytes / max(epoch.window_count, 1),
        "plan_seconds": planned,
        "rows_checked": checked,
        "rows_beyond_2**32": beyond,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=float, default=1e9)
    parser.add_argument("--path", default="/tmp/streambatch-first-batch")
    parser.add_argument("-B", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stand-in", action="store_true", help="write a stand-in plan even if a bounded shuffle exists")
    parser.add_argument("--no-corpus", action="store_true", help="skip the 2**32+ token corpus check")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    root = Path(args.path)
    store, plans = root / "store", root / "plans"
    try:
        if not (store / HEADER).exists():
            started = time.perf_counter()
            build(store, int(args.windows))
            print(f"built {store} ({int(args.windows):,} windows at T=1) in {time.perf_counter() - started:.0f} s")
        use_stand_in = args.stand_in or not bounded_shuffle()
        plan = (stand_in_plan if use_stand_in else real_plan)(store, plans, args.B)
        print(
            f"plan file: {plan['windows']:,} windows, {plan['bytes'] / 2**20:.0f} MB, written in {plan['seconds']:.0f} s; "
            + (
                "STAND-IN permutation written by the library's plan writer (no bounded shuffle here): "
                "valid order, not seed 7's; timing of opening only"
                if plan["stand_in"]
                else "the real seed-7 plan (`streambatch plan`)"
            )
        )
        report(
            "10^9-window epoch" if int(args.windows) == 10**9 else "epoch", timed_runs(store, plans, 1, 1, args.B, args.repeats)
        )
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_first_batch as b; "
            "print(json.dumps(b.verify_once(sys.argv[2], sys.argv[3])))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).parent), str(store), str(plans)], capture_output=True, text=True
        )
        if done.returncode == 0:
            verified = json.loads(done.stdout)
            print(
                f"verify=True (digest, entries, no window twice; one read): {verified['verify_s']:.1f} s for "
                f"{verified['windows']:,} windows ({verified['windows'] / verified['verify_s'] / 1e6:.0f} M windows/s)"
            )
        else:
            print(f"verify=True refused the plan: {done.stderr.strip().splitlines()[-1]}")
        copies = (1 << 32) // (int(args.windows) + DOCUMENTS) + 1
        if not args.no_corpus and copies > 16:
            print(f"skipping the 2**32+ token corpus: it would need {copies} shards of this store (use --windows 1e9)")
        elif not args.no_corpus:
            manifest = linked_corpus(store, root / "corpus")
            result = check_corpus(manifest, root / "corpus-plans", 1023, 1024, 32, 2000)
            print(
                f"corpus of {result['shards']} hard-linked shards, {result['tokens']:,} tokens (> 2**32): "
                f"{result['windows']:,} windows at T=1023 stride 1024, plan holds positions={result['plan_holds_positions']}, "
                f"{result['plan_dtype']} ({result['plan_bytes_per_window']:.0f} bytes/window), planned in "
                f"{result['plan_seconds']:.1f} s; {result['rows_checked']:,} rows checked token by token, "
                f"{result['rows_beyond_2**32']:,} of them beyond position 2**32"
            )
            report("2**32+ token corpus", timed_runs(manifest, root / "corpus-plans", 1023, 1024, 32, args.repeats))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
