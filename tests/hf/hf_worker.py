"""One rank of the HF Trainer tests, run as ``python -m tests.hf.hf_worker MODE RANK WORLD RENDEZVOUS OUT [CHECKPOINT]``.

MODE ``train`` (world size 2): every case (windows and packed rows of the masked
SFT corpus, accumulation 2 and 3) trains one epoch with `streambatch.hf.Trainer`
while a counter wraps torch.distributed's Python collectives; rank 0 saves the
final weights, every rank the counts it was handed, the collectives it saw and
the trained model's eval over the packed epoch.
Then HF's own path (a plain dataset of the same rows, HF's collator) trains two
steps under the same counter, so the counter is shown to see HF's count gather.
Last, the ``kill`` run (windows, accumulation 2, a checkpoint every
`KILL_AFTER` steps) SIGKILLs every rank right after the checkpoint at step
`KILL_AFTER`.  MODE ``resume`` (any world size): resume that checkpoint, train to
the end, rank 0 saves the weights.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from typing import Any

import torch
import torch.distributed as dist

CASES = [("windows", 2), ("windows", 3), ("packed", 2), ("packed", 3)]
KILL_AFTER = 3


def main(mode: str, rank: int, world_size: int, rendezvous: str, out: str, checkpoint: str | None = None) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", GLOO_SOCKET_IFNAME="lo",
    )  # fmt: skip
    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group(
            "gloo", init_method=rendezvous, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=300)
        )
    if mode == "train":
        train_cases(rank, out)
        hf_own_path(rank, out)
        killed_run(out)
    else:
        assert checkpoint is not None
        resumed_run(rank, out, checkpoint)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


def counting_callback(counting: Any) -> Any:
    from transformers import TrainerCallback

    class Counting(TrainerCallback):  # the collectives issued from the start of the epoch's steps to their end
        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            counting.calls.clear()
            counting.active = True

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            counting.active = False  # (HF then all-gathers the run's flops total once: bookkeeping, not a count)

    return Counting()


def recording_trainer() -> Any:
    import streambatch.hf as sbh

    class Recording(sbh.Trainer):  # what the Trainer's loop is handed per step
        seen: list[dict[str, Any]]

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            window, count = super().get_batch_samples(epoch_iterator, num_batches, device)
            if len(window):
                micro = list(window)  # the test process checks rows; the loop gets the same list
                self.seen.append({"count": count, "rows": [int(m["shift_labels"].shape[0]) for m in micro],
                                  "counted": [int((m["shift_labels"] != -100).sum()) for m in micro]})  # fmt: skip
                window = micro
            return window, count

    return Recording


def train_cases(rank: int, out: str) -> None:
    from tests.torch.ddp_worker import Counting

    from .common import epoch, tiny_llama, training_args

    counting = Counting()
    report = {}
    for kind, accumulation in CASES:
        name = f"{kind}-{accumulation}"
        trainer = recording_trainer()(
            model=tiny_llama(), args=training_args(os.path.join(out, name), accumulation), train_dataset=epoch(kind),
            callbacks=[counting_callback(counting)],
        )  # fmt: skip
        trainer.seen = []
        trainer.train()
        report[name] = {
            "seen": trainer.seen,
            "calls": dict(counting.calls),
            "loader": type(trainer.callback_handler.train_dataloader.loader).__name__,
            "eval": trainer.evaluate(eval_dataset=epoch("packed")),  # each rank its share; loss sums merged once
        }
        if rank == 0:
            torch.save(trainer.model.state_dict(), os.path.join(out, f"{name}.pt"))
    with open(os.path.join(out, f"report{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)


def hf_own_path(rank: int, out: str) -> None:
    """HF's own path on the same rows: a plain dataset of dicts, HF's collator; the counter sees its count gather."""
    from transformers import Trainer

    from tests.torch.ddp_worker import Counting

    from .common import epoch, tiny_llama, training_args

    rows = [{"input_ids": row.tolist(), "labels": row.tolist()} for b in epoch("windows") for row in b.inputs]
    counting = Counting()
    args = training_args(os.path.join(out, "hf-own"), 2, max_steps=2, per_device_train_batch_size=2)
    Trainer(model=tiny_llama(), args=args, train_dataset=rows, callbacks=[counting_callback(counting)]).train()
    with open(os.path.join(out, f"hf_own{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(dict(counting.calls), handle)


def killed_run(out: str) -> None:
    from transformers import TrainerCallback

    import streambatch.hf as sbh

    from .common import epoch, tiny_llama, training_args

    class Kill(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == KILL_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)

    args = training_args(os.path.join(out, "kill"), 2, save_strategy="steps", save_steps=KILL_AFTER)
    sbh.Trainer(model=tiny_llama(), args=args, train_dataset=epoch("windows"), callbacks=[Kill()]).train()
    raise SystemExit("the run was not killed at its checkpoint")


def resumed_run(rank: int, out: str, checkpoint: str) -> None:
    import streambatch.hf as sbh

    from .common import epoch, tiny_llama, training_args

    args = training_args(os.path.join(out, "resumed"), 2)
    trainer = sbh.Trainer(model=tiny_llama(), args=args, train_dataset=epoch("windows"))
    trainer.train(resume_from_checkpoint=checkpoint)
    if rank == 0:
        torch.save(trainer.model.state_dict(), os.path.join(out, "resumed.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], *sys.argv[6:])
