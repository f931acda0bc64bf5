#!/usr/bin/env python3
"""Loss masks: what they cost, measured in one interleaved run (medians of the repeats).

    python scripts/bench_mask.py                 # ~8M tokens, 5 repeats
    python scripts/bench_mask.py --tokens 2e6 --repeats 3
    python scripts/bench_mask.py --only emission --clock wall

Times are CPU time by default: this process's (every thread) and its finished
children's (the machines this runs on are shared; a descheduled process would
count others' work on the wall clock); the wall with --clock wall.

1. Emission: window and packed batches of the same store with and without a loss
   mask (random, ~half the targets), unmasked and masked passes interleaved one by
   one within each repeat; reported as target tokens/s and masked / unmasked, for the batches as
   emitted (the mask and packed ids built on first use) and with ``loss_mask`` read.
2. Store growth: the bytes a mask adds to a store on disk, in bits per token.
3. prepare of prompt/completion JSONL with a BPE tokenizer (trained here, offline,
   with the tokenizers library) against prepare of the same texts as plain
   ``text`` rows (no mask); reported as tokens/s and masked / unmasked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import streambatch as sb

WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "it", "an", "be"]


def _corpus(tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(1500), 1.0, size=tokens // 1000 + 1).astype(np.int64), 2, 50_000)
    lengths = lengths[np.cumsum(lengths) <= tokens]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = rng.integers(0, 50_257, int(offsets[-1]), dtype=np.uint16)
    mask = rng.random(flat.size) < 0.5
    return flat, offsets, mask


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its finished children (prepare's worker processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


CLOCK: Callable[[], float] = time.process_time  # emission: this process's CPU time (ns resolution; --clock wall)
PREPARE_CLOCK: Callable[[], float] = cpu_seconds  # prepare: with its worker processes


MIN_SECONDS = 0.3  # each timed sample repeats whole passes until it has run this long (short runs are noise)


def _pass(make: Callable[[], object], read_mask: bool) -> tuple[int, float]:
    """(target tokens, seconds) of one whole pass over ``materialize(make())``; with *read_mask* each batch's
    ``loss_mask`` is read too (built on that first use, where the batch defers it)."""
    start = CLOCK()
    count = 0
    for batch in sb.materialize(make()):  # type: ignore[call-overload]
        count += batch.targets.size
        _ = batch.token_count
        if read_mask:
            _ = batch.loss_mask
    return count, CLOCK() - start


def _paired(makes: dict[str, Callable[[], object]], read_mask: bool) -> dict[str, float]:
    """Target tokens/s of each of *makes*, their passes alternating one by one until each has run `MIN_SECONDS`:
    both see the same moments of a shared machine (a pass is milliseconds; the noise of a shared VM lasts longer)."""
    counts = dict.fromkeys(makes, 0)
    seconds = dict.fromkeys(makes, 0.0)
    while min(seconds.values()) < MIN_SECONDS:
        for name, make in makes.items():
            count, took = _pass(make, read_mask)
            counts[name] += count
            seconds[name] += took
    return {name: counts[name] / seconds[name] for name in makes}


def emission(tokens: int, repeats: int, T: int, B: int) -> dict[str, float]:
    """Masked and unmasked emission, pass by pass interleaved (`_paired`); the ratio is the median over *repeats*.

    "emitted": the batches as emission makes them (inputs, targets, the counted ``token_count``; a masked
    batch's ``loss_mask``, and a packed batch's ids and mask, are built on first use).  "+ loss_mask": each
    batch's ``loss_mask`` read as well, in both runs (the unmasked packed batch builds its padding mask too).
    """
    flat, offsets, mask = _corpus(tokens, 1)
    plain = sb.DocumentStore.from_arrays(flat, offsets)
    masked = sb.DocumentStore.from_arrays(flat, offsets, loss_mask=mask)
    out: dict[str, float] = {}
    for kind in ("windows", "packed"):
        items = {}
        for name, store in (("unmasked", plain), ("masked", masked)):
            if kind == "windows":
                items[name] = sb.shuffle(sb.windows(store, context_length=T, stride=T), seed=7)
            else:
                items[name] = sb.shuffle(sb.pack(store, context_length=T), seed=7)
        makes = {name: (lambda i=items[name]: sb.chunk(i, B)) for name in ("unmasked", "masked")}
        for read, label in ((False, "emitted"), (True, "+ loss_mask")):
            rates = [_paired(makes, read) for _ in range(repeats)]  # type: ignore[arg-type]
            ratio = statistics.median(r["masked"] / r["unmasked"] for r in rates)
            out[f"{kind} {label} unmasked tokens/s"] = statistics.median(r["unmasked"] for r in rates)
            out[f"{kind} {label} masked tokens/s"] = statistics.median(r["masked"] for r in rates)
            out[f"{kind} {label} masked/unmasked"] = ratio
    return out


def growth(folder: Path, tokens: int) -> dict[str, float]:
    flat, offsets, mask = _corpus(tokens, 2)
    sb.write_store(folder / "plain", sb.DocumentStore.from_arrays(flat, offsets))
    sb.write_store(folder / "masked", sb.DocumentStore.from_arrays(flat, offsets, loss_mask=mask))
    size = {n: sum(f.stat().st_size for f in (folder / n).iterdir()) for n in ("plain", "masked")}
    return {"store growth bits/token": 8 * (size["masked"] - size["plain"]) / flat.size}


def _texts(count: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    pairs = []
    for _ in range(count):
        prompt = " ".join(words[rng.integers(0, words.size, int(rng.integers(20, 80)))])
        completion = " ".join(words[rng.integers(0, words.size, int(rng.integers(40, 200)))])
        pairs.append((prompt, completion))
    return pairs


def prepare_rates(folder: Path, count: int, repeats: int) -> dict[str, float]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    pairs = _texts(count, 3)
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "<eos>"])
    tokenizer.train_from_iterator((p + " " + c for p, c in pairs[:2000]), trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    with open(folder / "pc.jsonl", "w") as handle:
        for p, c in pairs:
            handle.write(json.dumps({"prompt": p, "completion": " " + c}) + "\n")
    with open(folder / "text.jsonl", "w") as handle:
        for p, c in pairs:
            handle.write(json.dumps({"text": p + " " + c}) + "\n")
    common = {"tokenizer": str(folder / "tokenizer.json"), "bos_id": None, "eos_id": 1, "quiet": True}
    times: dict[str, list[float]] = {"unmasked": [], "masked": []}
    tokens = {}
    for _ in range(repeats):
        start = PREPARE_CLOCK()
        store = sb.prepare_store([folder / "text.jsonl"], folder / "s-text", **common)  # type: ignore[arg-type]
        times["unmasked"].append(PREPARE_CLOCK() - start)
        tokens["unmasked"] = store.token_count
        start = PREPARE_CLOCK()
        store = sb.prepare_store(
            [folder / "pc.jsonl"],
            folder / "s-pc",
            prompt_field="prompt",
            completion_field="completion",
            **common,  # type: ignore[arg-type]
        )
        times["masked"].append(PREPARE_CLOCK() - start)
        tokens["masked"] = store.token_count
    rates = {n: tokens[n] / statistics.median(times[n]) for n in times}
    return {
        "prepare unmasked tokens/s": rates["unmasked"],
        "prepare prompt/completion tokens/s": rates["masked"],
        "prepare masked/unmasked": rates["masked"] / rates["unmasked"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=8e6, help="tokens of the emission corpus")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context-length", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--documents", type=int, default=20_000, help="prompt/completion rows for prepare")
    parser.add_argument("--only", choices=("emission", "growth", "prepare"), help="run one of the three parts")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="time this process's CPU (default: the machine is shared) or the wall",
    )
    args = parser.parse_args()
    global CLOCK
    global PREPARE_CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    PREPARE_CLOCK = cpu_seconds if args.clock == "cpu" else time.perf_counter
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.only in (None, "emission"):
            results.update(emission(int(args.tokens), args.repeats, args.context_length, args.batch_size))
        if args.only in (None, "growth"):
            results.update(growth(folder, int(args.tokens) // 4))
        if args.only in (None, "prepare"):
            results.update(prepare_rates(folder, args.documents, args.repeats))
    for key, value in results.items():
        print(f"{key:40s} {value:,.3f}" if value < 100 else f"{key:40s} {value:,.0f}")


if __name__ == "__main__":
    main()
