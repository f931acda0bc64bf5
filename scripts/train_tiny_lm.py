#!/usr/bin/env python3
"""Train a tiny causal byte-level LM on the Python standard library's own source files.

    python scripts/train_tiny_lm.py                  # one process, ~1 minute on 2 CPU cores
    python scripts/train_tiny_lm.py --pack           # packed rows, document-masked attention
    python scripts/train_tiny_lm.py --world-size 2   # DistributedDataParallel on gloo, same token means
    python scripts/train_tiny_lm.py --sft --world-size 2   # a loss mask: only each file's second half trains
    torchrun --nproc-per-node 2 scripts/train_tiny_lm.py --torchrun

The corpus goes through the byte-level tokenizer into a streambatch store; each
epoch is a seeded streambatch order.  With more than one rank the model is
wrapped in DistributedDataParallel; every rank's share of a batch is split into
micro-batches (all but the last under ``no_sync``), each one's summed loss
scaled by `sbt.token_mean_loss` with the batch's ``global_token_count`` (the
counted targets of the whole batch over every rank, known from the plan), so
DDP's own gradient averaging leaves the exact token mean: no other collective.

``--sft`` trains on a masked corpus, the supervised fine-tuning case: each
file's first half is the "prompt" (never a target), its second half the
"completion" (a store with a loss mask, `sb.DocumentStore.from_arrays(...,
loss_mask=)`): `sbt.tensor_batch` writes -100 at the prompt's targets, and
``global_token_count`` counts the completion targets of the whole batch from
the plan and the mask bits, the same on every rank; a rank whose rows are all
prompt still joins every step.

``--pack`` trains on packed rows (`sb.Epoch(..., pack=True)`): every target of
every file, pieces packed best-fit into rows, attention kept inside each
segment by `streambatch.torch.document_mask`, positions read at the batch's
``position_ids``, padding outside every loss and denominator.  Both modes
report target tokens per step (the real denominator of each step) and the
share of the corpus's targets an epoch trains on.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import streambatch as sb
import streambatch.torch as sbt
from streambatch.io.store import open_store
from streambatch.prepare import prepare_store
from streambatch.read.text.byte_tokens import BYTE_VOCAB_SIZE


class TinyTransformer(nn.Module):
    """Byte embeddings + learned positions -> causal transformer layers -> next-byte logits."""

    def __init__(self, context_length: int, width: int = 96, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(BYTE_VOCAB_SIZE, width)
        self.position = nn.Parameter(torch.zeros(context_length, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, BYTE_VOCAB_SIZE)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context_length), persistent=False)

    def forward(
        self, tokens: torch.Tensor, segment_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        length = tokens.shape[1]
        if segment_ids is None or position_ids is None:  # window mode: one document per row, causal
            h = self.embed(tokens) + self.position[:length]
            h = self.blocks(h, mask=self.mask[:length, :length], is_causal=True)
            return self.head(self.norm(h))
        # packed: learned positions at each segment's own positions; attention inside each segment only.
        # document_mask is True where a query may attend; the encoder wants True where it may not, one per head.
        h = self.embed(tokens) + self.position[position_ids.long()]
        allowed = sbt.document_mask(segment_ids)
        blocked = ~allowed.expand(-1, self.heads, -1, -1).reshape(-1, length, length)
        h = self.blocks(h, mask=blocked)
        return self.head(self.norm(h))


def stdlib_files(max_bytes: int) -> list[Path]:
    """A deterministic selection of the standard library's .py files, up to *max_bytes*."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(root.glob("*.py")):
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        chosen.append(path)
        total += size
    return chosen


