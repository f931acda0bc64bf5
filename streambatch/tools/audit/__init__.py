"""Prove an epoch right from what its batches say about themselves: the chapter's PROOF line at scale.

`audit_batches` reads each row's provenance (document index, start) and ids and
checks them against the store alone, never against the epoch's own window
index: every window of the partition appears exactly once (coverage,
duplicates), no id is added or altered (padding), every row's ``T + 1`` tokens
lie inside one document (cross_document) of the epoch's partition
(cross_partition), the batches are ``[B] * k + [r]`` rows wide (widths), a
second pass replays the same order (replay), another seed reorders the same
windows (different_seed), and token means folded from per-batch raw sums equal
a direct computation over every token (accumulation).

Memory is per window only where it must be: a uint16 stamp per window (2 bytes;
200 MB at 10**8 windows) finds duplicates, within a batch too, in O(1) per row,
and a bool per window holds the other seed's membership.  Everything else is
numpy per batch, never Python per row.  `audit_epoch` runs it over an `Epoch`
(and the shares of workers and ranks); `audit_batches` over any iterable of
batch-like objects, so a test can hand it tampered batches and watch it fail.
"""

from __future__ import annotations

from ..stand_in import stand_in_losses
from .check import audit_batches, audit_epoch, audit_packed_epoch
from .result import CHECKS, PACK_CHECKS, RELATIVE_TOLERANCE, AuditResult, PackAuditResult
from .shares import epoch_shares

__all__ = [
    "CHECKS",
    "PACK_CHECKS",
    "RELATIVE_TOLERANCE",
    "AuditResult",
    "PackAuditResult",
    "audit_batches",
    "audit_epoch",
    "audit_packed_epoch",
    "epoch_shares",
    "stand_in_losses",
]
