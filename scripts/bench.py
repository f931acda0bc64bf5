#!/usr/bin/env python3
"""Side-by-side benchmark: streambatch vs the numpy ideal, the memcpy floor and naive PyTorch.

    python scripts/bench.py                       # ~50M tokens, 5 repeats, all configurations
    python scripts/bench.py --loaders streambatch,streambatch-stages,numpy-ideal   # a subset
    python scripts/bench.py --tokens 5e6 --repeats 3 --json out.json
    python scripts/bench.py --clock cpu --loaders streambatch,streambatch-stages,memcpy-floor   # a loaded machine
    python scripts/bench.py --same-process 11     # Epoch vs the memcpy floor interleaved in one process
    python scripts/bench.py --same-process 11 --loaders streambatch,streambatch-epochdataset,streambatch-rundataset

One synthetic corpus (lognormal document lengths, median ~1,500 tokens, clipped
to [1, 50,000]; ids uniform below 50,257), written once as a streambatch store.
Every measurement runs in its own subprocess, loaders interleaved repeat by repeat,
on the same tokens (loaded into memory;
the "streambatch (mmap)" row reads the memory-mapped store instead, the
"streambatch (corpus)" row the same documents as a corpus of 4 shards), and is first
verified on a small corpus.  Reported: median plan seconds, median emission
target tokens/s, peak RSS, and ratios of medians, plus the shuffle alone (10M windows)
against ``numpy.random.default_rng().permutation``.

The memcpy floor is the physical limit of emission: per batch, in the loop shape
of emission, allocate the batch's two ``(w, T)`` arrays and copy ``w * T``
contiguous tokens into each (inputs, and targets one token on), with no shuffle
and no gather.  ``--clock cpu`` times emission by the process's CPU time
(``time.process_time``) instead of the wall clock: on a machine shared with
other load the wall clock also counts the time other processes held the cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
from streambatch.io.store import StoreWriter, open_store
from streambatch.order.shuffle import shuffled_order

CONFIGS = [(1024, 1024, 32), (128, 64, 64), (2048, 2048, 8)]
LOADERS = [
    "streambatch",
    "streambatch-stages",
    "streambatch-mmap",
    "streambatch-corpus",
    "streambatch-epochdataset",
    "streambatch-rundataset",
    "numpy-ideal",
    "memcpy-floor",
    "torch-naive",
]
VOCAB = 50_257
SEED = 7


# --------------------------------------------------------------------------- corpus
def synthetic_lengths(total_tokens: int, seed: int = 0) -> np.ndarray:
    """Lognormal document lengths (median ~1,500, clipped to [1, 50,000]) summing to about *total_tokens*."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=np.log(1500), sigma=1.0, size=int(total_tokens / 1500 * 1.2) + 10), 1, 50_000)
    lengths = lengths.astype(np.int64)
    keep = int(np.searchsorted(np.cumsum(lengths), total_tokens)) + 1
    return lengths[:keep]


def build_corpus(path: Path, total_tokens: int) -> None:
    """Write the synthetic corpus as a store (deterministic), in bounded blocks."""
    lengths = synthetic_lengths(total_tokens)
    rng = np.random.default_rng(1)
    with StoreWriter(path, dtype=np.uint16) as writer:
        for lo in range(0, lengths.size, 4096):
            block = lengths[lo : lo + 4096]
            tokens = rng.integers(0, VOCAB, int(block.sum()), dtype=np.uint16)
            writer.add_block(tokens, block, [str(i) for i in range(lo, lo + block.size)], "train")
        writer.commit()


