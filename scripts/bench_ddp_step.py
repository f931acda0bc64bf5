#!/usr/bin/env python3
"""Time per training step at world size 2 on gloo: DDP with `token_mean_loss` vs the all-reduce path.

    python scripts/bench_ddp_step.py                  # 7 interleaved repeats of 8 steps per path
    python scripts/bench_ddp_step.py --repeats 5 --steps 20 --width 256 --batch-size 16 --context-length 128

Two spawned ranks (127.0.0.1) train the same small causal transformer on the
same seeded epoch of random tokens (by default T = 64, B = 8 rows per global
batch, 2 global batches as micro-batches per step: 2 rows per rank per
micro-batch, so the gradient exchange is a visible share of the step).  ``ddp``: the model wrapped in DistributedDataParallel,
each micro-batch's summed loss scaled by `sbt.token_mean_loss` (the step's
count from the plan, `sbt.step_token_count`), the first micro-batch under
``no_sync``: DDP's own bucketed all-reduce is the step's only collective.
``allreduce``: the unwrapped model through `sbt.token_mean_backward`, which
all-reduces the loss and count and a float64 copy of every gradient, then copies
the mean back.  Both paths run forward, backward and an SGD step on identical
batches; the two are interleaved repeat by repeat, and each repeat's time per
step is the slower rank's.  Prints the medians and their ratio as JSON.

Measured on the 2 shared CPU cores of the development machine (loaded by other
work), defaults, two runs: 1456 vs 1858 ms and 594 vs 751 ms per step, the
all-reduce path 1.28x and 1.26x the DDP path's time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import streambatch as sb
import streambatch.torch as sbt

VOCAB, SEED = 512, 7


class Model(nn.Module):
    """Embeddings -> causal transformer layers -> logits (float32)."""

    def __init__(self, width: int, layers: int, context_length: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context_length), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.embed(tokens), mask=self.mask, is_causal=True)
        return self.head(h)  # type: ignore[no-any-return]


def epoch(args: argparse.Namespace) -> sb.Epoch:
    """Documents of 10 windows of random tokens: enough windows for every timed step's batches."""
    T, B = args.context_length, args.batch_size
    windows = 10 * -(-2 * args.steps * B // 10)
    tokens = np.random.default_rng(0).integers(0, VOCAB, windows * (T + 1), dtype=np.uint16)
    store = sb.DocumentStore.from_arrays(tokens, np.arange(0, tokens.size + 1, 10 * (T + 1)))
    return sb.Epoch(store, context_length=T, stride=T + 1, batch_size=B, seed=SEED)


def timed_ddp(model: Any, optimizer: Any, steps: list[list[sbt.TensorBatch]]) -> float:
    dist.barrier()
    started = time.perf_counter()
    for step in steps:
        count = sbt.step_token_count(step)
        for k, batch in enumerate(step):
            with contextlib.nullcontext() if k == len(step) - 1 else model.no_sync():
                loss_sum = sbt.cross_entropy_sum(model, batch.inputs, batch.targets)
                sbt.token_mean_loss(loss_sum, batch, count=count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / len(steps)


def timed_allreduce(model: Any, optimizer: Any, steps: list[list[sbt.TensorBatch]]) -> float:
    dist.barrier()
    started = time.perf_counter()
    for step in steps:
        inputs = torch.cat([b.inputs for b in step])
        targets = torch.cat([b.targets for b in step])
        sbt.token_mean_backward(model, inputs, targets, micro_batch_rows=max(1, inputs.shape[0] // len(step)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / len(steps)


def rank_main(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(minutes=10)
    )
    try:
        shares = [sbt.tensor_batch(b) for b in epoch(args).batches(rank=rank, world_size=2)]
        steps = [shares[i : i + 2] for i in range(0, 2 * args.steps, 2)]
        wrapped = DistributedDataParallel(Model(args.width, args.layers, args.context_length))
        plain = Model(args.width, args.layers, args.context_length)
        runs = {
            "ddp": (wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-3), timed_ddp),
            "allreduce": (plain, torch.optim.SGD(plain.parameters(), lr=1e-3), timed_allreduce),
        }
        for model, optimizer, run in runs.values():  # warm-up
            run(model, optimizer, steps[:2])
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, (model, optimizer, run) in runs.items():
                mine = torch.tensor([run(model, optimizer, steps)], dtype=torch.float64)
                dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slower rank's time: the step's time
                times[name].append(float(mine))
        if rank == 0:
            parameters = sum(p.numel() for p in plain.parameters())
            with open(out, "w") as f:
                json.dump({"parameters": parameters, "times": times}, f)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8, help="steps per timed repeat (2 micro-batches each)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per global batch (half on each rank)")
    parser.add_argument("--context-length", type=int, default=64)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(rank_main, args=(port, args, out), nprocs=2, join=True)
        with open(out) as f:
            found = json.load(f)
    medians = {name: statistics.median(values) for name, values in found["times"].items()}
    report = {
        "world_size": 2,
        "backend": "gloo",
        "parameters": found["parameters"],
        "context_length": args.context_length,
        "batch_size": args.batch_size,
        "micro_batches_per_step": 2,
        "steps_per_repeat": args.steps,
        "repeats": args.repeats,
        "ms_per_step": {name: round(1000 * m, 2) for name, m in medians.items()},
        "allreduce_over_ddp": round(medians["allreduce"] / medians["ddp"], 3),
        "cpu": platform.processor() or platform.machine(),
        "threads_per_rank": 1,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
