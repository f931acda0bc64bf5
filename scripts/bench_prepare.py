#!/usr/bin/env python3
"""Benchmark `streambatch prepare`: tokens/s with the byte tokenizer and a BPE, serial vs --workers.

    python scripts/bench_prepare.py                    # ~20 MB of stdlib source, 3 repeats
    python scripts/bench_prepare.py --megabytes 5 --repeats 1 --per-line
    python scripts/bench_prepare.py --rss-documents 10000000   # peak RSS growth per document
    python scripts/bench_prepare.py --long-text 12.7            # one 12.7 MB text through the BPE
    python scripts/bench_prepare.py --ray                       # --executor ray vs --workers 2 vs encode_batch

The corpus is the Python standard library's own source (real text, one document
per file, or per line with --per-line), copied into a temporary folder.  The BPE
is trained here with ``tokenizers`` on the first 4 MB of it (byte-level, 8,192
ids, ``<|endoftext|>``).  Each configuration runs --repeats times after a warm-up;
the median is reported, with the CPU seconds it used (this process and its
workers) and the load average seen before and after (the machine may be shared:
CPU s / s is how many cores the run got).  Every run's fingerprint must equal
the serial one.

With --rss-documents N, it measures memory instead: `prepare --per-line` of N
one-character lines (and of N JSONL token rows), each in a fresh process, and
reports the peak RSS (VmHWM) above the same run on 1,000 documents, divided
by N: the bytes `prepare` holds per document.

With --long-text MB, it tokenizes one text of MB megabytes of stdlib source with
the BPE, whole (``tokenizers`` directly) and as `prepare` does (HFTokenizer: cut
into pieces where the ids cannot change), each in a fresh process: peak RSS
growth, seconds, and whether the ids are equal.

With --ray, it compares, on the same corpus and BPE in one run: ``prepare
--executor ray`` on a local cluster of --workers CPUs (default parts: one per
16 MiB, at most 4 per CPU), ``prepare --workers N``, and the ceiling: the
tokenizer's own ``encode_batch`` over the same texts on N Rust threads, in a
fresh process (the tokens it makes, plus one eos per document, as prepare
counts them).  It reports tokens/s and their ratios, the cluster's start-up
time (``ray.init``), and the peak RSS (VmHWM) of each Ray worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import streambatch as sb


def copy_corpus(target: Path, megabytes: float) -> int:
    """Copy stdlib .py files (sorted) until about *megabytes*; returns the bytes copied."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total, limit = 0, int(megabytes * 1e6)
    for source in sorted(stdlib.rglob("*.py")):
        if total >= limit or "site-packages" in source.parts:
            continue
        try:
            source.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        destination = target / source.relative_to(stdlib)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
        total += destination.stat().st_size
    return total


def train_bpe(corpus: Path, path: Path, vocab_size: int = 8192) -> Path:
    """A byte-level BPE trained on the first 4 MB of the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, size = [], 0
    for file in sorted(corpus.rglob("*.py")):
        texts.append(file.read_text(encoding="utf-8"))
        size += len(texts[-1])
        if size > 4e6:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the workers, once their pool is joined)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def measure(corpus: Path, out: Path, repeats: int, **options: Any) -> dict[str, Any]:
    """Median seconds of `prepare_store` over *repeats* runs (after one warm-up), and the store's numbers."""
    store = sb.prepare_store([corpus], out, quiet=True, **options)
    seconds, cpu = [], []
    for _ in range(repeats):
        before = _cpu()
        start = time.perf_counter()
        again = sb.prepare_store([corpus], out, quiet=True, **options)
        seconds.append(time.perf_counter() - start)
        cpu.append(_cpu() - before)
        assert again.fingerprint == store.fingerprint
    median = statistics.median(seconds)
    return {
        "seconds": median,
        "cpu_seconds": statistics.median(cpu),
        "documents": len(store),
        "tokens": store.token_count,
        "tokens_per_s": store.token_count / median,
        "fingerprint": store.fingerprint,
    }


_RSS_CHILD = """
import resource, sys
def peak():  # this process's own peak RSS in bytes (VmHWM: ru_maxrss would inherit the parent's peak across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import streambatch as sb
sb.prepare_store([sys.argv[1]], sys.argv[2], per_line=True, quiet=True)
print(peak())
"""


def peak_rss(path: Path, out: Path) -> int:
    """Peak RSS (bytes) of a fresh process that prepares *path* (per line) into *out*."""
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path), str(out)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def write_documents(path: Path, count: int, kind: str) -> None:
    """*count* one-character text lines, or *count* JSONL rows of one token."""
    line = b"a\n" if kind == "text" else b'{"tokens":[7]}\n'
    block = line * 1_000_000
    with open(path, "wb") as handle:
        for lo in range(0, count, 1_000_000):
            handle.write(block if count - lo >= 1_000_000 else line * (count - lo))


