"""Stages composed end to end against the chapter's worked epoch and its exact outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.tools import chapter
from tests import spec
from tests.strategies import configs, documents, seeds


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


def _oracle(docs: list[sb.Document], T: int, stride: int, B: int, seed: int | None) -> list[list[tuple[int, int]]]:
    """The epoch by plain loops: windows in document order, the spec's Fisher–Yates, chunks of B."""
    windows = [(d, s) for d, doc in enumerate(docs) for s in range(0, len(doc), stride) if s + T + 1 <= len(doc)]
    if seed is not None:
        order, _ = spec.fisher_yates(len(windows), seed)
        windows = [windows[i] for i in order]
    return [windows[i : i + B] for i in range(0, len(windows), B)]


@given(documents(), configs, seeds, st.integers(1, 4), st.integers(1, 4))
def test_composed_pipeline_equals_epoch(
    docs: list[sb.Document], config: dict[str, int], seed: int | None, workers: int, world: int
) -> None:
    """By hand (windows -> shuffle -> chunk -> shard -> split_rows -> materialize) = Epoch = plain loops."""
    T, stride, B = config["context_length"], config["stride"], config["batch_size"]
    epoch = sb.Epoch(docs, seed=seed, **config)
    store = sb.DocumentStore.from_documents(d for d in docs)
    windows = sb.windows(store, context_length=T, stride=stride)
    if seed is not None:
        windows = sb.shuffle(windows, seed)
    expected = _oracle(docs, T, stride, B, seed)
    union: dict[int, list[tuple[int, int]]] = {}
    for worker in range(workers):
        for rank in range(world):
            chunks = sb.share(sb.chunk(windows, B), worker=worker, workers=workers, rank=rank, world_size=world)
            by_hand = list(sb.materialize(chunks))
            assert by_hand == list(epoch.iter_batches(worker, step=workers, rank=rank, world_size=world))
            # the same stages over plain iterators (the generic, non-indexable path)
            shared = sb.share(iter(sb.chunk(windows, B)), worker=worker, workers=workers)
            plain = sb.materialize(sb.split_rows(shared, rank, world))
            assert by_hand == list(plain)
            for batch in by_hand:
                rows = [(p.document_index, p.start) for p in batch.provenance]
                union.setdefault(batch.index, []).extend(rows)  # ranks in order: contiguous shares
                for row, (d, s) in enumerate(rows):
                    assert docs[d].tokens[s : s + T].tolist() == batch.input_row(row).tolist()
                    assert docs[d].tokens[s + 1 : s + T + 1].tolist() == batch.target_row(row).tolist()
    assert [union[i] for i in sorted(union)] == expected
    assert [[(p.document_index, p.start) for p in b.provenance] for b in epoch] == expected


def test_a_filter_between_reader_and_store(tmp_path: Path) -> None:
    """Ordinary Python between stages: a generator drops documents shorter than one window."""
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "tokens": [1, 2, 3, 4]}\n{"id": "short", "tokens": [1]}\n{"input_ids": [5, 6, 7]}\n')
    docs = (d for d in sb.iter_jsonl(path) if len(d) > 2)
    store = sb.DocumentStore.from_documents(docs)
    assert store.ids == ("a", "3")
    batches = list(sb.materialize(sb.chunk(sb.windows(store, context_length=2), batch_size=2)))
    assert [b.inputs.tolist() for b in batches] == [[[1, 2], [2, 3]], [[5, 6]]]
