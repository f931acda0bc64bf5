"""Tests for `streambatch.tools.audit` and ``streambatch audit``: the PROOF line holds, and tampering breaks it."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.tools import chapter
from streambatch.tools.audit import CHECKS, audit_batches, audit_epoch, epoch_shares, stand_in_losses
from tests.strategies import configs, documents

CHAPTER_PROOF = (
    "PROOF|coverage=5/5|duplicates=0|padding=0|cross_partition=0|replay=same|different_seed=changed"
    "|accumulation=equal|cross_document=0"
)


@dataclass
class FakeBatch:
    """A batch-like object a test can tamper with."""

    index: int
    inputs: Any
    targets: Any
    document_indices: Any
    starts: Any


def fake(batch: sb.MiniBatch) -> FakeBatch:
    return FakeBatch(batch.index, batch.inputs.copy(), batch.targets.copy(), batch.document_indices.copy(), batch.starts.copy())


def with_row(batch: FakeBatch, store: sb.DocumentStore, document: int, start: int, at: int | None = None) -> FakeBatch:
    """*batch* with the window (document, start) put at row *at* (appended when None), its ids read from the flat tokens."""
    T = batch.inputs.shape[1]
    first = int(store.starts[document]) + start
    ids = np.asarray(store.tokens[first : first + T + 1])
    rows = [batch.inputs, batch.targets, batch.document_indices, batch.starts]
    values = [ids[:T], ids[1:], document, start]
    if at is None:
        rows = [np.concatenate([r, np.asarray([v])]) for r, v in zip(rows, values, strict=True)]
    else:
        for r, v in zip(rows, values, strict=True):
            r[at] = v
    return replace(batch, inputs=rows[0], targets=rows[1], document_indices=rows[2], starts=rows[3])


@pytest.fixture
def epoch() -> sb.Epoch:
    return chapter.build_epoch()


@pytest.fixture
def mixed() -> sb.Epoch:
    """The chapter's train documents plus a validation document, in one store; the train epoch, seed 7."""
    docs = [*chapter.fixture_documents(), sb.Document("val-a", "validation", [0, 30, 31, 32, 1])]
    return sb.Epoch(sb.DocumentStore.from_documents(docs), context_length=2, batch_size=3, seed=7, keep_partition=True)


def test_chapter_epoch_proves_the_chapter_line(epoch: sb.Epoch) -> None:
    """The chapter's epoch: the chapter's PROOF line, plus cross_document=0."""
    result = audit_epoch(epoch)
    assert CHAPTER_PROOF == result.proof_line()
    assert chapter.proof_line(chapter.learner_evidence()) == result.proof_line(cross_document=False)
    assert (True, None, 5, 2, 10) == (result.ok, result.first_failure, result.rows, result.batches, result.token_count)
    assert 0.7875 == result.folded_mean.mean_loss == result.direct_mean.mean_loss  # (6.125 + 1.75) / 10


def test_stand_in_losses_are_the_chapters_on_its_fixture(epoch: sb.Epoch) -> None:
    """On the fixture the audit's loss is the chapter's (8d + 2s + t + 1) / 8; at scale it wraps mod 8."""
    for evidence in chapter.learner_evidence().batches:
        batch = evidence.batch
        assert list(evidence.losses) == stand_in_losses(batch.document_indices, batch.starts, 2).ravel().tolist()
    assert [[0.125, 0.25]] == stand_in_losses([8], [32], 2).tolist()


def test_chapter_evidence_reuses_the_audit() -> None:
    """The chapter's evidence carries the audit it was computed from."""
    evidence = chapter.learner_evidence()
    assert evidence.audit.ok
    assert (5, 5, 0, 0, 0) == (
        evidence.covered_windows,
        evidence.expected_windows,
        evidence.duplicate_windows,
        evidence.padding_ids_added,
        evidence.cross_partition_windows,
    )


# -- tampered batches: the audit can fail ------------------------------------------------------