def measure_rss(documents: int) -> None:
    """Peak RSS growth per document of `prepare`, for one-character lines and one-token JSONL rows."""
    print(f"prepare peak RSS growth per document at {documents:,} documents (Python {platform.python_version()})")
    print("| input | documents | peak RSS | baseline (1,000 docs) | bytes / document |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for kind, suffix in (("text", ".txt"), ("jsonl", ".jsonl")):
            small, big = root / f"small{suffix}", root / f"big{suffix}"
            write_documents(small, 1000, kind)
            write_documents(big, documents, kind)
            base = peak_rss(small, root / "small-store")
            peak = peak_rss(big, root / "big-store")
            print(
                f"| {kind} (one {'character' if kind == 'text' else 'token'} each) | {documents:,} | {peak / 2**20:,.0f} MiB | "
                f"{base / 2**20:,.0f} MiB | {(peak - base) / documents:.1f} |"
            )
            shutil.rmtree(root / "big-store", ignore_errors=True)
            big.unlink()


_TEXT_CHILD = """
import resource, sys, time, hashlib
def peak():  # this process's own peak RSS in bytes (VmHWM: ru_maxrss would inherit the parent's peak across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import numpy as np
from tokenizers import Tokenizer
from streambatch.read.text.tokenizers import HFTokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8").read()
base, start = peak(), time.perf_counter()
if sys.argv[3] == "whole":
    ids = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)
else:
    ids = HFTokenizer(tok).encode(text)
seconds = time.perf_counter() - start
growth = peak() - base
print(ids.size, hashlib.blake2b(ids.tobytes()).hexdigest()[:16], growth, seconds)
"""


def measure_long_text(megabytes: float) -> None:
    """One long text through the BPE: whole vs in pieces (HFTokenizer), peak RSS growth and time, in fresh processes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        copy_corpus(root / "corpus", max(megabytes, 4.5))
        bpe = train_bpe(root / "corpus", root / "tokenizer.json")
        text = "".join(f.read_text(encoding="utf-8") for f in sorted((root / "corpus").rglob("*.py")))[: int(megabytes * 1e6)]
        (root / "long.txt").write_text(text, encoding="utf-8")
        print(f"one text of {len(text):,} characters of stdlib source, byte-level BPE of 8,192 ids")
        print("| encoding | tokens | peak RSS growth | seconds | ids digest |")
        print("|---|---|---|---|---|")
        for mode in ("whole", "pieces"):
            done = subprocess.run(
                [sys.executable, "-c", _TEXT_CHILD, str(bpe), str(root / "long.txt"), mode],
                capture_output=True,
                text=True,
                check=True,
            )
            count, digest, growth, seconds = done.stdout.split()
            print(f"| {mode} | {int(count):,} | {int(growth) / 2**20:,.0f} MiB | {float(seconds):.2f} | {digest} |")


_CEILING_CHILD = """
import os, sys, time, statistics
os.environ["RAYON_NUM_THREADS"] = sys.argv[3]  # before the tokenizers library starts its thread pool
from pathlib import Path
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [open(p, encoding="utf-8", newline="").read() for p in sorted(Path(sys.argv[2]).rglob("*.py"))]  # as prepare reads them
tok.encode_batch(texts[:50], add_special_tokens=False)
seconds = []
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    count = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)) + len(texts)
    seconds.append(time.perf_counter() - start)
print(count, statistics.median(seconds))
"""


def _family_peaks(root: int) -> dict[int, tuple[str, int]]:
    """``pid -> (name, VmHWM bytes)`` of the Ray worker processes (``ray::...``) below *root*."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if name.startswith("ray::"):
            hwm = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
            found[pid] = (name, hwm)
    return found


