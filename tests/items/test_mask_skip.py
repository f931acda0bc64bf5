"""Tests for ``skip_untrained`` and the mask kernels (`streambatch.items.untrained`, ``streambatch._row_gather``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.cli import main
from streambatch.errors import ConfigError
from streambatch.items.pack import rows as rows_module
from streambatch.model.mask import pack_mask, target_mask, target_mask_numpy

needs_c = pytest.mark.skipif(not _kernels.available()["mask_bits"], reason="the C mask kernel is not built")


@st.composite
def sparse_corpora(draw: Any) -> list[sb.Document]:
    """Documents whose masks train few targets (so windows and rows with none are common), some trained whole."""
    docs = []
    for i in range(draw(st.integers(1, 6))):
        length = draw(st.integers(2, 40))
        tokens = draw(st.lists(st.integers(0, 300), min_size=length, max_size=length))
        if draw(st.integers(0, 4)) == 0:
            docs.append(sb.Document(f"d{i}", "train", tokens))  # no mask of its own: every target trains
            continue
        mask = [False] * length
        for spot in draw(st.lists(st.integers(1, length - 1), min_size=1, max_size=3)):
            mask[spot] = True  # at least one trained target: the readers refuse documents with none
        docs.append(sb.Document(f"d{i}", "train", tokens, loss_mask=mask))
    return docs


def _direct_window_targets(docs: list[sb.Document], T: int, stride: int) -> list[int]:
    """Counted targets of every window, in document order, from the documents' masks alone."""
    out = []
    for doc in docs:
        mask = np.ones(len(doc.tokens), bool) if doc.loss_mask is None else np.asarray(doc.loss_mask, bool)
        for start in range(0, len(doc.tokens) - T, stride):
            out.append(int(mask[start + 1 : start + T + 1].sum()))
    return out


@settings(max_examples=60, deadline=None)
@given(docs=sparse_corpora(), T=st.integers(1, 8), stride=st.integers(1, 8), size=st.integers(1, 5), seed=st.integers(0, 99))
def test_skip_untrained_windows(docs: list[sb.Document], T: int, stride: int, size: int, seed: int) -> None:
    counted = _direct_window_targets(docs, T, stride)
    every = sb.windows(docs, context_length=T, stride=stride)
    assert len(every) == len(counted)
    assert every.untrained is None
    kept = sb.windows(docs, context_length=T, stride=stride, skip_untrained=True)
    report = kept.untrained
    assert report.kept + report.dropped == len(every) == len(counted)
    assert report.dropped == sum(c == 0 for c in counted)
    assert kept.positions().tolist() == [p for p, c in zip(every.positions().tolist(), counted, strict=True) if c > 0]
    epoch = sb.Epoch(kept, batch_size=size, seed=seed)
    assert epoch.window_count == report.kept
    for batch in epoch:
        assert batch.loss_mask is None or batch.loss_mask.any(axis=1).all()  # every kept window trains
    total = sum(b.token_count for b in sb.Epoch(docs, context_length=T, stride=stride, batch_size=size, seed=seed))
    assert sum(b.token_count for b in epoch) == total == sum(counted)  # nothing trained is lost


@settings(max_examples=50, deadline=None)
@given(docs=sparse_corpora(), T=st.integers(1, 8), size=st.integers(1, 5), seed=st.integers(0, 99))
def test_skip_untrained_rows(docs: list[sb.Document], T: int, size: int, seed: int) -> None:
    every = sb.pack(docs, context_length=T)
    per_row = np.array([b.loss_mask.sum() for b in sb.materialize(sb.chunk(every, 1))], dtype=np.int64)
    kept = sb.pack(docs, context_length=T, skip_untrained=True)
    report = kept.untrained  # pieces are dropped before packing (tests/items/test_untrained_mix.py counts them)
    full = every.packing.full_rows
    assert kept.numbers()[kept.numbers() < full].tolist() == np.flatnonzero(per_row[:full] > 0).tolist()
    assert report.kept == len(kept)
    assert report.dropped >= int(np.count_nonzero(per_row[:full] == 0))
    epoch = sb.Epoch(kept, batch_size=size, seed=seed)
    for batch in epoch:
        assert batch.loss_mask.any(axis=1).all()
        assert batch.token_count == int(batch.loss_mask.sum())
    assert sum(b.token_count for b in epoch) == int(per_row.sum())


