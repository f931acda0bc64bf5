"""One data-parallel rank of a packed epoch for test_pack_distributed (imported by spawned processes)."""

from __future__ import annotations

import datetime
import os

import numpy as np
import torch
import torch.distributed as dist

import streambatch as sb
import streambatch.torch as sbt

from .models import TinyLM, full_batch_reference, gradients


def packed_epoch() -> sb.Epoch:
    """Rows of T=4 holding different numbers of real targets (padding in some); B=3 over 7 rows: widths [3, 3, 1]."""
    rng = np.random.default_rng(12)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 50, n)) for i, n in enumerate([9, 3, 2, 6, 4, 2, 5, 3])]
    return sb.Epoch(docs, context_length=4, batch_size=3, seed=5, pack=True)


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
    )
    try:
        whole = packed_epoch()
        model = TinyLM()
        records = []
        for share in sbt.EpochDataset(whole, rank=rank, world_size=world_size):
            model.zero_grad(set_to_none=True)
            result = sbt.token_mean_backward(model, share.inputs, share.targets, micro_batch_rows=1)
            grads = gradients(model)  # before the reference clears them
            full = sbt.tensor_batch(whole.batch(share.index))
            reference_loss, reference_grads = full_batch_reference(model, full.inputs, full.targets)
            records.append(
                {
                    "rows": share.width,
                    "local_tokens": share.token_count,
                    "loss": result.loss,
                    "tokens": result.token_count,
                    "grads": grads,
                    "reference_loss": reference_loss,
                    "reference_grads": reference_grads,
                    "reference_tokens": full.token_count,
                }
            )
        torch.save(records, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