def measure_ray(megabytes: float, repeats: int, workers: int) -> None:
    """tokens/s of --executor ray vs --workers N vs encode_batch on N threads; cluster start-up; worker peak RSS."""
    import ray

    from streambatch.parts.on_ray import local_cluster

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        size = copy_corpus(root / "corpus", megabytes)
        bpe = train_bpe(root / "corpus", root / "tokenizer.json")
        done = subprocess.run(
            [sys.executable, "-c", _CEILING_CHILD, str(bpe), str(root / "corpus"), str(workers), str(repeats)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        ceiling_tokens, ceiling_seconds = int(done.stdout.split()[0]), float(done.stdout.split()[1])
        pool = measure(root / "corpus", root / "store", repeats, tokenizer=bpe, workers=workers)
        start = time.perf_counter()
        local_cluster(ray, num_cpus=workers)
        startup = time.perf_counter() - start
        try:
            first = time.perf_counter()
            corpus = sb.prepare_store([root / "corpus"], root / "ray-0", tokenizer=bpe, executor="ray", quiet=True)
            first = time.perf_counter() - first  # the workers start and import streambatch here
            seconds = []
            for k in range(1, repeats + 1):
                begin = time.perf_counter()
                again = sb.prepare_store([root / "corpus"], root / f"ray-{k}", tokenizer=bpe, executor="ray", quiet=True)
                seconds.append(time.perf_counter() - begin)
                assert again.fingerprint == corpus.fingerprint
            peaks = _family_peaks(os.getpid())
        finally:
            ray.shutdown()
        assert corpus.token_count == pool["tokens"], "Ray changed the tokens"
        assert len(corpus) == pool["documents"], "Ray changed the documents"
    load_after = os.getloadavg()
    ray_seconds = statistics.median(seconds)
    rates = {
        "ray": corpus.token_count / ray_seconds,
        "pool": pool["tokens_per_s"],
        "ceiling": ceiling_tokens / ceiling_seconds,
    }
    print(
        f"corpus: {size / 1e6:.1f} MB of stdlib source (per file), BPE of 8,192 ids, {repeats} repeats (median); "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, ray {ray.__version__}; "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    print("| run | tokens | seconds | tokens/s | / ceiling |")
    print("|---|---|---|---|---|")
    for label, tokens, took, key in (
        (f"encode_batch, {workers} Rust threads (ceiling)", ceiling_tokens, ceiling_seconds, "ceiling"),
        (f"prepare --workers {workers}", pool["tokens"], pool["seconds"], "pool"),
        (f"prepare --executor ray ({len(corpus.shards)} parts, {workers} CPUs)", corpus.token_count, ray_seconds, "ray"),
    ):
        print(f"| {label} | {tokens:,} | {took:.2f} | {rates[key] / 1e6:.2f} M | {rates[key] / rates['ceiling']:.2f}x |")
    print(f"ray / --workers {workers}: {rates['ray'] / rates['pool']:.2f}x")
    print(f"cluster start-up (ray.init): {startup:.2f} s; first run (workers start): {first:.2f} s")
    hwm = sorted(h for _, h in peaks.values())
    print(
        f"Ray worker processes: {len(hwm)}, peak RSS (VmHWM) median {statistics.median(hwm) / 2**20:.0f} MiB, "
        f"max {hwm[-1] / 2**20:.0f} MiB"
        if hwm
        else "no Ray worker process found"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-line", action="store_true", help="one document per non-blank line")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--rss-documents", type=int, help="measure peak RSS growth per document at this many documents instead")
    parser.add_argument("--long-text", type=float, metavar="MB", help="measure one text of MB megabytes through the BPE instead")
    parser.add_argument("--ray", action="store_true", help="compare --executor ray, --workers N and encode_batch instead")
    args = parser.parse_args()
    if args.ray:
        measure_ray(args.megabytes, args.repeats, args.workers)
        return
    if args.rss_documents:
        measure_rss(args.rss_documents)
        return
    if args.long_text:
        measure_long_text(args.long_text)
        return

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        size = copy_corpus(root / "corpus", args.megabytes)
        bpe = train_bpe(root / "corpus", root / "tokenizer.json")
        rows: list[dict[str, Any]] = []
        configs: list[tuple[str, Any, int, str | None]] = [
            ("bytes", None, 1, None),
            ("bytes", None, args.workers, None),
            ("bpe", bpe, 1, "true"),  # the tokenizers library's own threads (Rust, rayon) on
            ("bpe", bpe, 1, "false"),  # one thread
            ("bpe", bpe, args.workers, None),  # workers: one thread each
        ]
        serial: dict[str, str] = {}
        for name, tokenizer, workers, parallel in configs:
            if parallel is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = parallel
            result = measure(
                root / "corpus", root / "store", args.repeats, tokenizer=tokenizer, workers=workers, per_line=args.per_line
            )
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
            if workers == 1:
                serial.setdefault(name, result["fingerprint"])
            assert result["fingerprint"] == serial[name], "workers changed the store"
            rows.append({"tokenizer": name, "workers": workers, "rust_threads": parallel, **result})
    load_after = os.getloadavg()

    print(
        f"corpus: {size / 1e6:.1f} MB of stdlib source ({'per line' if args.per_line else 'per file'}), "
        f"{args.repeats} repeats (median); {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    print("| tokenizer | workers | documents | tokens | seconds | tokens/s | speed-up | CPU s | CPU s / s |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {r["tokenizer"]: r["seconds"] for r in rows if r["workers"] == 1 and r["rust_threads"] != "true"}
    for row in rows:
        label = row["tokenizer"] + (
            "" if row["rust_threads"] is None else f" (rust threads {'on' if row['rust_threads'] == 'true' else 'off'})"
        )
        key = row["tokenizer"]
        speedup = base[key] / row["seconds"]  # vs one thread in one process
        print(
            f"| {label} | {row['workers']} | {row['documents']:,} | {row['tokens']:,} | {row['seconds']:.2f} | "
            f"{row['tokens_per_s'] / 1e6:.2f} M | {speedup:.2f}x | {row['cpu_seconds']:.2f} | "
            f"{row['cpu_seconds'] / row['seconds']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "load": [load_before, load_after], "bytes": size}, indent=1))


if __name__ == "__main__":  # required: --workers spawns processes that import this module
    main()
