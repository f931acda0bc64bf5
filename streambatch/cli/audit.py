"""``streambatch audit``: iterate a whole epoch and prove the chapter's PROOF line for it."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import IO, Any

from ..epoch import Epoch
from ..io.mixture_file import MixtureSource
from ..run import Run
from ..tools.audit import AuditResult, PackAuditResult, audit_epoch
from ..tools.inspect import format_count
from ..tools.mix_report import audit_mixture, format_mixture_audit
from ._common import add_order, add_source, args_epoch, open_args_source, seed_type

EXIT_FAILED = 1


def _audit(args: argparse.Namespace, out: IO[str]) -> int:
    source = open_args_source(args)
    epoch = args_epoch(args, source, plan_dir=args.plan_dir, verify_plan=args.plan_dir is not None)
    if args.epoch:  # epoch E of the run seeded with --seed, as `epoch --epoch E` writes it (a schedule goes on)
        epoch = Run.from_epoch(epoch).epoch(args.epoch)
    if isinstance(source, MixtureSource):  # the prefix bound, each source's exact epochs, no repeat, tokens
        mixed = audit_mixture(epoch, workers=args.workers, world_size=args.world_size)
        out.write(json.dumps(mixed, indent=1) + "\n" if args.json else format_mixture_audit(mixed))
        if mixed["failures"]:
            print(f"streambatch: audit failed: {next(iter(mixed['failures'].items()))}", file=sys.stderr)
        return EXIT_FAILED if mixed["failures"] else 0
    report = format_packed_audit if epoch.pack else format_audit  # one audit; a packed epoch has its own PROOF line
    result = audit_epoch(
        epoch,
        other_seed=args.other_seed,
        workers=args.workers,
        world_size=args.world_size,
        progress=False if args.quiet else None,
    )
    if args.json:
        out.write(json.dumps(result.to_dict(), indent=1) + "\n")
    else:
        out.write(report(result, epoch, args.workers, args.world_size))
    failed = result.first_failure
    if failed is None:
        return 0
    print(f"streambatch: audit failed: {failed[0]}: {failed[1]}", file=sys.stderr)
    return EXIT_FAILED


def format_packed_audit(result: PackAuditResult, epoch: Epoch, workers: int = 1, world_size: int = 1) -> str:
    """The packed PROOF line, one ``FAIL|check=...`` line per failed check, then the summary."""
    lines = [result.proof_line()]
    lines += [f"FAIL|check={check}|{message}" for check, message in result.failures.items()]
    order = "sequential" if epoch.seed is None else f"seed {epoch.seed}"
    T = epoch.context_length
    positions = result.rows * T
    pad = positions - result.real_positions
    share = 100 * pad / positions if positions else 0.0
    lines.append(
        f"epoch: {format_count(result.expected_rows)} packed rows of T={T} (partition {epoch.partition.value}) "
        f"in {format_count(epoch.batch_count)} batches of <= {epoch.batch_size}, {order}"
    )
    lines.append(
        f"targets: {format_count(result.covered_targets)} of {format_count(result.targets)} covered once; "
        f"padding {format_count(pad)} of {format_count(positions)} positions ({share:.3f} %), "
        f"denominators sum to {format_count(result.denominator)} real targets"
    )
    if workers > 1 or world_size > 1:
        lines.append(f"shares: {world_size} ranks x {workers} workers, {format_count(result.batches)} pieces, union checked")
    if result.folded_mean is not None and result.direct_mean is not None:
        lines.append(
            f"token mean: {result.folded_mean.mean_loss:.6f} folded from batch raw sums, "
            f"{result.direct_mean.mean_loss:.6f} direct over {format_count(result.direct_mean.token_count)} targets"
        )
    rate = result.targets / result.seconds if result.seconds > 0 else 0.0
    lines.append(f"time: {result.seconds:.2f} s, {format_count(int(rate))} targets/s")
    return "\n".join(lines) + "\n"


def format_audit(result: AuditResult, epoch: Epoch, workers: int = 1, world_size: int = 1) -> str:
    """The PROOF line, one ``FAIL|check=...`` line per failed check, then the summary."""
    lines = [result.proof_line()]
    lines += [f"FAIL|check={check}|{message}" for check, message in result.failures.items()]
    widths, size = epoch.batch_widths, epoch.batch_size
    if not isinstance(size, int):  # a schedule: each run of equal widths, in order
        runs = [(w, len(list(group))) for w, group in itertools.groupby(widths)]
        shape = " + ".join(f"[{w}] x {format_count(n)}" for w, n in runs) or "none"
    else:
        shape = "none" if not widths else f"[{size}] x {format_count(epoch.item_count // size)}"
        if widths and widths[-1] != size:
            shape = f"[{widths[-1]}]" if len(widths) == 1 else f"{shape} + [{widths[-1]}]"
    order = "sequential" if epoch.seed is None else f"seed {epoch.seed}"
    lines.append(
        f"epoch: {format_count(epoch.item_count)} windows of T={epoch.context_length} (stride {epoch.stride}, "
        f"partition {epoch.partition.value}) in {format_count(epoch.batch_count)} batches {shape}, {order}"
    )
    if workers > 1 or world_size > 1:
        lines.append(
            f"shares: {world_size} ranks x {workers} workers, {format_count(result.batches)} pieces "
            "(shares that can hold rows), union checked"
        )
    if result.folded_mean is not None and result.direct_mean is not None:
        lines.append(
            f"token mean: {result.folded_mean.mean_loss:.6f} folded from batch raw sums, "
            f"{result.direct_mean.mean_loss:.6f} direct over {format_count(result.direct_mean.token_count)} target tokens"
        )
    if result.tokens:
        t = result.tokens
        lines.append(
            f"tokens: in {format_count(t['in'])} = out {format_count(t['out'])} + left out {format_count(t['left_out'])} "
            f"(documents shorter than T + 1: {format_count(t['short_documents'])}, tails and stride gaps: "
            f"{format_count(t['tails_and_gaps'])}){'' if t['balanced'] else ' -- NOT BALANCED'}"
        )
    rate = result.expected_windows / result.seconds if result.seconds > 0 else 0.0
    lines.append(f"time: {result.seconds:.2f} s, {format_count(int(rate))} windows/s")
    return "\n".join(lines) + "\n"


def register(commands: Any) -> None:
    """Add ``audit`` to *commands* (an argparse subparsers object)."""
    audit = commands.add_parser(
        "audit",
        help="iterate a whole epoch and prove coverage, no duplicates/padding/crossing, replay and token means "
        "(--pack: every target once, segments, positions, padding masked)",
    )
    add_source(audit, required_window=True)
    add_order(audit)
    audit.add_argument(
        "--other-seed", type=seed_type, help="the seed whose order must differ (default seed + 1; 0 if sequential)"
    )
    audit.add_argument("--workers", type=int, default=1, help="audit the union of N DataLoader workers' shares (sb.share)")
    audit.add_argument("--world-size", type=int, default=1, help="audit the union of N ranks' shares (sb.split_rows)")
    audit.add_argument("--json", action="store_true", help="print the result as JSON")
    audit.add_argument("--plan-dir", help="audit the epoch mapped from this plan folder, verifying the plan file first")
    audit.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    audit.add_argument("--epoch", type=int, default=0, help="audit this epoch of the run seeded with --seed (default 0)")
    audit.set_defaults(run=_audit)
