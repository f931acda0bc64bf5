"""``streambatch audit --pack`` and `streambatch.tools.audit` of packed rows: the proof holds, each tampering fails it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import ConfigError
from streambatch.read.jsonl import read_jsonl
from streambatch.tools.audit import audit_packed_epoch
from streambatch.tools.audit.shares import epoch_shares


@st.composite
def corpora(draw: st.DrawFn) -> tuple[list[sb.Document], int]:
    """Documents of 0 and 1 tokens, exactly T + 1, several T, and anything between."""
    T = draw(st.integers(1, 8))
    special = st.sampled_from([0, 1, T, T + 1, 2 * T + 1, 3 * T, 4 * T + 2])
    lengths = draw(st.lists(st.one_of(special, st.integers(0, 5 * T)), min_size=1, max_size=10))
    docs = [sb.Document(f"d{i}", "train", [(7 * i + j) % 1000 for j in range(L)]) for i, L in enumerate(lengths)]
    return docs, T


@settings(max_examples=40, deadline=None)
@given(corpora(), st.integers(1, 6), st.one_of(st.none(), st.integers(0, 2**64 - 1)), st.integers(1, 3), st.integers(1, 3))
def test_packed_audit_passes_for_every_epoch(
    corpus: tuple[list[sb.Document], int], B: int, seed: int | None, workers: int, world: int
) -> None:
    docs, T = corpus
    epoch = sb.Epoch(docs, context_length=T, batch_size=B, seed=seed, pack=True)
    result = audit_packed_epoch(epoch, workers=workers, world_size=world)
    targets = sum(max(len(d.tokens) - 1, 0) for d in docs)
    assert result.targets == result.covered_targets == targets
    assert result.real_positions == result.denominator == targets
    assert result.rows == result.expected_rows == len(epoch.items)
    assert result.different_seed in (("changed", "same") if len(epoch.items) >= 2 else ("n/a",))
    if result.different_seed == "same":  # two rows can keep their order under another seed: the audit says so
        assert set(result.failures) == {"different_seed"}
        return
    assert result.ok, result.failures


def copy(batch: Any, **changes: Any) -> SimpleNamespace:
    """A batch-like copy of a packed batch, with *changes*."""
    fields = {
        name: np.array(getattr(batch, name))
        for name in (
            "row_numbers",
            "inputs",
            "targets",
            "segment_ids",
            "position_ids",
            "loss_mask",
            "document_indices",
            "starts",
            "segment_lengths",
            "segment_rows",
        )
    }
    fields.update(index=batch.index, token_count=batch.token_count, target_count=batch.target_count)
    fields.update(changes)
    return SimpleNamespace(**fields)


@pytest.fixture
def epoch() -> sb.Epoch:
    lengths = [1, 5, 9, 3, 2, 12, 7, 4]
    docs = [sb.Document(f"d{i}", "train", [100 + 10 * i + j for j in range(L)]) for i, L in enumerate(lengths)]
    return sb.Epoch(docs, context_length=4, batch_size=3, seed=11, pack=True)


def first_padded(batches: list[Any]) -> int:
    return next(i for i, b in enumerate(batches) if not np.asarray(b.loss_mask).all())


def tamper(batches: list[Any], how: str) -> list[Any]:
    out = [copy(b) for b in batches]
    b = out[0]
    if how == "drop":
        return out[1:]
    if how == "repeat":
        return [*out, out[0]]
    if how == "reorder":  # the same batches in another order: a pass the same seed does not replay
        return [out[1], out[0], *out[2:]]
    if how == "content":
        b.inputs[0, 0] += 1
    elif how == "positions":
        b.position_ids[0, 1] += 1
    elif how == "segments":
        b.segment_ids[0, 0] = 5
    elif how == "cross_document":
        b.starts[0] += 1  # its last target now lies beyond the document
    elif how in ("pad_unmasked", "pad_counted"):
        p = out[first_padded(out)]
        if how == "pad_unmasked":
            p.loss_mask[~np.asarray(p.loss_mask)] = True
        else:
            p.token_count = p.target_count = int(np.asarray(p.loss_mask).size)
    return out


@pytest.mark.parametrize(
    ("how", "check"),
    [
        ("drop", "coverage"),
        ("repeat", "duplicates"),
        ("content", "content"),
        ("positions", "positions"),
        ("segments", "segments"),
        ("cross_document", "cross_document"),
        ("pad_unmasked", "padding"),
        ("pad_counted", "padding"),
        ("reorder", "replay"),
    ],
)
def test_each_tampering_fails_its_check(epoch: sb.Epoch, how: str, check: str) -> None:
    batches = list(epoch_shares(epoch))
    assert audit_packed_epoch(epoch, batches=[copy(b) for b in batches]).ok
    result = audit_packed_epoch(epoch, batches=tamper(batches, how))
    assert check in result.failures, result.failures
    assert not result.ok
    if how.startswith("pad"):  # padding in a sum or a denominator moves the token mean too
        assert "accumulation" in result.failures


def test_audit_packed_epoch_refuses_a_window_epoch(epoch: sb.Epoch) -> None:
    with pytest.raises(ConfigError, match="pack=True"):
        audit_packed_epoch(sb.Epoch(epoch.store, context_length=4, batch_size=3, seed=1))
    with pytest.raises(ConfigError, match="equals the epoch's seed"):
        audit_packed_epoch(epoch, other_seed=11)


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    rng = np.random.default_rng(3)
    lines = [
        json.dumps({"id": f"d{i}", "partition": "train", "tokens": rng.integers(0, 500, int(L)).tolist()})
        for i, L in enumerate(rng.integers(0, 60, 40))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_audit_pack(jsonl: Path) -> None:
    status, text = run(
        ["audit", str(jsonl), "-T", "8", "-B", "4", "--seed", "3", "--pack", "--workers", "2", "--world-size", "2"]
    )
    assert status == 0, text
    proof = text.splitlines()[0]
    epoch = sb.Epoch(read_jsonl(jsonl), context_length=8, batch_size=4, seed=3, pack=True)
    targets = epoch.items.report.targets
    assert proof.startswith(f"PROOF|mode=pack|targets={targets}/{targets}|duplicates=0|cross_document=0")
    assert proof.endswith("|replay=same|different_seed=changed|accumulation=equal")
    status, text = run(["audit", str(jsonl), "-T", "8", "-B", "4", "--sequential", "--pack", "--json"])
    assert status == 0
    result = json.loads(text)
    assert (result["ok"], result["mode"], result["covered_targets"], result["denominator"]) == (True, "pack", targets, targets)


def test_cli_audit_pack_refuses_stride(jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = run(["audit", str(jsonl), "-T", "8", "-B", "4", "--seed", "3", "--pack", "--stride", "8"])
    assert status == 2
    assert "--pack with --stride 8" in capsys.readouterr().err


def test_one_audit_for_both_kinds(epoch: sb.Epoch) -> None:
    """`audit_epoch` audits a packed epoch with the packed proof; `audit_batches` reads packed batches as they come."""
    from streambatch.tools.audit import PackAuditResult, audit_batches, audit_epoch

    whole = audit_epoch(epoch, workers=2)
    assert isinstance(whole, PackAuditResult)
    assert whole.proof_line() == audit_packed_epoch(epoch, workers=2).proof_line()
    assert whole.ok
    alone = audit_batches(list(epoch), epoch)  # no replay, no other seed: those read unchecked
    assert isinstance(alone, PackAuditResult)
    assert (alone.ok, alone.replay, alone.different_seed) == (True, "unchecked", "unchecked")
    assert alone.covered_targets == alone.targets == epoch.items.report.targets
    tampered = [copy(b) for b in epoch]
    tampered[0].segment_ids = np.zeros_like(tampered[0].segment_ids)  # a padded position claims segment 0
    assert audit_batches(tampered, epoch).first_failure[0] == "segments"


def test_a_window_batch_is_checked_without_packed_columns() -> None:
    """A window epoch's batches carry no packed column; the same checks read each row as one segment of T targets."""
    from streambatch.tools.audit import AuditResult, audit_batches

    docs = [sb.Document(f"d{i}", "train", [(5 * i + j) % 97 for j in range(L)]) for i, L in enumerate([9, 4, 13, 6])]
    windows = sb.Epoch(docs, context_length=3, batch_size=4, seed=2)
    batches = list(windows)
    assert all(b.segment_ids is None and b.loss_mask is None for b in batches)
    result = audit_batches(batches, windows)
    assert isinstance(result, AuditResult)
    assert result.ok
    assert result.covered_windows == windows.window_count