def window_starts(offsets: np.ndarray, T: int, stride: int) -> np.ndarray:
    """Flat-token start of every window, document order (used by the numpy ideal)."""
    lengths = np.diff(offsets)
    counts = np.maximum(0, (lengths - (T + 1)) // stride + 1)
    docs = np.flatnonzero(counts)
    first = np.cumsum(counts[docs]) - counts[docs]
    base = np.repeat(offsets[docs] - first * stride, counts[docs])
    return base + np.arange(int(counts.sum()), dtype=np.int64) * stride


# --------------------------------------------------------------------------- loaders
# Each loader: (tokens, offsets, T, stride, B, store_path) -> (plan(), emit(plan) -> iterator of (inputs, targets))
Loader = Callable[..., tuple[Callable[[], Any], Callable[[Any], Iterator[tuple[Any, Any]]]]]


def streambatch_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    source = open_store(store, verify=False) if store is not None else sb.DocumentStore.from_arrays(tokens, offsets)

    def plan() -> sb.Epoch:
        epoch = sb.Epoch(source, context_length=T, stride=stride, batch_size=B, seed=SEED)
        epoch.shuffle_state_after  # noqa: B018 - forces the plan
        return epoch

    def emit(epoch: sb.Epoch) -> Iterator[tuple[Any, Any]]:
        for batch in epoch:
            yield batch.inputs, batch.targets

    return plan, emit


def stages_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    """The public stages chained by hand: windows -> shuffle -> chunk -> materialize."""
    source = sb.DocumentStore.from_arrays(tokens, offsets)

    def plan() -> sb.Chunks:
        return sb.chunk(sb.shuffle(sb.windows(source, context_length=T, stride=stride), SEED), B)

    def emit(chunks: sb.Chunks) -> Iterator[tuple[Any, Any]]:
        for batch in sb.materialize(chunks):
            yield batch.inputs, batch.targets

    return plan, emit


def streambatch_corpus_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    """The same documents as a corpus of 4 in-memory shards (views of the tokens, no copy)."""
    cuts = np.linspace(0, offsets.size - 1, 5).astype(np.int64)
    shards = [
        sb.DocumentStore.from_arrays(
            tokens[offsets[a] : offsets[b]], offsets[a : b + 1] - offsets[a], ids=[str(i) for i in range(a, b)]
        )
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)
    ]
    corpus = sb.open_corpus(shards)

    def plan() -> sb.Epoch:
        epoch = sb.Epoch(corpus, context_length=T, stride=stride, batch_size=B, seed=SEED)
        epoch.shuffle_state_after  # noqa: B018 - forces the plan
        return epoch

    def emit(epoch: sb.Epoch) -> Iterator[tuple[Any, Any]]:
        for batch in epoch:
            yield batch.inputs, batch.targets

    return plan, emit


def dataset_loader(kind: str) -> Loader:
    """``streambatch.torch.EpochDataset`` (*kind* "epoch") or ``RunDataset`` over a one-epoch `Run` ("run"), iterated
    as a DataLoader's worker iterates it (no workers: the dataset itself), tensors zero-copy (``dtype=None``)."""

    def loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
        import streambatch.torch as sbt

        source = sb.DocumentStore.from_arrays(tokens, offsets)

        def plan() -> Any:
            epoch = sb.Epoch(source, context_length=T, stride=stride, batch_size=B, seed=SEED)
            epoch.shuffle_state_after  # noqa: B018 - forces the plan
            if kind == "epoch":
                return sbt.EpochDataset(epoch, dtype=None)
            return sbt.RunDataset(sb.Run.from_epoch(epoch, epochs=1), dtype=None)

        def emit(dataset: Any) -> Iterator[tuple[Any, Any]]:
            for batch in dataset:
                yield batch.inputs, batch.targets

        return plan, emit

    return loader


def numpy_ideal_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    view = np.lib.stride_tricks.sliding_window_view(tokens, T)

    def plan() -> np.ndarray:
        starts = window_starts(offsets, T, stride)
        return starts[np.random.default_rng(SEED).permutation(starts.size)]

    def emit(order: np.ndarray) -> Iterator[tuple[Any, Any]]:
        for lo in range(0, order.size, B):
            idx = order[lo : lo + B]
            yield view[idx], view[idx + 1]

    return plan, emit


