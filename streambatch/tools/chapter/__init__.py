"""The chapter's worked epoch, its evidence, and its exact report and trace.

Everything printed is computed by the library from the fixture: two training
documents, ``T = 2``, capacity 3, seed 7.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...batch.minibatch import MiniBatch
from ...batch.reduce import TokenContribution, TokenMean, accumulated
from ...epoch import Epoch
from ...model.documents import Document, Partition
from ...stages.chunk import batch_widths, fixed_batch_size
from ..audit import AuditResult, audit_batches
from ..stand_in import stand_in_contributions

CONTEXT_LENGTH = 2
REQUESTED_BATCH_SIZE = 3
SHUFFLE_SEED = 7
TRAIN_A = (0, 10, 11, 12, 1)
TRAIN_B = (0, 20, 21, 1)


def fixture_documents() -> list[Document]:
    """The chapter's two separate training documents."""
    return [
        Document("train-a", Partition.TRAIN, TRAIN_A),
        Document("train-b", Partition.TRAIN, TRAIN_B),
    ]


def build_epoch(seed: int = SHUFFLE_SEED) -> Epoch:
    """The chapter's epoch for *seed*."""
    return Epoch(fixture_documents(), context_length=CONTEXT_LENGTH, batch_size=REQUESTED_BATCH_SIZE, seed=seed)


def batch_contributions(batch: MiniBatch) -> list[TokenContribution]:
    """The chapter's stand-in contributions: loss ``(8d + 2s + t + 1) / 8``, gradient ``[2l, 2 - l]`` (`stand_in`)."""
    return stand_in_contributions(batch.document_indices, batch.starts, batch.context_length)


@dataclass(frozen=True)
class BatchEvidence:
    """One batch's sums, mean and whether merging two halves reproduced it."""

    batch: MiniBatch
    losses: tuple[float, ...]
    loss_sum: float
    mean: TokenMean
    accumulation_matches: bool


def batch_evidence(batch: MiniBatch) -> BatchEvidence:
    """Average the stand-in contributions one pass and as two merged halves."""
    contributions = batch_contributions(batch)
    batch_mean = batch.average_token_contributions(contributions)
    direct = accumulated(contributions, 2)
    mean = direct.finish()
    split = len(contributions) // 2
    left = accumulated(contributions[:split], 2)
    left.merge(accumulated(contributions[split:], 2))
    return BatchEvidence(
        batch=batch,
        losses=tuple(c.loss for c in contributions),
        loss_sum=direct.loss_sum,
        mean=mean,
        accumulation_matches=left.finish() == mean and batch_mean == mean,
    )


@dataclass(frozen=True)
class EpochEvidence:
    """The chapter's proof: coverage, duplicates, padding, partitions, replay, accumulation."""

    epoch: Epoch
    batches: tuple[BatchEvidence, ...]
    audit: AuditResult  # coverage, duplicates, padding, partitions, replay: the library's audit

    @property
    def covered_windows(self) -> int:
        """Distinct expected windows seen."""
        return self.audit.covered_windows

    @property
    def expected_windows(self) -> int:
        """Windows the epoch must hold."""
        return self.audit.expected_windows

    @property
    def duplicate_windows(self) -> int:
        """Rows that repeat a window already seen."""
        return self.audit.duplicate_windows

    @property
    def padding_ids_added(self) -> int:
        """Token ids beyond each batch's rows x T."""
        return self.audit.padding_ids

    @property
    def cross_partition_windows(self) -> int:
        """Rows from documents of another partition."""
        return self.audit.cross_partition_windows

    @property
    def replay_matches(self) -> bool:
        """The same seed gave the same order."""
        return self.audit.replay_matches

    @property
    def different_seed_changes_order(self) -> bool:
        """Another seed changed the order, not the membership."""
        return self.audit.different_seed_changes_order

    @property
    def complete_coverage(self) -> bool:
        """Every expected window seen, none twice."""
        return self.covered_windows == self.expected_windows and self.duplicate_windows == 0

    @property
    def accumulation_equal(self) -> bool:
        """Merged halves equal the one-pass mean in every batch."""
        return all(b.accumulation_matches for b in self.batches)


def epoch_evidence(epoch: Epoch, replay: Epoch, changed: Epoch) -> EpochEvidence:
    """Check *epoch* against every window of its store, a replay and another seed (`streambatch.tools.audit`)."""
    batches = tuple(batch_evidence(b) for b in epoch)
    audit = audit_batches([e.batch for e in batches], epoch, replay=replay, other=changed)
    return EpochEvidence(epoch=epoch, batches=batches, audit=audit)


def learner_evidence() -> EpochEvidence:
    """The chapter's evidence for its fixture epoch."""
    return epoch_evidence(build_epoch(SHUFFLE_SEED), build_epoch(SHUFFLE_SEED), build_epoch(SHUFFLE_SEED + 1))


def historical_update_widths(example_count: int) -> tuple[list[int], list[int], list[int]]:
    """Online, mini-batch (3) and full-set update widths for *example_count* examples.

    >>> historical_update_widths(5)
    ([1, 1, 1, 1, 1], [3, 2], [5])
    """
    return (
        batch_widths(example_count, 1),
        batch_widths(example_count, 3),
        batch_widths(example_count, max(example_count, 1)),
    )