def with_prompt_masked(store: sb.DocumentStore) -> sb.DocumentStore:
    """The ``--sft`` corpus: *store* with a loss mask training only each file's second half (its "completion")."""
    lengths, starts = store.lengths.astype(np.int64), store.starts.astype(np.int64)
    documents = np.repeat(np.arange(lengths.size), lengths)
    at = np.arange(int(lengths.sum())) - starts[documents]  # each token's position in its file
    mask = at >= np.maximum(lengths[documents] // 2, 1)  # the first half is the prompt; position 0 never trains
    offsets = np.concatenate([starts, [int(starts[-1] + lengths[-1])]]) if lengths.size else np.zeros(1, np.int64)
    return sb.DocumentStore.from_arrays(store.tokens, offsets, ids=list(store.ids), loss_mask=mask)


def micro_steps(model: nn.Module, batch: sbt.TensorBatch, rows: int, extra: tuple[torch.Tensor, ...]) -> list[Any]:
    """This rank's micro-batches of its share; one (empty) even with no rows, so it joins DDP's all-reduce."""
    size = max(1, rows)
    pieces = [batch.inputs.split(size), batch.targets.split(size), *(t.split(size) for t in extra)]
    steps = list(zip(*pieces, strict=True)) or [(batch.inputs, batch.targets, *extra)]
    sync = getattr(model, "no_sync", None)
    return [(piece, contextlib.nullcontext() if k == len(steps) - 1 or sync is None else sync()) for k, piece in enumerate(steps)]


def train(rank: int, world_size: int, args: argparse.Namespace, store_path: str) -> None:
    torch.manual_seed(0)  # the same initial weights on every rank
    torch.set_num_threads(max(1, args.threads // world_size))
    store = open_store(store_path)
    if args.sft:
        store = with_prompt_masked(store)
    if args.pack:
        epoch = sb.Epoch(store, context_length=args.context_length, batch_size=args.batch_size, seed=args.seed, pack=True)
        covered, targets = epoch.items.report.targets, epoch.items.report.targets
    else:
        epoch = sb.Epoch(
            store, context_length=args.context_length, stride=args.context_length, batch_size=args.batch_size, seed=args.seed
        )
        covered = epoch.items.counted_targets()  # from the plan (and the mask bits): no token read
        lengths = store.lengths.astype(np.int64)
        targets = int((lengths - (np.maximum(lengths // 2, 1) if args.sft else 1)).clip(min=0).sum())
    dataset = sbt.EpochDataset(epoch, rank=rank, world_size=world_size)
    loader = DataLoader(dataset, batch_size=None, num_workers=0)
    plain = TinyTransformer(args.context_length)
    model: nn.Module = DistributedDataParallel(plain) if world_size > 1 else plain
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if rank == 0:
        items = "packed rows" if args.pack else "windows"
        print(
            f"corpus: {len(store)} files, {store.tokens.size:,} byte tokens; {dataset.epoch.item_count:,} {items} of "
            f"T={args.context_length}, {len(dataset)} batches of <= {args.batch_size} per epoch; world size {world_size}"
        )
        mode = "pack" if args.pack else "sft" if args.sft else "windows"
        print(f"mode: {mode}: an epoch trains on {covered:,} of {targets:,} targets ({covered / targets:.1%})")
    for number in range(args.epochs):
        dataset.set_epoch(number)
        local_sum, tokens, steps, started = torch.zeros((), dtype=torch.float64), 0, 0, time.perf_counter()
        for batch in loader:
            count = batch.global_token_count  # the whole batch's counted targets over every rank: from the plan
            optimizer.zero_grad(set_to_none=True)
            extra = (batch.segment_ids, batch.position_ids) if args.pack else ()
            for (inputs, targets, *rows), sync in micro_steps(model, batch, args.micro_batch_rows, extra):
                with sync:
                    loss_sum = sbt.cross_entropy_sum(model, inputs, targets, *rows)
                    sbt.token_mean_loss(loss_sum, count=count, world_size=world_size).backward()
                local_sum += loss_sum.detach().to(torch.float64)  # raw sums over the epoch; divided once below
            optimizer.step()
            tokens += count  # this step's counted targets (all ranks): padding and prompts never count
            steps += 1
        if world_size > 1:  # for the report only, once an epoch: the training steps need no collective of their own
            dist.all_reduce(local_sum)
        loss_sum = float(local_sum)
        if rank == 0:
            seconds = time.perf_counter() - started
            print(
                f"epoch {number + 1}: token-mean loss {loss_sum / tokens:.4f} over {tokens:,} target tokens, "
                f"{tokens / max(steps, 1):,.1f} target tokens per step ({seconds:.1f} s)"
            )


def _rank_main(rank: int, world_size: int, rendezvous: str, args: argparse.Namespace, store_path: str) -> None:
    """One spawned rank of this machine: gloo over loopback, met through a file (no port to pick and race for)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5)
    )
    try:
        train(rank, world_size, args, store_path)
        dist.barrier()  # no rank tears gloo down while another still talks to it (a SIGABRT at exit, once in CI)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--context-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--micro-batch-rows", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-bytes", type=int, default=400_000, help="how much stdlib source to train on")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--world-size", type=int, default=1, help="data-parallel ranks on gloo (spawned here)")
    parser.add_argument("--torchrun", action="store_true", help="ranks come from torchrun's environment")
    parser.add_argument("--pack", action="store_true", help="packed rows with document-masked attention (every target)")
    parser.add_argument("--sft", action="store_true", help="a loss mask: each file's first half is a prompt, never a target")
    args = parser.parse_args()
    if args.sft and args.pack:
        parser.error("--sft trains windows of the masked corpus here; drop --pack")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "stdlib")
        if args.torchrun:
            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
            # every rank prepares its own copy: the store is deterministic, so all are identical
            prepare_store(stdlib_files(args.max_bytes), store_path, quiet=True)
            try:
                train(rank, world, args, store_path)
                dist.barrier()  # as in _rank_main
            finally:
                dist.destroy_process_group()
            if rank:
                return
        else:
            prepare_store(stdlib_files(args.max_bytes), store_path, quiet=True)
            if args.world_size == 1:
                train(0, 1, args, store_path)
            else:
                rendezvous = os.path.join(tmp, "rendezvous")
                mp.spawn(_rank_main, args=(args.world_size, rendezvous, args, store_path), nprocs=args.world_size, join=True)
    print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
