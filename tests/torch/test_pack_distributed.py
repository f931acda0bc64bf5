"""Packed batches over data-parallel ranks on gloo: every rank gets the one-process mean over real targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import pack_dist_worker
from .models import relative_error
from .spawn import spawn_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


@pytest.mark.parametrize("world_size", [2, 3])
def test_packed_ranks_compute_the_one_process_mean(tmp_path: Path, world_size: int) -> None:
    """Ranks holding different numbers of real targets (and none) still give the whole batch's token mean."""
    spawn_ranks(pack_dist_worker.run_rank, world_size, tmp_path, timeout=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    assert [3, 3, 1] == [sum(rank[i]["rows"] for rank in ranks) for i in range(len(ranks[0]))]
    uneven = {tuple(rank[i]["local_tokens"] for rank in ranks) for i in range(len(ranks[0]))}
    assert any(len(set(counts)) > 1 for counts in uneven)  # ranks really hold different real-target counts
    for i in range(len(ranks[0])):
        for rank in ranks:
            share = rank[i]
            assert share["tokens"] == share["reference_tokens"] == sum(r[i]["local_tokens"] for r in ranks)
            assert share["loss"] == pytest.approx(share["reference_loss"], rel=1e-9)
            assert relative_error(share["grads"], share["reference_grads"]) < 1e-9
