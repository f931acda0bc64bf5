#!/usr/bin/env python3
"""`streambatch.hf.Trainer` against HF's own data path: steps per second, the data share of a step, resume time.

    python scripts/bench_hf.py                      # both measurements, defaults below
    python scripts/bench_hf.py --part steps --steps 40 --repeats 3
    python scripts/bench_hf.py --part resume --windows 10000000

``steps``: two spawned ranks (gloo, a ``file://`` rendezvous) train the same
tiny Llama (float32, built from a config) on the same windows of a seeded
corpus: ``streambatch.hf.Trainer`` over an `sb.Run`, and ``transformers.Trainer``
over a ``datasets.Dataset`` of the same rows (each window's T + 1 tokens, so both
paths count the same T targets) with HF's ``DataCollatorForLanguageModeling(mlm=False)``.
Global batch B, accumulation 2, world size 2: both take B rows per optimizer step.
The paths alternate, repeat by repeat; a repeat's steps/s is timed on rank 0
from the end of the warm-up steps to the last step, and its data share is the
time spent getting and collating micro-batches (HF: inside ``get_batch_samples``,
the window prefetch and the count's all-gather included; streambatch: the
loader's ``next`` and `streambatch.hf.hf_batch`) over the step time.

``resume``: a checkpoint at 90% of a --windows epoch (T=16, stride 1, B=16, world size 1, accumulation 2;
made by training one step, its ``trainer_state.json`` given the target global step), resumed on each path with
``train(resume_from_checkpoint=...)`` and timed to the first trained step's start and end (median of 3; one
run where the first takes over a minute).  streambatch: ``streambatch.hf.Trainer`` over an `sb.Run`, against the
same Trainer starting fresh, and the data's own part (the run, its `sbt.RankLoader`, the saved state, one batch).
HF: ``transformers.Trainer`` over a ``datasets.Dataset`` of the same windows (Arrow, T + 1 int32 tokens each,
HF's sampler shuffling) with ``DataCollatorForLanguageModeling``, its real resume path run whole: accelerate's
``skip_first_batches`` skips the checkpoint's micro-batches (checked: the number HF skipped, the step it ends
at), against the same Trainer starting fresh.  ``--hf-windows N ...`` also times HF's resume over the first N
windows (the scaling).  Prints JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streambatch as sb

VOCAB = 512


def model(width: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=1024, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config)


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<pad>": VOCAB - 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>")


def store(tokens: int, seed: int = 7) -> sb.DocumentStore:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 2000, tokens // 600 + 2)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    offsets = offsets[offsets <= tokens]
    return sb.DocumentStore.from_arrays(rng.integers(0, VOCAB - 1, int(offsets[-1]), dtype=np.uint16), offsets)


def arguments(out: str, **extra: Any) -> Any:
    from transformers import TrainingArguments

    options: dict[str, Any] = {
        "output_dir": out, "gradient_accumulation_steps": 2, "learning_rate": 1e-3, "report_to": [],
        "save_strategy": "no", "logging_strategy": "no", "use_cpu": True, "disable_tqdm": True, "seed": 0,
        "dataloader_num_workers": 0,
    }  # fmt: skip
    return TrainingArguments(**{**options, **extra})


class Clock:
    """Steps timed from the end of the warm-up; data time summed by the patched paths."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.data, self.start, self.end, self.steps = warmup, 0.0, 0.0, 0.0, 0

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Timing(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if state.global_step == clock.warmup:
                    clock.start, clock.data = time.perf_counter(), 0.0
                elif state.global_step > clock.warmup:
                    clock.end, clock.steps = time.perf_counter(), state.global_step - clock.warmup

        return Timing()

    def result(self) -> dict[str, float]:
        seconds = self.end - self.start
        return {"steps_per_s": self.steps / seconds, "data_share": self.data / seconds}


def timed(clock: Clock, function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            clock.data += time.perf_counter() - began

    return wrapper


class TimedIterator:
    def __init__(self, inner: Any, clock: Clock) -> None:
        self.inner, self.clock = inner, clock

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        began = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.clock.data += time.perf_counter() - began


def streambatch_path(options: argparse.Namespace, out: str, clock: Clock) -> None:
    import streambatch.hf as sbh
    import streambatch.hf.trainer as trainer_module

    trainer_module.hf_batch = timed(clock, sbh.hf_batch)  # the collation into HF's names, counted as data time

    class Trainer(sbh.Trainer):
        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            return super().get_batch_samples(TimedIterator(epoch_iterator, clock), num_batches, device)

    T = options.context_length
    run = sb.Run(store(options.tokens), seed=3, context_length=T, stride=T, batch_size=options.batch_size)
    args = arguments(out, max_steps=options.warmup + options.steps)
    Trainer(model=model(options.width), args=args, train_dataset=run, callbacks=[clock.callback()]).train()


def hf_path(options: argparse.Namespace, out: str, clock: Clock) -> None:
    import datasets
    from transformers import DataCollatorForLanguageModeling, Trainer

    T = options.context_length
    epoch = sb.Epoch(store(options.tokens), seed=3, context_length=T, stride=T, batch_size=4096)  # the same windows
    rows = np.concatenate([np.concatenate([b.inputs, b.targets[:, -1:]], axis=1) for b in epoch]).astype(np.int32)
    dataset = datasets.Dataset.from_dict({"input_ids": rows.tolist()})

    class Timed(Trainer):
        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            return timed(clock, super().get_batch_samples)(epoch_iterator, num_batches, device)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = arguments(out, max_steps=options.warmup + options.steps, per_device_train_batch_size=options.batch_size // (2 * world))
    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    Timed(
        model=model(options.width), args=args, train_dataset=dataset, data_collator=collator, callbacks=[clock.callback()]
    ).train()


def rank_main(rank: int, world_size: int, rendezvous: str, out: str, options: argparse.Namespace) -> None:
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", GLOO_SOCKET_IFNAME="lo",
    )  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=600)
    )
    results: dict[str, list[dict[str, float]]] = {"streambatch": [], "hf": []}
    for repeat in range(options.repeats):
        for name in ("hf", "streambatch") if repeat % 2 else ("streambatch", "hf"):
            clock = Clock(options.warmup)
            (streambatch_path if name == "streambatch" else hf_path)(options, os.path.join(out, f"{name}-{repeat}"), clock)
            results[name].append(clock.result())
    if rank == 0:
        Path(out, "steps.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def steps(options: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        rendezvous = f"file://{Path(out).resolve() / 'rendezvous'}"
        mp.start_processes(rank_main, args=(2, rendezvous, out, options), nprocs=2, join=True, start_method="spawn")
        results = json.loads(Path(out, "steps.json").read_text())
    summary: dict[str, Any] = {"repeats": results}
    for name, runs in results.items():
        summary[name] = {key: statistics.median(r[key] for r in runs) for key in ("steps_per_s", "data_share")}
    summary["steps_ratio"] = summary["streambatch"]["steps_per_s"] / summary["hf"]["steps_per_s"]
    return summary


def first_step_seconds(trainer: Any, checkpoint: str | None) -> tuple[float, float]:
    """Seconds from ``train(resume_from_checkpoint=checkpoint)`` to the first step's start and to its end."""
    from transformers import TrainerCallback

    marks: list[float] = []

    class Marks(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks.append(time.perf_counter())

    trainer.add_callback(Marks())
    began = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    return marks[0] - began, marks[1] - began


def _medians(name: str, times: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        f"{name}_begin_s": [t[0] for t in times], f"{name}_end_s": [t[1] for t in times],
        f"{name}_begin_median_s": statistics.median(t[0] for t in times),
        f"{name}_end_median_s": statistics.median(t[1] for t in times),
    }  # fmt: skip


def resume(options: argparse.Namespace) -> dict[str, Any]:
    T, B = 16, 16
    data = store(int(options.windows * 1.02))  # stride 1: a document of L tokens has L - T windows
    report: dict[str, Any] = {} if options.skip_streambatch else streambatch_resume(options, data, T, B)
    hf = {str(n): hf_resume(options, data, T, B, n) for n in options.hf_windows or []}
    hf["all"] = hf_resume(options, data, T, B, None)
    report["hf"] = hf
    if "resume_begin_median_s" in report:
        report["hf_over_streambatch_to_first_step_begin"] = hf["all"]["resume_begin_median_s"] / report["resume_begin_median_s"]
        report["hf_over_streambatch_to_first_step_end"] = hf["all"]["resume_end_median_s"] / report["resume_end_median_s"]
    return report


def streambatch_resume(options: argparse.Namespace, data: sb.DocumentStore, T: int, B: int) -> dict[str, Any]:
    import streambatch.hf as sbh

    run = sb.Run(data, context_length=T, batch_size=B, stride=1, seed=3, epochs=1)
    target = int(run.batches_per_epoch * 0.9)
    with tempfile.TemporaryDirectory() as out:
        made = sb.Run(data, context_length=T, batch_size=B, stride=1, seed=3, epochs=1)
        made.set_position(0, target - 1)
        args = arguments(out, max_steps=1, save_strategy="steps", save_steps=1)
        sbh.Trainer(model=model(options.width), args=args, train_dataset=made).train()
        checkpoint = os.path.join(out, "checkpoint-1")
        state_path = os.path.join(checkpoint, "trainer_state.json")
        state = json.loads(Path(state_path).read_text())
        state["global_step"] = target
        Path(state_path).write_text(json.dumps(state))
        ours, fresh, loader = [], [], []
        for _ in range(options.repeats):
            loader.append(loader_resume_seconds(data, T, B, checkpoint, target))
            again = sb.Run(data, context_length=T, batch_size=B, stride=1, seed=3, epochs=1)
            trainer = sbh.Trainer(model=model(options.width), args=arguments(out, max_steps=target + 1), train_dataset=again)
            ours.append(first_step_seconds(trainer, checkpoint))
            assert again.position == (0, target + 1)
            start = sb.Run(data, context_length=T, batch_size=B, stride=1, seed=3, epochs=1)
            fresh.append(
                first_step_seconds(
                    sbh.Trainer(model=model(options.width), args=arguments(out, max_steps=1), train_dataset=start), None
                )
            )
    return {
        "windows": run.window_count, "checkpoint_step": target, "loader_resume_s": loader,
        "loader_resume_median_s": statistics.median(loader), **_medians("resume", ours), **_medians("fresh", fresh),
    }  # fmt: skip


def loader_resume_seconds(data: sb.DocumentStore, T: int, B: int, checkpoint: str, target: int) -> float:
    """Seconds from nothing to the checkpoint's next batch: the run, its `sbt.RankLoader`, the saved state, one batch."""
    import streambatch.hf.trainer as trainer_module
    import streambatch.torch as sbt

    began = time.perf_counter()
    run = sb.Run(data, context_length=T, batch_size=B, stride=1, seed=3, epochs=1)
    loader = sbt.RankLoader(run, accumulation=2, output="tensors")
    loader.load_state_dict(trainer_module.read_state(checkpoint))
    first = next(iter(loader))
    seconds = time.perf_counter() - began
    assert (first.epoch, first.index) == (0, target)
    return seconds


def hf_rows(data: sb.DocumentStore, T: int, windows: int | None = None) -> Any:
    """A ``datasets.Dataset`` of the run's windows (each T + 1 tokens, int32), in document order (HF's sampler
    shuffles), built through Arrow without a Python object per row; the first *windows* of them (None: all)."""
    import datasets
    import pyarrow as pa

    epoch = sb.Epoch(data, context_length=T, batch_size=1 << 20, stride=1, seed=None)
    parts, have = [], 0
    for batch in epoch:
        parts.append(np.concatenate([batch.inputs, batch.targets[:, -1:]], axis=1).astype(np.int32).ravel())
        have += batch.width
        if windows is not None and have >= windows:
            break
    flat = np.concatenate(parts)[: None if windows is None else windows * (T + 1)]
    return datasets.Dataset(pa.table({"input_ids": pa.FixedSizeListArray.from_arrays(pa.array(flat), T + 1)}))


def hf_resume(options: argparse.Namespace, data: sb.DocumentStore, T: int, B: int, windows: int | None) -> dict[str, Any]:
    """HF's own resume, run whole: ``transformers.Trainer`` over a ``datasets.Dataset`` of the windows with HF's
    collator, a checkpoint at 90% of its epoch, ``train(resume_from_checkpoint=...)`` timed to the first trained
    step (accelerate's ``skip_first_batches`` skips the micro-batches before it); *windows* None: all of them."""
    from transformers import DataCollatorForLanguageModeling, Trainer

    began = time.perf_counter()
    dataset = hf_rows(data, T, windows)
    built = time.perf_counter() - began
    skipped: list[int] = []

    class Recorded(Trainer):
        def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
            skipped.append(num_batches)
            return super().get_resumed_dataloader(dataloader, num_batches)

    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    steps_per_epoch = -(-len(dataset) // B)
    target = int(steps_per_epoch * 0.9)
    with tempfile.TemporaryDirectory() as out:
        args = arguments(out, max_steps=1, save_strategy="steps", save_steps=1, per_device_train_batch_size=B // 2)
        Trainer(model=model(options.width), args=args, train_dataset=dataset, data_collator=collator).train()
        checkpoint = os.path.join(out, "checkpoint-1")
        state_path = os.path.join(checkpoint, "trainer_state.json")
        state = json.loads(Path(state_path).read_text())
        state["global_step"] = target
        Path(state_path).write_text(json.dumps(state))

        fresh, times = [], []
        for repeat in range(options.hf_repeats):
            args = arguments(out, max_steps=1, per_device_train_batch_size=B // 2)
            trainer = Trainer(model=model(options.width), args=args, train_dataset=dataset, data_collator=collator)
            fresh.append(first_step_seconds(trainer, None))
            args = arguments(out, max_steps=target + 1, per_device_train_batch_size=B // 2)
            trainer = Recorded(model=model(options.width), args=args, train_dataset=dataset, data_collator=collator)
            times.append(first_step_seconds(trainer, checkpoint))
            assert skipped[-1] == 2 * target, skipped  # HF skipped the checkpoint's micro-batches
            assert trainer.state.global_step == target + 1, trainer.state.global_step
            print(f"hf resume {repeat}: {len(dataset):,} windows, first step begins {times[-1][0]:.2f} s", file=sys.stderr)
            if repeat == 0 and times[0][1] > 60:
                break  # over a minute: one run
    return {
        "windows": len(dataset), "dataset_build_s": built, "checkpoint_step": target, "skipped_micro_batches": 2 * target,
        "runs": len(times), **_medians("resume", times), **_medians("fresh", fresh),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["steps", "resume", "both"], default="both")
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (rows per optimizer step)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--windows", type=int, default=10_000_000, help="the resume epoch's windows (stride 1)")
    parser.add_argument("--hf-repeats", type=int, default=3, help="HF resumes timed (one if the first takes over 60 s)")
    parser.add_argument("--hf-windows", type=int, nargs="*", help="also time HF's resume over these first windows")
    parser.add_argument("--skip-streambatch", action="store_true", help="time HF's resume only")
    options = parser.parse_args()
    report: dict[str, Any] = {}
    if options.part in ("steps", "both"):
        report["steps"] = steps(options)
    if options.part in ("resume", "both"):
        report["resume"] = resume(options)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
