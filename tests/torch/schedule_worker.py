"""One life of test_schedule's killed run: ``python -m tests.torch.schedule_worker OUT WORLD ACC WORKERS KILL_AT [RUN]``.

Every rank's `RankLoader` of one epoch under the batch-size schedule 2 -> 4 -> 3 (``RUN`` given: of the three
epochs of `make_epochs`, whose thresholds fall in epochs 1 and 2) runs in this process; each step's
micro-batches, put back together in rank and part order, are written to ``OUT/step-NNNNN.bin`` (inputs, then
targets), then the loader state to ``OUT/state.json`` (atomically).  At step KILL_AT the process SIGKILLs itself
after the step's file and before its state: the resumed life writes that step again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

import streambatch as sb
import streambatch.torch as sbt

from .rank_loader_worker import DOCS

SCHEDULE = "0:2 60:4 240:3"  # T=3: 20 items in batches of 2, then of 4 until 80 items, then of 3


RUN_SCHEDULE = "0:4 500:3 1000:5"  # T=3, 140 items an epoch: 4 until item 167 (epoch 1), 3 until 334 (epoch 2), then 5


def make_run() -> sb.Run:
    return sb.Run(DOCS, context_length=3, batch_size=SCHEDULE, seed=9, epochs=1)


def make_epochs() -> sb.Run:
    """Three epochs under a schedule whose thresholds count over the run: they change the batch size in epochs 1, 2."""
    return sb.Run(DOCS, context_length=3, batch_size=RUN_SCHEDULE, seed=9, epochs=3)


def main(out: Path, world: int, accumulation: int, workers: int, kill_at: int, whole: bool = False) -> None:
    make = make_epochs if whole else make_run
    loaders = [
        sbt.RankLoader(make(), rank=r, world_size=world, num_workers=workers, accumulation=accumulation, whole_run=whole)
        for r in range(world)
    ]
    state_file = out / "state.json"
    if state_file.exists():
        saved = json.loads(state_file.read_text())
        for loader in loaders:
            loader.load_state_dict(saved)
    step, iterators = loaders[0].step, [iter(loader) for loader in loaders]
    for _ in range(loaders[0].steps):
        micros = [next(it) for it in iterators for _ in range(accumulation)]  # rank order, then part order
        inputs = np.concatenate([m.inputs for m in micros])
        targets = np.concatenate([m.targets for m in micros])
        (out / f"step-{step:05d}.bin").write_bytes(inputs.tobytes() + targets.tobytes())
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        states = {json.dumps(loader.state_dict(), sort_keys=True) for loader in loaders}
        assert len(states) == 1, states  # one global cursor
        temporary = out / "state.json.tmp"
        temporary.write_text(states.pop())
        os.replace(temporary, state_file)
        step += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]), *map(int, sys.argv[2:6]), whole=len(sys.argv) > 6)
