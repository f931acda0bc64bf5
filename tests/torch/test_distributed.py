"""Data-parallel ranks with real processes on gloo: every rank gets the one-process token mean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import dist_worker
from .models import relative_error
from .spawn import spawn_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_compute_the_one_process_mean(tmp_path: Path, world_size: int) -> None:
    """Loss and gradients equal one process on the whole batch, on every rank, for every batch."""
    spawn_ranks(dist_worker.run_rank, world_size, tmp_path, timeout=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    batches = len(ranks[0])
    assert [4, 4, 1] == [sum(rank[i]["rows"] for rank in ranks) for i in range(batches)]
    if world_size > 1:
        assert any(rank[-1]["rows"] == 0 for rank in ranks)  # a rank with no rows of the final batch
    for i in range(batches):
        shares = [rank[i] for rank in ranks]
        positions = sorted(p for share in shares for p in share["positions"])
        assert len(positions) == len(set(positions))  # no duplicate windows across ranks
        for share in shares:
            assert share["reference_tokens"] == share["tokens"]
            assert share["loss"] == pytest.approx(share["reference_loss"], rel=1e-6)
            assert relative_error(share["grads"], share["reference_grads"]) < 1e-6
    # union of every rank's rows over the epoch: each window exactly once
    everything = [p for rank in ranks for share in rank for p in share["positions"]]
    assert 9 == len(everything) == len(set(everything))
