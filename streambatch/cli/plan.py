"""``streambatch plan``: compute an epoch's shuffle plan once, into a plan file every process maps.

With ``--pack`` the plan holds the packed rows' numbers in the epoch's order,
keyed by the corpus fingerprint, ``T``, the partition and the packing algorithm
(`streambatch.order.plan.plan_key`); ``epoch --pack --plan-dir`` and
``Epoch(..., pack=True, plan_dir=)`` map the same file.  The summary names
``"mode": "pack"`` and ``rows`` where a window plan has ``windows``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import IO, Any

from .._checks import check_non_negative
from ..items.protocol import orders_by_plan
from ..order.plan import build_plan, plan_path
from ..order.splitmix import derive_seed
from ..stages.chunk import batch_count, bind_batch_size
from ._common import add_order, add_source, args_epoch, open_args_source


def _plan(args: argparse.Namespace, out: IO[str]) -> None:
    number = check_non_negative(args.epoch, "epoch", "the epoch number (0 for the first)")
    source = open_args_source(args)
    seed = derive_seed(args.seed, number)
    if source.kind == "mixture":
        out.write(json.dumps(_plan_mixture(args_epoch(args, source, plan_dir=args.output).items, seed, args), indent=1) + "\n")
        return
    epoch = args_epoch(args, source)  # checks -T, -B, --stride, --pack and the partition rule, plans nothing
    whole = epoch.items
    assert orders_by_plan(whole)  # windows or rows: a mixture is planned above
    path = plan_path(whole, seed, args.output)
    started = time.perf_counter()
    plan, created = build_plan(whole, seed, args.output, run={"seed": args.seed, "epoch": number}, verify=args.verify)
    summary = {
        "plan": str(path),
        "created": created,
        "verified": args.verify,
        "seconds": round(time.perf_counter() - started, 3),
        **({"mode": "pack", "rows": len(plan)} if epoch.pack else {"windows": len(plan)}),
        "batches": epoch.batch_count,
        "bytes": plan.plan_nbytes,
        "seed": args.seed,
        "epoch": number,
        "shuffle_seed": seed,
        "state_after": plan.shuffle_state_after,
        "corpus": whole.store.content_fingerprint(),
    }
    out.write(json.dumps(summary, indent=1) + "\n")


def _plan_mixture(mixture: Any, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Plan a mixture's epoch: its order file, then every source epoch plan it reads (all in the plan folder)."""
    started = time.perf_counter()
    ordered = mixture.reseeded(seed)
    plans = ordered.source_plans()
    return {
        "plan": mixture.space.plan_path,
        "source_plans": [p.plan_path for p in plans],
        "seconds": round(time.perf_counter() - started, 3),
        "items": len(mixture),
        "batches": batch_count(len(mixture), bind_batch_size(args.batch_size, mixture)),
        "bytes": mixture.plan_nbytes,
        "seed": args.seed,
        "epoch": args.epoch,
        "mixture_seed": seed,
        "mixture": mixture.fingerprint,
        **({"mode": "pack", "rows": mixture.sizes} if mixture.packed else {}),
    }


def register(commands: Any) -> None:
    """Add ``plan`` to *commands* (an argparse subparsers object)."""
    plan = commands.add_parser("plan", help="compute an epoch's shuffle plan once, into a plan file shared by every process")
    add_source(plan, required_window=True)
    add_order(plan, sequential=False)
    plan.add_argument("--epoch", type=int, default=0, help="epoch number: the shuffle seed is derive_seed(seed, epoch)")
    plan.add_argument("--output", "-o", required=True, help="plan directory (created if missing)")
    plan.add_argument(
        "--verify", action="store_true", help="read the plan once: its digest, every entry, no window twice (exit 2 if not)"
    )
    plan.set_defaults(run=_plan)