def test_skip_untrained_through_plans_runs_and_the_cli(tmp_path: Path) -> None:
    docs = [
        sb.Document("a", "train", list(range(30)), loss_mask=[0] * 20 + [1] * 10),
        sb.Document("b", "train", list(range(12)), loss_mask=[0] * 11 + [1]),
    ]
    plain = sb.Epoch(docs, context_length=4, stride=4, batch_size=2, seed=3, plan_dir=tmp_path / "p")
    kept = sb.Epoch(docs, context_length=4, stride=4, batch_size=2, seed=3, plan_dir=tmp_path / "p", skip_untrained=True)
    assert (plain.window_count, kept.window_count) == (9, 3)
    assert sum(b.token_count for b in plain) == 9  # its plan file written
    assert [b.token_count for b in kept] == [b.token_count for b in sb.Epoch(kept.items, batch_size=2, seed=3)]
    assert len(list((tmp_path / "p").glob("*.plan"))) == 2  # the filter is in the plan's key: two files
    run = sb.Run(docs, context_length=4, stride=4, batch_size=2, seed=3, epochs=2, skip_untrained=True)
    assert sum(1 for _ in run) == 2 * kept.batch_count
    with pytest.raises(ConfigError, match="skip_untrained"):
        sb.Epoch(sb.windows(docs, context_length=4), batch_size=2, seed=1, skip_untrained=True)
    store = tmp_path / "store"
    sb.write_store(store, sb.DocumentStore.from_documents(docs))
    out = io.StringIO()
    status = main(["epoch", str(store), "-T", "4", "-B", "2", "--stride", "4", "--seed", "3", "--skip-untrained"], out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert status == 0
    assert sum(len(r["inputs"]) for r in records) == 3
    assert all(any(row) for r in records for row in r["loss_mask"])  # epoch records carry the mask
    out = io.StringIO()
    assert main(["audit", str(store), "-T", "4", "-B", "2", "--stride", "4", "--seed", "3", "--skip-untrained", "-q"], out) == 0
    assert "|counted=9/9|loss_mask=0|denominators=0" in out.getvalue()


def test_inspect_shows_the_mask(tmp_path: Path) -> None:
    docs = [
        sb.Document("a", "train", list(range(30)), loss_mask=[0] * 20 + [1] * 10),
        sb.Document("b", "train", list(range(12)), loss_mask=[0] * 11 + [1]),
        sb.Document("c", "validation", list(range(12))),
    ]
    sb.write_store(tmp_path / "s", sb.DocumentStore.from_documents(docs))
    out = io.StringIO()
    assert main(["inspect", str(tmp_path / "s"), "-T", "4", "--pack", "--json"], out) == 0
    summary = json.loads(out.getvalue())
    train = summary["partitions"]["train"]["loss_mask"]
    assert summary["loss_mask"] is True
    assert (train["counted_targets"], train["targets"], train["untrained_documents"]) == (11, 40, 0)
    assert (train["windows"], train["untrained_windows"], train["untrained_rows"]) == (9, 6, 6)
    assert summary["partitions"]["validation"]["loss_mask"]["counted_share"] == 1.0
    out = io.StringIO()
    assert main(["inspect", str(tmp_path / "s"), "-T", "4", "--pack", "--skip-untrained", "--json"], out) == 0
    kept = json.loads(out.getvalue())["partitions"]["train"]["loss_mask"]
    assert (kept["kept_windows"], kept["kept_rows"]) == (9 - 6, 10 - 6)
    assert main(["inspect", str(tmp_path / "s"), "--skip-untrained"], io.StringIO()) == 2  # needs -T
    out = io.StringIO()
    assert main(["inspect", str(tmp_path / "s")], out) == 0
    assert "loss mask" in out.getvalue()
    assert "counted targets" in out.getvalue()


@needs_c
@pytest.mark.kernels
@settings(max_examples=80, deadline=None)
@given(
    mask=st.lists(st.booleans(), min_size=2, max_size=300),
    T=st.integers(0, 70),
    picks=st.lists(st.floats(0, 1), max_size=12),
)
def test_window_kernel_equals_numpy(mask: list[bool], T: int, picks: list[float]) -> None:
    bits = pack_mask(np.array(mask))
    room = len(mask) - T - 1
    if room < 0:
        return
    positions = np.array([int(p * room) for p in picks], dtype=np.int64)
    with _kernels.use("mask_bits", "c"):
        fast = target_mask(bits, positions, T)
    slow = target_mask_numpy(bits, positions.astype(np.intp), T)
    assert fast.dtype == np.bool_
    assert fast.shape == slow.shape == (positions.size, T)
    assert np.array_equal(fast, slow)
    for row, p in enumerate(positions.tolist()):
        assert fast[row].tolist() == mask[p + 1 : p + T + 1]


@pytest.mark.kernels
@settings(max_examples=30, deadline=None)
@given(docs=sparse_corpora(), T=st.integers(1, 48), size=st.integers(1, 6))
def test_packed_kernel_reads_the_bits_as_numpy_does(docs: list[sb.Document], T: int, size: int) -> None:
    store = sb.DocumentStore.from_documents(docs)
    fast = list(sb.materialize(sb.chunk(sb.pack(store, context_length=T), size)))
    with _kernels.use("packed_gather", "python"):  # the numpy gather, then mask_pieces
        slow = list(sb.materialize(sb.chunk(sb.pack(store, context_length=T), size)))
    for a, b in zip(fast, slow, strict=True):
        assert np.array_equal(a.loss_mask, b.loss_mask)
        assert a.target_count == b.target_count == int(a.loss_mask.sum())


@pytest.mark.kernels
@settings(max_examples=30, deadline=None)
@given(docs=sparse_corpora(), T=st.integers(1, 48), size=st.integers(1, 6), seed=st.integers(0, 99))
def test_the_row_count_table_is_the_counting_rule(docs: list[sb.Document], T: int, size: int, seed: int) -> None:
    """A masked packing's C gatherer holds every row's count (`row_counts`, made once in row order); each entry is
    the one counting rule's (`row_item_targets`), and a batch counted from the table equals one counted in its bits."""
    store = sb.DocumentStore.from_documents(docs)
    rows = sb.shuffle(sb.pack(store, context_length=T), seed)
    gatherer = rows_module.packed_gatherer(rows.space)
    if gatherer is False:
        pytest.skip("built without the C extension")
    total = len(rows.space.packing)
    table = rows_module.row_counts(gatherer, total)
    assert table.dtype == np.uint32
    assert table.tolist() == rows_module.row_item_targets(rows.space, np.arange(total)).tolist()
    for lo in range(0, len(rows), size):
        numbers = np.ascontiguousarray(rows[lo : lo + size].numbers(), dtype=np.int64)
        tabled = gatherer.gather_tokens(numbers)[7]
        gatherer.use_row_counts(None)  # the bits counted in the copy instead
        counted = gatherer.gather_tokens(numbers)[7]
        gatherer.use_row_counts(table)
        assert tabled == counted == int(table[numbers].sum())
    with pytest.raises(ValueError, match="one per row"):
        gatherer.use_row_counts(table[:-1])
    with pytest.raises(ValueError, match="one per row"):
        gatherer.use_row_counts(table.astype(np.int64))


def test_audit_catches_a_wrong_mask_and_a_wrong_denominator() -> None:
    from streambatch.tools.audit import audit_batches, audit_packed_epoch

    rng = np.random.default_rng(1)
    docs = [
        sb.Document(f"d{i}", "train", rng.integers(0, 100, n).tolist(), loss_mask=(rng.random(n) < 0.3).tolist())
        for i, n in enumerate(rng.integers(5, 60, 12).tolist())
    ]
    epoch = sb.Epoch(docs, context_length=8, batch_size=4, seed=3, stride=8)
    assert audit_batches(epoch, epoch).ok
    batches = list(epoch)
    batches[0].loss_mask = np.ones_like(batches[0].loss_mask)  # masked targets counted
    assert audit_batches(batches, epoch).first_failure[0] == "loss_mask"

    class Lying:  # a batch whose denominator is not its counted targets
        def __init__(self, batch: Any) -> None:
            self.batch = batch

        def __getattr__(self, name: str) -> Any:
            return getattr(self.batch, name)

        @property
        def token_count(self) -> int:
            return int(self.batch.targets.size)

    lied = [Lying(b) for b in epoch]
    assert "denominator" in audit_batches(lied, epoch).failures
    packed = sb.Epoch(docs, context_length=8, batch_size=4, seed=3, pack=True, skip_untrained=True)
    result = audit_packed_epoch(packed, workers=2, world_size=2)
    assert result.ok
    assert f"|counted={result.mask['expected_counted_targets']}/" in result.proof_line()


def test_trace_svg_greys_masked_targets() -> None:
    from streambatch.tools.figure.packed import packed_svg
    from streambatch.tools.figure.page import epoch_svg

    docs = [sb.Document("a", "train", list(range(9)), loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1])]
    windows = sb.Epoch(docs, context_length=4, stride=4, batch_size=2, seed=None)
    masked_targets = sum(int((~b.loss_mask).sum()) for b in windows)  # 4 of the 8 targets
    assert epoch_svg(windows).count('class="target masked"') == masked_targets == 4
    assert "denominator 4 counted targets" in epoch_svg(windows)
    plain = sb.Epoch([sb.Document("a", "train", list(range(9)))], context_length=4, stride=4, batch_size=2, seed=None)
    assert "masked" not in epoch_svg(plain)
    packed = sb.Epoch(docs, context_length=4, batch_size=2, seed=None, pack=True)
    runs = packed_svg(packed).count('class="masked"')
    assert runs == 2  # targets 1-2 and 5-6 of the document: one grey run each


def test_audit_hook_checks_a_global_count_against_the_shares() -> None:
    from streambatch.tools.audit.masks import MaskTally

    class Share:
        def __init__(self, index: int, width: int, said: int) -> None:
            self.index, self.targets, self.global_token_count = index, np.zeros((width, 2)), said

    tally = MaskTally(False, 2, 0)  # a store without a loss mask
    for piece in (Share(0, 1, 4), Share(0, 1, 4), Share(1, 1, 3)):  # batch 1's shares count 2, not 3
        tally.check(piece.index, piece, None, np.zeros(0, np.intp))
    tally.finish()
    assert list(tally.first) == ["global_count"]
    assert "batch 1: global_token_count=3 but its shares count 2" in tally.first["global_count"]
