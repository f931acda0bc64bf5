#!/usr/bin/env python3
"""Two processes iterate one memory-mapped 10^8-window plan: neither holds private per-window memory.

    python scripts/bench_plan_rss.py                          # 10^8 windows (200 MB store, 400 MB plan)
    python scripts/bench_plan_rss.py --windows 1e7 --keep     # smaller; keep the files for a rerun

Builds (once) a store whose windows at T=1, stride 1 number ``--windows``
(100 documents), plans its shuffled epoch once into a plan file with
``streambatch plan`` (in its own process: the planner's peak is reported
separately), then starts two processes together.  Each opens the store and
builds ``Epoch(store, ..., plan_dir=DIR)``, samples RssAnon (anonymous memory:
what the process itself allocated; file pages of the store and the plan are
RssFile, shared through the page cache) before the plan is mapped, after, and
while iterating every batch of the epoch, then does the same for the
sequential epoch (no plan at all) as the reference.  Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
from streambatch.io.store import StoreWriter, open_store

DOCUMENTS = 100
SEED = 7


def memory() -> dict[str, float]:
    """RssAnon, RssFile and VmHWM of this process, in MB."""
    found: dict[str, float] = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("RssAnon", "RssFile", "VmHWM"):
                found[name] = int(rest.split()[0]) / 1024
    return found


def build(path: Path, windows: int) -> None:
    """*windows* windows at T=1 stride 1: DOCUMENTS documents of windows/DOCUMENTS + 1 tokens (uint16)."""
    per_document = windows // DOCUMENTS + 1
    rng = np.random.default_rng(0)
    with StoreWriter(path, dtype=np.uint16) as writer:
        for k in range(DOCUMENTS):
            tokens = rng.integers(0, 50_257, per_document, dtype=np.uint16)
            writer.add(f"doc-{k}", "train", tokens)
        writer.commit()


def iterate(epoch: sb.Epoch, every: int = 64) -> dict[str, float]:
    """Iterate every batch; sample RssAnon every *every* batches."""
    peak, started, rows = memory()["RssAnon"], time.perf_counter(), 0
    for i, batch in enumerate(epoch):
        rows += batch.width
        if i % every == 0:
            peak = max(peak, memory()["RssAnon"])
    peak = max(peak, memory()["RssAnon"])
    return {"peak_rss_anon_mb": peak, "seconds": time.perf_counter() - started, "rows": float(rows)}


def reader(store_path: Path, plans: Path, batch_size: int) -> dict[str, Any]:
    """One rank: open the store, map the plan, iterate every batch; then the sequential epoch as reference."""
    store = open_store(store_path, verify=False)
    epoch = sb.Epoch(store, context_length=1, batch_size=batch_size, seed=SEED, plan_dir=plans)
    before = memory()
    started = time.perf_counter()
    epoch.order  # noqa: B018 - maps the plan file (computed by `streambatch plan` beforehand)
    opened = memory()
    result: dict[str, Any] = {
        "windows": epoch.window_count,
        "plan_mb": epoch.plan_nbytes / 2**20,
        "plan_file": epoch.order.plan_path,
        "open_plan_s": time.perf_counter() - started,
        "rss_anon_before_plan_mb": before["RssAnon"],
        "rss_anon_after_open_mb": opened["RssAnon"],
        "planned": iterate(epoch),
        "rss_file_after_iterating_mb": memory()["RssFile"],
    }
    del epoch
    sequential = sb.Epoch(store, context_length=1, batch_size=batch_size, seed=None)
    result["rss_anon_before_sequential_mb"] = memory()["RssAnon"]
    result["sequential"] = iterate(sequential)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=float, default=1e8)
    parser.add_argument("--path", default="/tmp/streambatch-plan-rss", help="folder for the store and the plan")
    parser.add_argument("-B", type=int, default=1024, help="batch size")
    parser.add_argument("--keep", action="store_true", help="keep the store and the plan (default: delete them)")
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(args.path)
    store, plans = root / "store", root / "plans"
    if args.reader:
        print(json.dumps(reader(store, plans, args.B)))
        return
    windows = int(args.windows)
    try:
        if not (store / "header.json").exists():
            started = time.perf_counter()
            build(store, windows)
            print(f"built {store} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        planner = (
            "import json, sys, time, streambatch.cli as cli\n"
            "t = time.perf_counter(); status = cli.main(sys.argv[1:]); t = time.perf_counter() - t\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
            "print(json.dumps({'status': status, 'seconds': t, 'peak_rss_mb': int(hwm) / 1024}), file=sys.stderr)\n"
        )
        argv = ["plan", str(store), "-T", "1", "-B", str(args.B), "--seed", str(SEED), "-o", str(plans)]
        done = subprocess.run([sys.executable, "-c", planner, *argv], capture_output=True, text=True, check=True)
        plan = json.loads(done.stdout)
        planner_stats = json.loads(done.stderr.strip().splitlines()[-1])
        print(
            f"plan: {plan['windows']:,} windows, {plan['bytes'] / 2**20:.0f} MB, "
            f"{'computed' if plan['created'] else 'found'} in {planner_stats['seconds']:.1f} s "
            f"(planner peak RSS {planner_stats['peak_rss_mb']:.0f} MB), {plan['plan']}"
        )
        command = [sys.executable, __file__, "--reader", "--path", str(root), "-B", str(args.B)]
        readers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]  # start together
        results = [json.loads(r.communicate()[0]) for r in readers]
        if any(r.returncode for r in readers):
            raise SystemExit("a reader failed")
        for rank, r in enumerate(results):
            planned, sequential = r["planned"], r["sequential"]
            print(
                f"reader {rank}: RssAnon {r['rss_anon_before_plan_mb']:.1f} MB before mapping the plan, "
                f"{r['rss_anon_after_open_mb']:.1f} MB after (opened in {r['open_plan_s'] * 1e3:.1f} ms), "
                f"peak {planned['peak_rss_anon_mb']:.1f} MB while iterating {planned['rows']:,.0f} windows "
                f"in {planned['seconds']:.1f} s (+{planned['peak_rss_anon_mb'] - r['rss_anon_before_plan_mb']:.1f} MB; "
                f"RssFile {r['rss_file_after_iterating_mb']:.0f} MB of shared file pages); "
                f"sequential epoch: peak {sequential['peak_rss_anon_mb']:.1f} MB "
                f"(+{sequential['peak_rss_anon_mb'] - r['rss_anon_before_sequential_mb']:.1f} MB)"
            )
        print(json.dumps({"plan": plan, "planner": planner_stats, "readers": results}, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
