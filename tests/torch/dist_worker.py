"""One data-parallel rank for test_distributed (imported by spawned processes)."""

from __future__ import annotations

import datetime
import os

import numpy as np
import torch
import torch.distributed as dist

import streambatch as sb
import streambatch.torch as sbt

from .models import TinyLM, full_batch_reference, gradients


def corpus() -> list[sb.Document]:
    """Nine windows of T=4 with B=4: widths [4, 4, 1], a final batch narrower than 2 or 3 ranks."""
    rng = np.random.default_rng(11)
    return [sb.Document(f"d{i}", "train", rng.integers(0, 50, n)) for i, n in enumerate([8, 5, 6, 6, 4])]


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        docs = corpus()
        whole = sb.Epoch(docs, context_length=4, batch_size=4, seed=5)
        dataset = sbt.EpochDataset(whole, rank=rank, world_size=world_size)
        model = TinyLM()
        records = []
        for share in dataset:  # every rank steps through every global batch, even with zero rows
            model.zero_grad(set_to_none=True)
            result = sbt.token_mean_backward(model, share.inputs, share.targets, micro_batch_rows=1)
            grads = gradients(model)
            inputs, targets = sbt.as_tensors(whole.batch(share.index))
            reference_loss, reference_grads = full_batch_reference(model, inputs, targets)
            records.append(
                {
                    "index": share.index,
                    "rows": share.width,
                    "positions": share.positions.tolist(),
                    "loss": result.loss,
                    "tokens": result.token_count,
                    "grads": grads,
                    "reference_loss": reference_loss,
                    "reference_grads": reference_grads,
                    "reference_tokens": int(targets.numel()),
                }
            )
        torch.save(records, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
