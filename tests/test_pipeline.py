"""Stages composed end to end against the chapter's worked epoch and its exact outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

import streambatch as sb
from streambatch import chapter


def test_report_is_byte_identical(golden: Path) -> None:
    """The learner report equals the chapter's, byte for byte."""
    assert (golden / "expected-report.txt").read_text() == chapter.learner_report()


def test_trace_is_byte_identical(golden: Path) -> None:
    """The diagram trace equals the chapter's, byte for byte."""
    assert (golden / "expected-trace.txt").read_text() == chapter.diagram_trace()


def test_chapter_numbers() -> None:
    """Shapes [3,2] and [2,2], denominators 6 and 4, the chapter's means and gradients."""
    evidence = chapter.learner_evidence()
    batches = evidence.batches
    assert [b.batch.shape for b in batches] == [(3, 2), (2, 2)]
    assert [b.mean.token_count for b in batches] == [6, 4]
    assert [b.loss_sum for b in batches] == [6.125, 1.75]
    assert batches[0].mean.mean_loss == 6.125 / 6
    assert pytest.approx(1.020833, abs=5e-7) == batches[0].mean.mean_loss
    assert batches[1].mean.mean_loss == 0.4375
    assert pytest.approx([2.041667, 0.979167], abs=5e-7) == batches[0].mean.mean_gradient.tolist()
    assert batches[1].mean.mean_gradient.tolist() == [0.875, 1.5625]
    assert evidence.complete_coverage
    assert evidence.replay_matches
    assert evidence.different_seed_changes_order


def test_stages_composed_by_hand_equal_epoch() -> None:
    """documents -> windows -> order -> chunks -> materialize gives the Epoch's batches."""
    store = sb.DocumentStore.from_documents(iter(chapter.fixture_documents()))
    by_hand = list(sb.materialize(sb.chunk(sb.shuffle(sb.windows(store, context_length=2), seed=7), batch_size=3)))
    assert list(chapter.build_epoch()) == by_hand


def test_audit_of_a_larger_epoch() -> None:
    """The chapter's proof holds for a bigger shuffled epoch too."""
    docs = [sb.Document(f"d{i}", "train", list(range(i * 3))) for i in range(30)]

    def build(seed: int) -> sb.Epoch:
        return sb.Epoch(docs, context_length=4, batch_size=7, stride=3, seed=seed)

    evidence = chapter.epoch_evidence(build(5), build(5), build(6))
    assert chapter.proof_line(evidence).startswith(f"PROOF|coverage={build(5).window_count}/{build(5).window_count}|duplicates=0")
    assert evidence.accumulation_equal


def test_audit_with_one_token_batches() -> None:
    """T = 1, B = 1: every batch has one target token; the halves split as 0 + 1 and still agree."""
    docs = [sb.Document("a", "train", [1, 2, 3])]

    def build(seed: int) -> sb.Epoch:
        return sb.Epoch(docs, context_length=1, batch_size=1, seed=seed)

    evidence = chapter.epoch_evidence(build(1), build(1), build(2))
    assert evidence.accumulation_equal
    assert evidence.complete_coverage
