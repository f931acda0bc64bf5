"""`token_mean_loss` under DistributedDataParallel and FSDP2 on gloo: the framework's own averaging, the exact token mean.

One spawn of four processes runs every world size (1-4, as process groups) and
every case (`ddp_worker`): windows and packed rows, accumulation 1, 2 and 4,
DDP and FSDP2.  After every step, every
parameter's gradient on every rank equals the one-process token-mean gradient
of the step's whole batches, final batches narrower than the world (ranks with
no rows) included, and the only collective a DDP step issues is DDP's own
gradient all-reduce.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import ddp_worker
from .spawn import spawn_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

TOLERANCE = 1e-10


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    spawn_ranks(ddp_worker.run_rank, max(ddp_worker.WORLD_SIZES), out, timeout=600)
    return out


@pytest.mark.parametrize("world_size", ddp_worker.WORLD_SIZES)
def test_ddp_and_fsdp2_leave_the_one_process_token_mean_gradient(results: Path, world_size: int) -> None:
    """Every rank, every step, every case: gradients within 1e-10 of one process; DDP's all-reduce is the only collective."""
    ranks = [torch.load(results / f"rank{r}_world{world_size}.pt") for r in range(world_size)]
    cases = list(zip(*ranks, strict=True))  # the same steps in the same order on every rank
    sizes = {kind: len(epoch) for kind, epoch in ddp_worker.epochs().items()}
    covered: dict[tuple[str, str, int], list[int]] = {}
    for first, *_ in cases:
        covered.setdefault((first["kind"], first["framework"], first["accumulation"]), []).extend(first["step"])
    assert len(covered) == len(sizes) * 2 * len(ddp_worker.ACCUMULATION)  # every kind x framework x accumulation ran
    assert all(steps == list(range(sizes[key[0]])) for key, steps in covered.items())  # every batch, once
    empty_ranks = masked_ranks = 0
    for shares in cases:
        first = shares[0]
        case = {k: first[k] for k in ("kind", "framework", "accumulation", "step")}
        for share in shares:
            assert share["error"] <= TOLERANCE, (case, share["error"])
            assert share["counts"] == first["whole_counts"], case  # every rank knows the whole batch's count
        for i in range(len(first["step"])):  # the shares add up to the whole batch
            assert sum(s["local_counts"][i] for s in shares) == first["whole_counts"][i], case
        empty_ranks += sum(1 for s in shares if 0 in s["rows"])
        masked_ranks += sum(1 for s in shares for w, n in zip(s["rows"], s["local_counts"], strict=True) if w and not n)
        if first["kind"] == "masked windows" and first["step"][0] == 0:
            assert first["counts"][0] == 0  # a whole batch with no counted target: zero gradients, no NaN
        for share in shares:
            if first["framework"] == "ddp":  # DDP's own all-reduce, once per bucket, after the step's last micro-batch
                assert share["buckets"] >= 1
                assert share["calls"] == {"all_reduce": share["buckets"]}, case
            else:  # FSDP2's own all-gathers and reduce-scatters: never an all-reduce
                assert "all_reduce" not in share["calls"], (case, share["calls"])
    if world_size > 1:
        assert empty_ranks > 0  # a final batch narrower than the world left some rank with no rows
        assert masked_ranks > 0  # some rank held rows whose every target is masked
