"""The one way the distributed tests start ranks: spawned processes on a free loopback port, killed on a hang."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the gloo rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_ranks(run_rank: Callable[..., Any], world_size: int, out: Path, timeout: float) -> None:
    """Run ``run_rank(rank, world_size, port, out)`` in *world_size* spawned processes; fail (and kill them) past *timeout*."""
    context = mp.start_processes(
        run_rank, args=(world_size, free_port(), str(out)), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"world_size={world_size} did not finish in {timeout} s (a hang)")