def memcpy_floor_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    def plan() -> int:
        return int(window_starts(offsets, T, stride).size)

    def emit(count: int) -> Iterator[tuple[Any, Any]]:
        span = tokens.size - B * T - 1
        for lo in range(0, count, B):
            width = min(B, count - lo)
            start = (lo * T) % span
            inputs = np.empty((width, T), dtype=tokens.dtype)
            targets = np.empty((width, T), dtype=tokens.dtype)
            inputs.reshape(-1)[:] = tokens[start : start + width * T]
            targets.reshape(-1)[:] = tokens[start + 1 : start + 1 + width * T]
            yield inputs, targets

    return plan, emit


def tensor_floor_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    """The memcpy floor with each batch's two arrays wrapped as tensors (``torch.from_numpy``, zero-copy): the
    least a loader that yields tensors pays per batch, the floor of the torch datasets."""
    import torch

    plan, copies = memcpy_floor_loader(tokens, offsets, T, stride, B, store)

    def emit(count: int) -> Iterator[tuple[Any, Any]]:
        wrap = torch.from_numpy
        for inputs, targets in copies(count):
            yield wrap(inputs), wrap(targets)

    return plan, emit


def torch_naive_loader(tokens: np.ndarray, offsets: np.ndarray, T: int, stride: int, B: int, store: Path | None) -> Any:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Windows(Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.starts = window_starts(offsets, T, stride)

        def __len__(self) -> int:
            return int(self.starts.size)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            s = int(self.starts[i])
            window = torch.from_numpy(tokens[s : s + T + 1].astype(np.int64))
            return window[:-1], window[1:]

    def plan() -> Any:
        generator = torch.Generator().manual_seed(SEED)
        return DataLoader(Windows(), batch_size=B, shuffle=True, generator=generator, drop_last=False, num_workers=0)

    def emit(loader: Any) -> Iterator[tuple[Any, Any]]:
        yield from loader

    return plan, emit


REGISTRY: dict[str, Loader] = {
    "streambatch": streambatch_loader,
    "streambatch-stages": stages_loader,
    "streambatch-mmap": streambatch_loader,
    "streambatch-corpus": streambatch_corpus_loader,
    "streambatch-epochdataset": dataset_loader("epoch"),
    "streambatch-rundataset": dataset_loader("run"),
    "numpy-ideal": numpy_ideal_loader,
    "memcpy-floor": memcpy_floor_loader,
    "tensor-floor": tensor_floor_loader,
    "torch-naive": torch_naive_loader,
}


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- verification
def _array(x: Any) -> np.ndarray:
    """A loader's batch array as numpy (the torch loaders give tensors)."""
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def verify_loaders(loaders: list[str]) -> None:
    """Each window exactly once, short final batch kept, shapes, shift by one, on a small corpus."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 60, 40)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, VOCAB, int(offsets[-1]), dtype=np.uint16)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s"
        sb.write_store(store, sb.DocumentStore.from_arrays(tokens, offsets))
        for T, stride, B in [(4, 2, 5), (8, 8, 3), (1, 1, 7)]:
            starts = window_starts(offsets, T, stride)
            expected = collections.Counter(tuple(tokens[s : s + T + 1].tolist()) for s in starts)
            widths = [B] * (starts.size // B) + ([starts.size % B] if starts.size % B else [])
            for name in loaders:
                plan, emit = REGISTRY[name](tokens, offsets, T, stride, B, store if name.endswith("mmap") else None)
                batches = [(_array(x), _array(y)) for x, y in emit(plan())]
                assert widths == [x.shape[0] for x, _ in batches], (name, "widths")
                assert all(x.shape == y.shape == (x.shape[0], T) for x, y in batches), (name, "shapes")
                if name == "memcpy-floor":
                    continue  # copies bytes, not windows
                seen = collections.Counter((*x[r].tolist(), int(y[r, -1])) for x, y in batches for r in range(x.shape[0]))
                assert expected == seen, (name, "each window exactly once")
                assert all(np.array_equal(x[:, 1:], y[:, :-1]) for x, y in batches), (name, "shift by one")


# --------------------------------------------------------------------------- measuring
def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM; unlike ru_maxrss it does not inherit the parent's peak across exec)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    """One measurement: plan once, then emit for at least --min-seconds (whole passes)."""
    store = open_store(args.store, verify=False)
    tokens = np.fromfile(Path(args.store) / "tokens.bin", dtype=store.tokens.dtype)
    offsets = np.concatenate([store.starts, [store.starts[-1] + store.lengths[-1]]])
    name = args.worker
    mmap = Path(args.store) if name.endswith("mmap") else None
    plan_fn, emit_fn = REGISTRY[name](tokens, offsets, args.T, args.stride, args.B, mmap)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    t0 = clock()
    planned = plan_fn()
    t1 = clock()
    count, now = 0, t1
    while now - t1 < args.min_seconds:
        for x, _ in emit_fn(planned):
            count += x.shape[0] * x.shape[1]
            if clock() - t1 > args.max_seconds:
                break
        now = clock()
    print(json.dumps({"plan_s": t1 - t0, "tokens_per_s": count / (now - t1), "peak_rss_mb": peak_rss_mb()}))


def shuffle_worker(args: argparse.Namespace) -> None:
    n = args.windows
    ours, theirs = [], []
    for _ in range(args.repeats):  # interleaved, same process
        t0 = time.perf_counter()
        shuffled_order(n, SEED)
        t1 = time.perf_counter()
        np.random.default_rng().permutation(n)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
    print(json.dumps({"streambatch_s": ours, "numpy_permutation_s": theirs, "peak_rss_mb": peak_rss_mb()}))


def _rate(made: dict[str, Any], planned: dict[str, Any], name: str) -> float:
    """Tokens per CPU second of one whole pass of loader *name*."""
    start, count = time.process_time(), 0
    for x, _ in made[name][1](planned[name]):
        count += x.shape[0] * x.shape[1]
    return count / (time.process_time() - start)


def same_process(store_path: Path, repeats: int, names: list[str]) -> None:
    """`Epoch` (and the other streambatch loaders of *names*) and the memcpy floor in one process, whole passes
    interleaved *repeats* times, timed by the process's CPU time: the median ratio per configuration (fresh
    subprocesses see the host's DRAM bandwidth at different moments; one process sees every loader under the
    same conditions)."""
    store = open_store(store_path, verify=False)
    tokens = np.fromfile(store_path / "tokens.bin", dtype=store.tokens.dtype)
    offsets = np.concatenate([store.starts, [store.starts[-1] + store.lengths[-1]]])
    ours = [n for n in names if n.startswith("streambatch") and not n.endswith(("mmap", "stages"))] or ["streambatch"]
    floors = ["memcpy-floor"] + (["tensor-floor"] if any("dataset" in n for n in ours) else [])
    print(f"\nsame process, CPU time, median of {repeats} interleaved passes: loader / memcpy floor")
    if len(floors) > 1:
        print("(the datasets yield tensors: also / tensor floor, the memcpy floor with both arrays wrapped as tensors)")
    for T, stride, B in CONFIGS:
        made = {name: REGISTRY[name](tokens, offsets, T, stride, B, None) for name in (*ours, *floors)}
        planned = {name: plan() for name, (plan, _) in made.items()}
        ratios: dict[str, list[float]] = {name: [] for name in ours}
        against: dict[str, list[float]] = {name: [] for name in ours}
        floor_ratio: list[float] = []
        for _ in range(repeats):
            rates = {name: _rate(made, planned, name) for name in (*ours, *floors)}
            floor_ratio.append(rates[floors[-1]] / rates["memcpy-floor"])
            for name in ours:
                ratios[name].append(rates[name] / rates["memcpy-floor"])
                if "dataset" in name:
                    against[name].append(rates[name] / rates["tensor-floor"])
        shown = ", ".join(
            f"{name} {statistics.median(r):.2f}x" + (f" ({statistics.median(against[name]):.2f}x)" if against[name] else "")
            for name, r in ratios.items()
        )
        print(f"T={T} stride={stride} B={B}: {shown}")
        if len(floors) > 1:
            print(f"  tensor floor / memcpy floor: {statistics.median(floor_ratio):.2f}x")


def run_worker(extra: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *extra], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker {extra} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens (default 5e7)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved measurements per loader (medians)")
    parser.add_argument("--min-seconds", type=float, default=1.5, help="emit whole passes for at least this long")
    parser.add_argument("--max-seconds", type=float, default=4.0, help="cut a pass short after this long (slow loaders)")
    parser.add_argument("--shuffle-windows", type=int, default=10_000_000)
    parser.add_argument("--cache", default="bench-cache", help="folder for the synthetic store")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--loaders", help=f"comma-separated subset of {','.join(LOADERS)}")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="time plans and emission by (default wall)")
    parser.add_argument(
        "--same-process", type=int, metavar="N", help="only Epoch vs the memcpy floor, N passes interleaved in one process"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shuffle-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--windows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("-T", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, help=argparse.SUPPRESS)
    parser.add_argument("-B", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.shuffle_worker:
        shuffle_worker(args)
        return

    chosen = LOADERS if args.loaders is None else args.loaders.split(",")
    loaders = [name for name in chosen if not (name == "torch-naive" or "dataset" in name) or has_torch()]
    verify_loaders(loaders)
    print(f"verified {', '.join(loaders)} on a small corpus: each window once, final batch kept, shapes, shift by one")
    store = Path(args.cache) / f"corpus-{int(args.tokens)}"
    if not (store / "header.json").exists():
        build_corpus(store, int(args.tokens))
    if args.same_process:
        same_process(store, args.same_process, loaders)
        return
    opened = open_store(store, verify=False)
    print(f"corpus: {len(opened)} documents, {opened.tokens.size} tokens ({opened.tokens.dtype.name}) at {store}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}")

    results: dict[str, Any] = {"tokens": int(opened.tokens.size), "configs": {}}
    shuffle = run_worker(["--shuffle-worker", "--windows", str(args.shuffle_windows), "--repeats", str(args.repeats)])
    ours, theirs = statistics.median(shuffle["streambatch_s"]), statistics.median(shuffle["numpy_permutation_s"])
    results["shuffle"] = shuffle
    print(
        f"\nshuffle of {args.shuffle_windows:,} windows: streambatch {ours:.3f} s, numpy permutation {theirs:.3f} s "
        f"(medians of {args.repeats}); ratio {ours / theirs:.2f}x (target <= 2.5x)"
    )
    print(f"\nemission timed by the {'process CPU time' if args.clock == 'cpu' else 'wall clock'}")
    header = "| config | loader | plan s | emission Mtok/s | peak RSS MB | vs ideal | vs memcpy | vs torch |"
    print("\n" + header + "\n" + "|---" * 8 + "|")
    for T, stride, B in CONFIGS:
        key = f"T={T} stride={stride} B={B}"
        rows: dict[str, dict[str, list[float]]] = {n: {"plan_s": [], "tokens_per_s": [], "peak_rss_mb": []} for n in loaders}
        for _ in range(args.repeats):  # interleaved: machine noise hits every loader alike
            for name in loaders:
                one = run_worker(
                    ["--worker", name, "--store", str(store), "-T", str(T), "--stride", str(stride), "-B", str(B),
                     "--min-seconds", str(args.min_seconds), "--max-seconds", str(args.max_seconds), "--clock", args.clock]
                )  # fmt: skip
                for field, value in one.items():
                    rows[name][field].append(value)
        results["configs"][key] = rows
        rate = {n: statistics.median(r["tokens_per_s"]) for n, r in rows.items()}
        for name, row in rows.items():
            ratios = [
                f"{rate[name] / rate[other]:.2f}" if other in rate and name.startswith("streambatch") else ""
                for other in ("numpy-ideal", "memcpy-floor", "torch-naive")
            ]
            print(
                f"| {key} | {name} | {statistics.median(row['plan_s']):.3f} | {rate[name] / 1e6:.1f} | "
                f"{max(row['peak_rss_mb']):.0f} | {' | '.join(ratios)} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