def test_duplicated_row_fails(epoch: sb.Epoch) -> None:
    """Row 1 of batch 0 replaced by a copy of row 0: one duplicate, one window missing."""
    first, second = fake(epoch[0]), fake(epoch[1])
    tampered = with_row(first, epoch.store, 1, 1, at=1)  # train-b@1 again
    result = audit_batches([tampered, second], epoch)
    assert ("duplicates", "batch 0 row 1: window train-b@1 (document index 1) appears more than once") == result.first_failure
    assert (1, 4) == (result.duplicate_windows, result.covered_windows)
    assert {"duplicates", "coverage", "accumulation"} == set(result.failures)
    assert result.proof_line().startswith("PROOF|coverage=4/5|duplicates=1|padding=0|")


def test_duplicated_batch_fails(epoch: sb.Epoch) -> None:
    """A whole batch seen twice: three duplicates and a batch with six rows."""
    result = audit_batches([epoch[0], epoch[0], epoch[1]], epoch)
    assert (3, 5) == (result.duplicate_windows, result.covered_windows)
    assert "duplicates" == result.first_failure[0]
    assert "batch 0 has 6 rows; expected 3" in result.failures["widths"]


def test_padded_row_fails(epoch: sb.Epoch) -> None:
    """The final batch padded to capacity with a row of pad ids: 4 padding ids, width 3, a wrong denominator."""
    final = fake(epoch[1])
    padded = replace(final, inputs=np.vstack([final.inputs, [[0, 0]]]), targets=np.vstack([final.targets, [[0, 0]]]))
    result = audit_batches([epoch[0], padded], epoch)
    assert "padding" == result.first_failure[0]
    assert "batch 1: 4 ids beyond its 2 rows of 2 (shape [3, 2])" == result.failures["padding"]
    assert 4 == result.padding_ids
    assert {"padding", "widths", "accumulation"} == set(result.failures)
    assert 12 == result.folded_mean.token_count  # divided by capacity 6, not 4: the mean is wrong


def test_altered_ids_count_as_padding(epoch: sb.Epoch) -> None:
    """A target id replaced by a pad id: the row's ids no longer match its document."""
    final = fake(epoch[1])
    final.targets[1, 1] = 0
    result = audit_batches([epoch[0], final], epoch)
    assert (1, "padding") == (result.padding_ids, result.first_failure[0])
    assert "batch 1 row 1: train-a@2 (document index 0): ids differ" in result.failures["padding"]


def test_row_from_another_partition_fails(mixed: sb.Epoch) -> None:
    """A validation window added to the final batch: cross_partition=1."""
    tampered = with_row(fake(mixed[1]), mixed.store, 2, 0)
    result = audit_batches([mixed[0], tampered], mixed)
    assert 1 == result.cross_partition_windows
    assert ("cross_partition", "batch 1 row 2: val-a@0 (document index 2): the document is in another partition") == (
        result.first_failure
    )
    assert result.proof_line().startswith("PROOF|coverage=5/5|duplicates=0|padding=0|cross_partition=1|")


def test_window_crossing_documents_fails(epoch: sb.Epoch) -> None:
    """train-a@3 reads train-a's last two tokens and train-b's first: cross_document=1."""
    tampered = with_row(fake(epoch[1]), epoch.store, 0, 3, at=1)  # ids [12, 1] -> [1, 0]: across the boundary
    assert [[1, 0]] == tampered.targets[1:].tolist()
    result = audit_batches([epoch[0], tampered], epoch)
    assert 1 == result.cross_document_windows
    assert (
        "cross_document",
        "batch 1 row 1: train-a@3 (document index 0): its T + 1 tokens leave the document",
    ) == result.first_failure
    assert result.proof_line().endswith("|cross_document=1")


def test_off_grid_row_is_no_window_of_the_epoch() -> None:
    """With stride 2 a row starting at 1 is inside its document but no window of the epoch."""
    doc = sb.Document("a", "train", range(9))
    strided = sb.Epoch([doc], context_length=2, batch_size=8, stride=2, seed=None)
    tampered = with_row(fake(strided[0]), strided.store, 0, 1)
    result = audit_batches([tampered], strided)
    assert (1, "coverage") == (result.foreign_windows, result.first_failure[0])
    assert "off the stride-2 grid" in result.failures["coverage"]


def test_dropped_final_batch_fails(epoch: sb.Epoch) -> None:
    """Dropping the final batch loses two windows: coverage 3/5, the first missing one named."""
    result = audit_batches([epoch[0]], epoch)
    assert ("coverage", "2 of 5 windows never appeared; the first is train-a@0 (document index 0)") == result.first_failure
    assert {"coverage", "widths", "accumulation"} == set(result.failures)