def format_ids(values: Iterable[int]) -> str:
    """``[20, 21]``."""
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def format_values(values: Iterable[float]) -> str:
    """``[1.375000, 1.500000]``: six decimals, as the chapter prints floats."""
    return "[" + ", ".join(f"{v:.6f}" for v in values) + "]"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def learner_report(evidence: EpochEvidence | None = None) -> str:
    """The chapter's learner report, byte for byte."""
    ev = evidence or learner_evidence()
    epoch = ev.epoch
    online, mini, full = historical_update_widths(epoch.window_count)
    lines = [
        "chapter=21-mini-batches",
        f"context_length={epoch.context_length}",
        f"requested_batch_size={epoch.batch_size}",
        f"shuffle_seed={epoch.seed}",
        f"complete_windows={epoch.window_count}",
        f"batch_widths={format_ids(epoch.batch_widths)}",
        f"historical_widths=online:{format_ids(online)} mini_batch:{format_ids(mini)} full_batch:{format_ids(full)}",
    ]
    for item in ev.batches:
        batch = item.batch
        lines.append(
            f"batch[{batch.index}] shape={format_ids(batch.shape)} targets={format_ids(batch.targets.ravel())} "
            f"denominator={batch.token_count} mean_loss={item.mean.mean_loss:.6f} "
            f"mean_gradient={format_values(item.mean.mean_gradient)}"
        )
        for row, origin in enumerate(batch.provenance):
            lines.append(
                f"  row[{row}] origin={origin} input={format_ids(batch.input_row(row))} "
                f"target={format_ids(batch.target_row(row))} losses={format_values(_row_losses(item, row))}"
            )
    final = ev.batches[-1].batch
    lines += [
        f"final_batch_width={final.width}",
        f"final_actual_denominator={final.token_count}",
        f"final_capacity_denominator={_capacity(epoch)}",
        f"all_batches_accumulation_equal={_bool(ev.accumulation_equal)}",
        f"same_seed_replays={_bool(ev.replay_matches)}",
        f"different_seed_changes_order={_bool(ev.different_seed_changes_order)}",
        f"complete_coverage={_bool(ev.complete_coverage)}",
        f"padding_ids_added={ev.padding_ids_added}",
        f"cross_partition_windows={ev.cross_partition_windows}",
        "next=use these token-mean gradients in AdamW",
    ]
    return "\n".join(lines) + "\n"


def _row_losses(item: BatchEvidence, row: int) -> Sequence[float]:
    length = item.batch.context_length
    return item.losses[row * length : (row + 1) * length]


def diagram_trace(evidence: EpochEvidence | None = None) -> str:
    """The chapter's diagram trace, byte for byte."""
    ev = evidence or learner_evidence()
    epoch = ev.epoch
    lines = [
        f"META|context={epoch.context_length}|capacity={epoch.batch_size}|seed={epoch.seed}"
        f"|windows={epoch.window_count}|batches={epoch.batch_count}"
    ]
    slot = 0
    for item in ev.batches:
        batch = item.batch
        for row, origin in enumerate(batch.provenance):
            lines.append(
                f"WINDOW|slot={slot}|batch={batch.index}|row={row}|document={origin.document_id}"
                f"|document_index={origin.document_index}|start={origin.start}"
                f"|input={format_ids(batch.input_row(row))}|target={format_ids(batch.target_row(row))}"
                f"|losses={format_values(_row_losses(item, row))}"
            )
            slot += 1
        lines.append(
            f"BATCH|index={batch.index}|width={batch.width}|shape={format_ids(batch.shape)}"
            f"|tokens={batch.token_count}|loss_sum={item.loss_sum:.6f}|mean_loss={item.mean.mean_loss:.6f}"
            f"|mean_gradient={format_values(item.mean.mean_gradient)}"
            f"|accumulation={'equal' if item.accumulation_matches else 'different'}"
        )
    final = ev.batches[-1].batch
    lines.append(
        f"FINAL|width={final.width}|tokens={final.token_count}"
        f"|capacity_tokens={_capacity(epoch)}|actual_denominator={final.token_count}"
    )
    lines.append(proof_line(ev))
    return "\n".join(lines) + "\n"


def proof_line(ev: EpochEvidence) -> str:
    """``PROOF|coverage=5/5|duplicates=0|...``."""
    return (
        f"PROOF|coverage={ev.covered_windows}/{ev.expected_windows}|duplicates={ev.duplicate_windows}"
        f"|padding={ev.padding_ids_added}|cross_partition={ev.cross_partition_windows}"
        f"|replay={'same' if ev.replay_matches else 'different'}"
        f"|different_seed={'changed' if ev.different_seed_changes_order else 'same'}"
        f"|accumulation={'equal' if ev.accumulation_equal else 'different'}"
    )


def _capacity(epoch: Epoch) -> int:
    """The requested batch's capacity in tokens, ``B * T`` (the chapter's epochs have a fixed size)."""
    return fixed_batch_size(epoch.batch_size, "the chapter's report") * epoch.context_length
