"""The one way the distributed tests start ranks: spawned processes meeting through a file, killed on a hang.

The ranks rendezvous through a fresh file in the test's own folder (``file://``), not a TCP port: a port
picked free here and bound by the ranks seconds later can be taken in between (the race
`scripts/train_tiny_lm.py` met once in CI).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp


def spawn_ranks(run_rank: Callable[..., Any], world_size: int, out: Path, timeout: float) -> None:
    """Run ``run_rank(rank, world_size, init_method, out)`` in *world_size* spawned processes (*init_method*: a
    ``file://`` rendezvous new to this call); fail (and kill them) past *timeout*."""
    rendezvous = f"file://{Path(out).resolve() / f'rendezvous-{uuid.uuid4().hex}'}"
    context = mp.start_processes(
        run_rank, args=(world_size, rendezvous, str(out)), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"world_size={world_size} did not finish in {timeout} s (a hang)")