def test_batch_index_outside_the_epoch_fails(epoch: sb.Epoch) -> None:
    """A batch claiming index 7 of a two-batch epoch."""
    moved = replace(fake(epoch[1]), index=7)
    result = audit_batches([epoch[0], moved], epoch)
    assert "batch index 7 is outside the epoch's 2 batches" == result.failures["widths"]


def test_replay_and_other_seed_are_compared(epoch: sb.Epoch) -> None:
    """Another order as the replay fails replay; the same order as the other seed fails different_seed."""
    bad_replay = audit_batches(epoch, epoch, replay=epoch.reseeded(8), other=epoch.reseeded(8))
    assert ("different", "replay") == (bad_replay.replay, bad_replay.first_failure[0])
    same_order = audit_batches(epoch, epoch, replay=epoch.reseeded(7), other=epoch.reseeded(7))
    assert ("same", "different_seed") == (same_order.different_seed, same_order.first_failure[0])
    fewer = audit_batches(epoch, epoch, other=list(epoch.reseeded(8))[:1])
    assert "windows_changed" == fewer.different_seed
    unchecked = audit_batches(epoch, epoch)
    assert ("unchecked", "unchecked", True) == (unchecked.replay, unchecked.different_seed, unchecked.ok)


def test_failures_follow_the_check_order(epoch: sb.Epoch) -> None:
    """failures lists checks in CHECKS order (causes first)."""
    final = fake(epoch[1])
    padded = replace(final, inputs=np.vstack([final.inputs, [[0, 0]]]), targets=np.vstack([final.targets, [[0, 0]]]))
    result = audit_batches([epoch[0], epoch[0], padded], epoch)
    assert list(result.failures) == [c for c in CHECKS if c in result.failures]
    # batch 0 twice: its targets are counted twice its global_token_count (the counted-once hook)
    assert ["padding", "duplicates", "widths", "accumulation", "global_count"] == list(result.failures)


# -- shares, orders, sizes ---------------------------------------------------------------------


def test_shares_of_workers_and_ranks_are_audited_as_one_epoch() -> None:
    """Every (rank, worker) share is iterated; the union is the epoch; missing one share fails."""
    docs = [sb.Document(f"d{i}", "train", range(10 + 3 * i)) for i in range(7)]
    epoch = sb.Epoch(docs, context_length=3, batch_size=5, stride=2, seed=11)
    result = audit_epoch(epoch, workers=3, world_size=2)
    assert result.ok
    assert (epoch.window_count, 2 * epoch.batch_count) == (result.rows, result.batches)
    shares = list(epoch_shares(epoch, workers=3, world_size=2))
    partial = audit_batches(shares[1:], epoch)  # rank 0's worker 0 left out
    # a share left out: its batch's shares count less than their global_token_count
    assert {"coverage", "widths", "accumulation", "global_count"} == set(partial.failures)


def test_sequential_epoch_is_compared_with_a_shuffle() -> None:
    """A sequential epoch replays and differs from the seed-0 shuffle."""
    epoch = sb.Epoch([sb.Document("a", "train", range(12))], context_length=2, batch_size=4, seed=None)
    result = audit_epoch(epoch)
    assert (True, "same", "changed") == (result.ok, result.replay, result.different_seed)


def test_tiny_and_empty_epochs() -> None:
    """One window has one order (n/a); no window: coverage 0/0, nothing to average, still a proof."""
    one = audit_epoch(sb.Epoch([sb.Document("a", "train", [1, 2])], context_length=1, batch_size=2, seed=1))
    assert (True, "n/a") == (one.ok, one.different_seed)
    empty = audit_epoch(sb.Epoch([sb.Document("a", "train", [1])], context_length=1, batch_size=2, seed=1))
    assert empty.ok
    assert (
        "PROOF|coverage=0/0|duplicates=0|padding=0|cross_partition=0|replay=same|different_seed=n/a"
        "|accumulation=equal|cross_document=0"
    ) == empty.proof_line()


