"""One rank of test_rank_loader's DCP tests (imported by spawned processes): a RankLoader saved or loaded with DCP.

The phase's settings are ``config.json`` in the phase's folder; each rank writes what it handed out there.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import streambatch as sb
import streambatch.torch as sbt

DOCS = [sb.Document(f"d{i}", "train", np.arange(3 + 5 * i) % 41) for i in range(8)]
OTHER = [sb.Document(f"o{i}", "train", np.arange(30 + i) % 17) for i in range(3)]


def make_run(kind: str) -> sb.Run:
    """Two epochs of windows, packed rows or a mixture; batches wider than three ranks, and short final ones.
    ``schedule``: three epochs of windows under a batch-size schedule whose thresholds fall in epochs 1 and 2."""
    if kind == "schedule":
        return sb.Run(DOCS, context_length=3, batch_size="0:4 500:3 1000:5", seed=5, epochs=3)
    if kind == "windows":
        return sb.Run(DOCS, context_length=3, batch_size=7, seed=5, epochs=2)
    if kind == "packed":
        return sb.Run(DOCS, context_length=5, batch_size=5, seed=5, epochs=2, pack=True)
    parts = [sb.windows(DOCS, context_length=3), sb.windows(OTHER, context_length=3)]
    return sb.Run(sb.mix(parts, [2, 1], seed=5, length=40), batch_size=6, seed=5, epochs=2)


def take(loader: sbt.RankLoader, steps: int | None) -> list[dict[str, Any]]:
    """What *loader* hands out for *steps* optimizer steps (None: to its end), one record per micro-batch."""
    records: list[dict[str, Any]] = []
    if steps == 0:
        return records
    first, acc = loader.step, loader.accumulation
    for n, micro in enumerate(loader):
        inputs = micro[0]["input"] if loader.output == "torchtitan" else micro.inputs
        step = first + n // acc
        records.append(
            {"step": step, "part": n % acc, "inputs": np.asarray(inputs).tolist(), "count": loader.global_token_count()}
        )
        if steps is not None and n + 1 == steps * acc:
            break
    return records


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    config = json.loads((Path(out_dir) / "config.json").read_text())
    if world_size > 1:
        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
        )
    try:
        loader = sbt.RankLoader(
            make_run(config["kind"]), rank=rank, world_size=world_size, num_workers=config["workers"],
            accumulation=config["accumulation"], output=config["output"], whole_run=True,
        )  # fmt: skip
        if config.get("load"):
            dcp.load({"loader": loader}, checkpoint_id=config["load"])
        records = take(loader, config.get("steps"))
        if config.get("save"):
            dcp.save({"loader": loader}, checkpoint_id=config["save"])
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"records": records, "state": loader.state_dict()}))
    finally:
        if world_size > 1:
            dist.barrier()
            dist.destroy_process_group()
