"""One rank of test_ddp: DDP and FSDP2 steps with `token_mean_loss` against the one-process token mean.

Spawned once, as four processes: world sizes 1, 2 and 3 are the process groups
of the first 1, 2, 3 ranks (DDP's ``process_group``, FSDP2 over a device mesh of
that group), world size 4 is the whole world (`init_device_mesh("cpu", (4,))`),
so torch is imported by four processes, not ten.  Every case (windows and packed
rows, accumulation 1, 2 and 4, DDP and FSDP2) runs inside.  Each rank writes, per
step, the worst relative gradient error against a one-process reference and the
collectives the step issued.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import streambatch as sb
import streambatch.torch as sbt

from .models import TinyLM, relative_error

ACCUMULATION = (1, 2, 4)
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "barrier", "broadcast",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_gather_object", "broadcast_object_list",
)  # fmt: skip


def corpus() -> list[sb.Document]:
    """Windows of T=4 (B=4 gives widths 4, 4, 4, 1: the last narrower than 2-4 ranks); packed rows of uneven fill."""
    rng = np.random.default_rng(3)
    lengths = [9, 5, 7, 6, 3, 8, 2, 6, 4]
    return [sb.Document(f"d{i}", "train", rng.integers(0, 50, n)) for i, n in enumerate(lengths)]


def masked_corpus() -> list[sb.Document]:
    """A loss mask: "prompt" of 12 tokens training only its last one (windows 0-6 at T=4 train nothing, so batch
    0 of B=4 has no counted target and, split four ways, every rank's rows are all masked), then random masks."""
    rng = np.random.default_rng(4)
    prompt = np.zeros(12, dtype=bool)
    prompt[-1] = True
    docs = [sb.Document("prompt", "train", rng.integers(0, 50, 12), loss_mask=prompt)]
    for i, n in enumerate([9, 6, 7, 5]):
        mask = rng.random(n) < 0.5
        mask[-1] = True  # every document trains at least one target
        docs.append(sb.Document(f"m{i}", "train", rng.integers(0, 50, n), loss_mask=mask))
    return docs


def epochs() -> dict[str, sb.Epoch]:
    docs, masked = corpus(), masked_corpus()
    return {
        "windows": sb.Epoch(docs, context_length=4, batch_size=4, seed=5),
        "packed": sb.Epoch(docs, context_length=4, batch_size=3, seed=5, pack=True),
        "masked windows": sb.Epoch(masked, context_length=4, batch_size=4, seed=None),
        "masked packed": sb.Epoch(masked, context_length=4, batch_size=3, seed=5, pack=True),
    }


def steps(batches: int, accumulation: int) -> Iterator[range]:
    """Consecutive global batches per optimizer step; the last step may be shorter."""
    for first in range(0, batches, accumulation):
        yield range(first, min(first + accumulation, batches))


class Counting:
    """Counts every torch.distributed collective called from Python while `active`."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.active = False
        for name in COLLECTIVES:
            original = getattr(dist, name)
            setattr(dist, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls[name] += 1
            return original(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def step(self) -> Iterator[Counter[str]]:
        self.calls = Counter()
        self.active = True
        try:
            yield self.calls
        finally:
            self.active = False


def counting_hook(buckets: list[int]) -> Any:
    """DDP's own averaging all-reduce (the default hook), counting the buckets it reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state: Any, bucket: Any) -> Any:
        buckets[0] += 1
        return allreduce_hook(state, bucket)

    # DDP checks the annotations themselves (this module's are strings)
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook


def loss_sum(model: nn.Module, batch: sbt.TensorBatch) -> torch.Tensor:
    return sbt.cross_entropy_sum(model, batch.inputs, batch.targets)


def reference(model: nn.Module, epoch: sb.Epoch, step: range) -> list[torch.Tensor]:
    """One process, whole batches: every micro-batch's summed loss over the step's counted targets, one backward."""
    model.zero_grad(set_to_none=True)
    whole = [sbt.tensor_batch(epoch.batch(i)) for i in step]
    total = sum(b.token_count for b in whole)
    loss = sum((loss_sum(model, b) for b in whole), torch.zeros((), dtype=torch.float64)) / max(total, 1)
    loss.backward()  # type: ignore[no-untyped-call]
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def ddp_step(model: Any, shares: list[sbt.TensorBatch], sync: Any, group: Any) -> None:
    count = sbt.step_token_count(shares)
    for k, batch in enumerate(shares):
        with sync(k == len(shares) - 1):  # world_size: that of *group* (None: the whole world)
            sbt.token_mean_loss(loss_sum(model, batch), batch, count=count, group=group).backward()


WORLD_SIZES = (1, 2, 3, 4)
TIMEOUT_S = 300  # ranks outside a smaller world wait for it at their first collective of the next


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )  # fmt: skip
    try:
        groups = {w: dist.new_group(list(range(w))) for w in WORLD_SIZES if w < world_size}  # every rank makes every group
        counting = Counting()
        for w in WORLD_SIZES:
            if rank >= w:
                continue
            if w == world_size:
                group, mesh = None, init_device_mesh("cpu", (w,))
            else:
                group = groups[w]
                mesh = DeviceMesh.from_group(group, "cpu")
            records = run_cases(rank, w, group, mesh, counting)
            torch.save(records, os.path.join(out_dir, f"rank{rank}_world{w}.pt"))
    finally:
        dist.destroy_process_group()


def run_cases(rank: int, world_size: int, group: Any, mesh: Any, counting: Counting) -> list[dict[str, Any]]:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    records: list[dict[str, Any]] = []
    for kind, epoch in epochs().items():
        shares = [sbt.tensor_batch(b) for b in epoch.batches(rank=rank, world_size=world_size)]
        for accumulation in ACCUMULATION:
            for framework in ("ddp", "fsdp2"):
                plain = TinyLM()
                if framework == "ddp":
                    buckets = [0]
                    model: Any = DistributedDataParallel(copy.deepcopy(plain), process_group=group)
                    model.register_comm_hook(group, counting_hook(buckets))

                    def sync(last: bool, model: Any = model) -> Any:
                        return contextlib.nullcontext() if last else model.no_sync()
                else:
                    buckets = [-1]
                    model = fully_shard(copy.deepcopy(plain), mesh=mesh)

                    def sync(last: bool, model: Any = model) -> Any:
                        model.set_requires_gradient_sync(last)
                        return contextlib.nullcontext()

                for step in steps(len(epoch), accumulation):
                    model.zero_grad(set_to_none=True)
                    mine = [shares[i] for i in step]
                    before = buckets[0]
                    with counting.step() as calls:
                        ddp_step(model, mine, sync, group)
                    grads = [p.grad for p in model.parameters()]
                    if framework == "fsdp2":
                        grads = [g.full_tensor() for g in grads]
                    expected = reference(plain, epoch, step)
                    records.append(
                        {
                            "kind": kind, "framework": framework, "accumulation": accumulation, "step": list(step),
                            "rows": [b.width for b in mine], "counts": [b.global_token_count for b in mine],
                            "local_counts": [b.token_count for b in mine],
                            "whole_counts": [epoch.batch(i).token_count for i in step],
                            "error": relative_error(grads, expected), "calls": dict(calls),
                            "buckets": buckets[0] - before if framework == "ddp" else None,
                        }
                    )  # fmt: skip
    return records