def test_duplicates_in_batches_wider_than_a_stamp_block() -> None:
    """Rows beyond 65,535 in one batch are stamped in blocks; a duplicate across blocks is found."""
    store = sb.DocumentStore.from_arrays(np.zeros(70_002, dtype=np.uint16), [0, 70_002])
    epoch = sb.Epoch(store, context_length=1, batch_size=70_001, seed=None)
    batch = fake(epoch[0])
    tampered = with_row(batch, store, 0, 3, at=69_000)  # window 3 again, 69,000 rows later
    result = audit_batches([tampered], epoch)
    assert (1, "duplicates") == (result.duplicate_windows, result.first_failure[0])
    assert "batch 0 row 69000" in result.failures["duplicates"]
    assert audit_epoch(epoch).ok


def test_other_seed_must_differ(epoch: sb.Epoch) -> None:
    """other_seed equal to the seed cannot prove anything about order."""
    with pytest.raises(sb.ConfigError, match="other_seed=7 equals the epoch's seed"):
        audit_epoch(epoch, other_seed=7)
    with pytest.raises(sb.ConfigError, match="workers=0 must be a positive int"):
        epoch_shares(epoch, workers=0)


@given(documents(), configs, st.integers(0, 2**64 - 1), st.integers(1, 3), st.integers(1, 3))
def test_any_epoch_passes(docs: list[sb.Document], config: dict[str, int], seed: int, workers: int, world: int) -> None:
    """Property: every epoch the library builds passes its audit, with any split into shares."""
    epoch = sb.Epoch(docs, seed=seed, **config)
    result = audit_epoch(epoch, workers=workers, world_size=world)
    assert result.failures == {} or set(result.failures) == {"different_seed"}  # tiny epochs may keep their order
    assert epoch.window_count == result.covered_windows == result.rows


@given(documents(), configs, st.integers(0, 2**64 - 1), st.data())
def test_any_dropped_or_repeated_row_fails(
    docs: list[sb.Document], config: dict[str, int], seed: int, data: st.DataObject
) -> None:
    """Property: removing one row, or repeating one, always fails the audit."""
    epoch = sb.Epoch(docs, seed=seed, **config)
    if not epoch.window_count:
        return
    batches = [fake(b) for b in epoch]
    b = data.draw(st.integers(0, len(batches) - 1))
    r = data.draw(st.integers(0, batches[b].inputs.shape[0] - 1))
    keep = np.arange(batches[b].inputs.shape[0]) != r
    dropped = list(batches)
    dropped[b] = replace(
        batches[b],
        inputs=batches[b].inputs[keep],
        targets=batches[b].targets[keep],
        document_indices=batches[b].document_indices[keep],
        starts=batches[b].starts[keep],
    )
    assert "coverage" in audit_batches(dropped, epoch).failures
    repeated = list(batches)
    repeated[b] = with_row(batches[b], epoch.store, int(batches[b].document_indices[r]), int(batches[b].starts[r]))
    assert "duplicates" == audit_batches(repeated, epoch).first_failure[0]


# -- the command ---------------------------------------------------------------------------------


