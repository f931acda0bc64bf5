"""One life of test_schedule's killed run: ``python -m tests.torch.schedule_worker OUT WORLD ACC WORKERS KILL_AT``.

Every rank's `RankLoader` of one epoch under the batch-size schedule 2 -> 4 -> 3 runs in this process; each step's
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


def make_run() -> sb.Run:
    return sb.Run(DOCS, context_length=3, batch_size=SCHEDULE, seed=9, epochs=1)


def main(out: Path, world: int, accumulation: int, workers: int, kill_at: int) -> None:
    loaders = [
        sbt.RankLoader(make_run(), rank=r, world_size=world, num_workers=workers, accumulation=accumulation) for r in range(world)
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
    main(Path(sys.argv[1]), *map(int, sys.argv[2:6]))