@pytest.fixture
def fixture_file(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text(
        '{"id": "train-a", "partition": "train", "tokens": [0, 10, 11, 12, 1]}\n'
        '{"id": "train-b", "partition": "train", "tokens": [0, 20, 21, 1]}\n'
        '{"id": "val-a", "partition": "validation", "tokens": [0, 30, 31, 32, 1]}\n'
    )
    return path


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def test_cli_audit_prints_the_proof_line(fixture_file: Path) -> None:
    """`streambatch audit` on the chapter's documents (a validation document beside them): the PROOF line, a summary."""
    status, text = run(["audit", str(fixture_file), "--keep-partition", "-T", "2", "-B", "3", "--seed", "7", "--quiet"])
    lines = text.splitlines()
    assert 0 == status
    assert CHAPTER_PROOF == lines[0]
    assert "epoch: 5 windows of T=2 (stride 1, partition train) in 2 batches [3] x 1 + [2], seed 7" == lines[1]
    assert "token mean: 0.787500 folded from batch raw sums, 0.787500 direct over 10 target tokens" == lines[2]
    assert "tokens: in 9 = out 9 + left out 0 (documents shorter than T + 1: 0, tails and stride gaps: 0)" == lines[3]
    assert re.fullmatch(r"time: \d+\.\d\d s, [\d.]+( [kMG])? windows/s", lines[4])
    assert 5 == len(lines)


def test_cli_audit_shares_sequential_and_json(fixture_file: Path) -> None:
    """--workers/--world-size report the shares; --sequential audits document order; --json for scripts."""
    status, text = run(
        [
            "audit",
            str(fixture_file),
            "--keep-partition",
            "-T",
            "2",
            "-B",
            "2",
            "--sequential",
            "--workers",
            "2",
            "--world-size",
            "3",
        ]
    )
    assert 0 == status
    assert "shares: 3 ranks x 2 workers, 6 pieces (shares that can hold rows), union checked" == text.splitlines()[2]
    status, text = run(
        [
            "audit",
            str(fixture_file),
            "--keep-partition",
            "-T",
            "2",
            "-B",
            "3",
            "--seed",
            "7",
            "--json",
            "--partition",
            "validation",
        ]
    )
    result = json.loads(text)
    assert (0, True, 3, {}) == (status, result["ok"], result["expected_windows"], result["failures"])
    assert result["proof"].startswith("PROOF|coverage=3/3|")


def test_cli_audit_failure_exits_1_naming_the_check(
    fixture_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed proof: PROOF and FAIL lines on stdout, one line on stderr naming the first failed check, status 1."""
    import streambatch.cli.audit as command

    def tampered(epoch: sb.Epoch, **_: Any) -> Any:
        return audit_batches([epoch[0], epoch[0], epoch[1]], epoch)

    monkeypatch.setattr(command, "audit_epoch", tampered)
    status, text = run(["audit", str(fixture_file), "--keep-partition", "-T", "2", "-B", "3", "--seed", "7"])
    assert 1 == status
    lines = text.splitlines()
    assert lines[0].startswith("PROOF|coverage=5/5|duplicates=3|padding=0|")
    assert "FAIL|check=duplicates|batch 0 row 0: window train-b@1 (document index 1) appears more than once" == lines[1]
    assert "FAIL|check=widths|" in lines[2]
    assert [
        "streambatch: audit failed: duplicates: batch 0 row 0: window train-b@1 (document index 1) appears more than once"
    ] == (capsys.readouterr().err.splitlines())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "{file}", "-T", "2", "-B", "3"], "one of the arguments --seed --sequential is required"),
        (["audit", "{file}", "-B", "3", "--seed", "1"], "the following arguments are required: --context-length/-T"),
        (["audit", "{file}", "-T", "0", "-B", "3", "--seed", "1"], "context_length=0 must be a positive int"),
        (
            ["audit", "{file}", "--keep-partition", "-T", "2", "-B", "3", "--seed", "1", "--workers", "0"],
            "workers=0 must be a positive int",
        ),
        (
            ["audit", "{file}", "--keep-partition", "-T", "2", "-B", "3", "--seed", "1", "--other-seed", "1"],
            "other_seed=1 equals",
        ),
        (["audit", "{missing}", "-T", "2", "-B", "3", "--seed", "1"], "cannot open"),
    ],
    ids=["no-order", "no-T", "T0", "workers", "other-seed", "missing"],
)
def test_cli_audit_bad_input_exits_2(
    argv: list[str], message: str, fixture_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: exit 2, one line on stderr, nothing on stdout."""
    filled = [a.format(file=fixture_file, missing=tmp_path / "missing.jsonl") for a in argv]
    status, text = run(filled)
    err = capsys.readouterr().err
    assert (2, "") == (status, text)
    assert 1 == len(err.splitlines())
    assert re.search(message, err)


def test_progress_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, epoch: sb.Epoch) -> None:
    """progress=None draws tqdm bars when stderr is a terminal; never with progress=False or without tqdm."""
    import sys

    from streambatch._progress import NoBar, bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    drawn = bar(5, desc="audit", unit=" windows", progress=None)
    assert "tqdm" == type(drawn).__name__
    drawn.close()
    assert isinstance(bar(5, desc="audit", unit=" windows", progress=False), NoBar)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the progress extra not installed
    assert isinstance(bar(5, desc="audit", unit=" windows", progress=True), NoBar)
    assert audit_epoch(epoch, progress=True).ok
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert isinstance(bar(5, desc="audit", unit=" windows", progress=None), NoBar)
