"""Tests for ``skip_untrained`` over packed pieces and over mixtures (`streambatch.items.untrained`).

Packed rows drop the pieces with no counted target before packing; a mixture
filters each source first and mixes the kept items.  The properties compare
with counts made here from the documents' masks alone.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.cli import main
from streambatch.errors import ConfigError, StoreError
from streambatch.tools.mix_report import audit_mixture


@st.composite
def masked_corpora(draw: Any, prefix: str = "d") -> list[sb.Document]:
    """Documents with every kind of mask: none, all true, all false (inside mixtures too), one trained token, a mask
    set at position 0 (never a target), sparse ones."""
    docs = []
    for i in range(draw(st.integers(1, 5))):
        length = draw(st.integers(1, 30))
        tokens = draw(st.lists(st.integers(0, 300), min_size=length, max_size=length))
        kind = draw(st.sampled_from(["none", "all", "nothing", "one", "zero", "sparse"]))
        mask: list[bool] | None
        if kind == "none":
            mask = None
        elif kind == "all":
            mask = [True] * length
        elif kind == "nothing":
            mask = [False] * length
        elif kind == "zero":  # position 0 set: it is never a target
            mask = [True] + [False] * (length - 1)
        elif kind == "one":
            mask = [False] * length
            mask[draw(st.integers(0, length - 1))] = True
        else:
            mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        docs.append(sb.Document(f"{prefix}{i}", "train", tokens, loss_mask=mask))
    return docs


def _mask(doc: sb.Document) -> np.ndarray:
    return np.ones(len(doc.tokens), bool) if doc.loss_mask is None else np.asarray(doc.loss_mask, bool)


def _pieces(docs: list[sb.Document], T: int) -> list[tuple[int, int, int]]:
    """``(document, start, counted targets)`` of every piece (a full one or a tail), from the masks alone."""
    out = []
    for d, doc in enumerate(docs):
        mask, length = _mask(doc), len(doc.tokens)
        for start in range(0, length - 1, T):
            m = min(T + 1, length - start)
            out.append((d, start, int(mask[start + 1 : start + m].sum())))
    return out


def _windows(docs: list[sb.Document], T: int, stride: int) -> list[int]:
    mask_of = [_mask(doc) for doc in docs]
    return [int(mask_of[d][p + 1 : p + T + 1].sum()) for d, doc in enumerate(docs) for p in range(0, len(doc.tokens) - T, stride)]


def _counted(batches: Any) -> tuple[Counter[tuple[int, int, int]], list[int]]:
    """Every counted target of *batches* as ``(source, document, target position)``, and each segment's counted targets."""
    found: Counter[tuple[int, int, int]] = Counter()
    per_segment: list[int] = []
    for b in batches:
        seg = b.segments
        T = b.context_length
        mask = np.ones((b.width, T), bool) if b.loss_mask is None else np.asarray(b.loss_mask)
        assert b.token_count == int(mask.sum())  # the denominator is the counted targets
        rows, cols = np.nonzero(mask)
        if b.packed:
            first = np.searchsorted(seg.row, np.arange(b.width))
            k = first[rows] + b.segment_ids[rows, cols]
            at = seg.start[k] + b.position_ids[rows, cols] + 1
            ids = b.segment_ids
            for r in range(b.width):
                per_segment += [int(mask[r][ids[r] == j].sum()) for j in range(int(ids[r].max()) + 1)]
        else:
            k, at = rows, seg.start[rows] + cols + 1
            per_segment += mask.sum(axis=1).tolist()
        found.update(zip(seg.source[k].tolist(), seg.document[k].tolist(), at.tolist(), strict=True))
    return found, per_segment


@settings(max_examples=60, deadline=None)
@given(docs=masked_corpora(), T=st.integers(1, 8), size=st.integers(1, 5), seed=st.integers(0, 99))
def test_packed_pieces_with_no_counted_target_are_left_out(docs: list[sb.Document], T: int, size: int, seed: int) -> None:
    store = sb.DocumentStore.from_documents(docs)
    pieces = _pieces(docs, T)
    every = sb.Epoch(store, context_length=T, batch_size=size, seed=seed, pack=True)
    kept = sb.Epoch(store, context_length=T, batch_size=size, seed=seed, pack=True, skip_untrained=True)
    report = kept.items.untrained
    assert report.dropped == sum(c == 0 for _, _, c in pieces)  # full pieces and tails
    tails = {d for d, start, c in pieces if c == 0 and (len(docs[d].tokens) - 1 - start) < T}
    assert set(report.tails.tolist()) == tails
    assert kept.items.report.dropped_pieces == report.dropped
    assert kept.items.report.pieces + report.dropped == every.items.report.pieces
    assert len(kept.items) == report.kept <= len(every.items)
    everything, _ = _counted(every)
    found, per_segment = _counted(kept)
    assert found == everything  # every counted target once, nothing trained lost
    assert all(n > 0 for n in per_segment)  # every kept piece trains: none all masked
    assert sum(per_segment) == sum(c for _, _, c in pieces) == sum(b.token_count for b in kept)
    assert kept.items.report.pad_positions == sum(int((b.segment_ids == -1).sum()) for b in kept)  # the kept rows'
    assert kept.items.report.targets == sum(int((b.segment_ids != -1).sum()) for b in kept)
    assert sb.Epoch(store, context_length=T, batch_size=size, seed=seed, pack=True).items.untrained is None


@pytest.mark.kernels
@settings(max_examples=30, deadline=None)
@given(docs=masked_corpora(), T=st.integers(1, 12), size=st.integers(1, 6))
def test_c_and_numpy_gathers_agree_on_kept_pieces(docs: list[sb.Document], T: int, size: int) -> None:
    store = sb.DocumentStore.from_documents(docs)
    fast = list(sb.materialize(sb.chunk(sb.pack(store, context_length=T, skip_untrained=True), size)))
    with _kernels.use("packed_gather", "python"):  # the numpy gather, then mask_pieces
        slow = list(sb.materialize(sb.chunk(sb.pack(store, context_length=T, skip_untrained=True), size)))
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        for name in ("inputs", "targets", "loss_mask", "segment_ids", "position_ids"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert a.target_count == b.target_count


@settings(max_examples=80, deadline=None)
@given(
    first=masked_corpora("a"),
    second=masked_corpora("b"),
    T=st.integers(1, 6),
    stride=st.integers(1, 6),
    size=st.integers(1, 5),
    seed=st.integers(0, 99),
    packed=st.booleans(),
)
def test_a_mixture_mixes_each_sources_kept_items(
    first: list[sb.Document], second: list[sb.Document], T: int, stride: int, size: int, seed: int, packed: bool
) -> None:
    stores = [sb.DocumentStore.from_documents(d) for d in (first, second)]

    def part(store: Any, skip: bool) -> Any:
        if packed:
            return sb.pack(store, context_length=T, skip_untrained=skip)
        return sb.windows(store, context_length=T, stride=stride, skip_untrained=skip)

    parts = [part(s, True) for s in stores]
    event(f"packed={packed} mixed={all(len(p) for p in parts)} dropped={any(p.untrained.dropped for p in parts)}")
    if not all(len(p) for p in parts):
        with pytest.raises(ConfigError, match="skip_untrained dropped"):
            sb.mix(parts, [1, 1], seed=seed)
        return
    if packed:
        expected = [sum(c == 0 for _, _, c in _pieces(d, T)) for d in (first, second)]
    else:
        expected = [sum(c == 0 for c in _windows(d, T, stride)) for d in (first, second)]
    # weights at the kept sizes over their sum: every source exactly once (Tijdeman's bound is below 1)
    mixture = sb.mix(parts, [len(p) for p in parts], seed=seed, length=sum(len(p) for p in parts))
    assert [r.dropped for r in mixture.untrained] == expected
    assert mixture.sizes == [len(p) for p in parts] == mixture.counts().tolist()
    epoch = sb.Epoch(mixture, batch_size=size, skip_untrained=True)
    found, per_segment = _counted(epoch)
    assert all(n > 0 for n in per_segment)
    for s, store in enumerate(stores):  # each source: every counted target of its unfiltered items, as often
        alone, _ = _counted(sb.materialize(sb.chunk(part(store, False), 3)))
        assert Counter({(d, p): n for (_, d, p), n in alone.items()}) == Counter(
            {(d, p): n for (src, d, p), n in found.items() if src == s}
        )
    assert sum(b.token_count for b in epoch) == mixture.counted_targets()
    assert audit_mixture(epoch, workers=2, world_size=2)["ok"]


def _mixed_docs() -> tuple[list[sb.Document], list[sb.Document]]:
    web = [
        sb.Document("a", "train", list(range(30)), loss_mask=[0] * 20 + [1] * 10),
        sb.Document("b", "train", list(range(12)), loss_mask=[0] * 11 + [1]),
    ]
    code = [
        sb.Document("c", "train", list(range(100, 120)), loss_mask=[0] * 5 + [1] * 3 + [0] * 12),
        sb.Document("d", "train", list(range(200, 210)), loss_mask=[0] * 10),  # trains nothing
    ]
    return web, code


def test_filtered_and_unfiltered_never_share_a_file(tmp_path: Path) -> None:
    web, code = _mixed_docs()
    for packed in (False, True):
        folder = tmp_path / f"plans-{packed}"

        def build(skip: bool, docs: list[sb.Document], folder: Path = folder, packed: bool = packed) -> Any:
            if packed:
                return sb.pack(docs, context_length=4, plan_dir=folder, skip_untrained=skip)
            return sb.windows(docs, context_length=4, stride=2, skip_untrained=skip)

        plain = sb.mix([build(False, web), build(False, code)], [1, 1], seed=3, plan_dir=folder)
        kept = sb.mix([build(True, web), build(True, code)], [1, 1], seed=3, plan_dir=folder)
        assert plain.fingerprint != kept.fingerprint
        assert len(list(folder.glob("*.mixplan"))) == 2
        list(sb.Epoch(plain, batch_size=2))
        list(sb.Epoch(kept, batch_size=2, skip_untrained=True))
        assert len(list(folder.glob("*.packing"))) == (4 if packed else 0)
        again = sb.mix([build(True, web), build(True, code)], [1, 1], seed=3, plan_dir=folder)  # mapped, not recomputed
        assert [b.token_count for b in sb.Epoch(again, batch_size=2)] == [b.token_count for b in sb.Epoch(kept, batch_size=2)]
        with pytest.raises(ConfigError, match="skip_untrained=True, or none"):
            sb.mix([build(True, web), build(False, code)], [1, 1], seed=3)
        with pytest.raises(ConfigError, match="skip_untrained"):
            sb.Epoch(plain, batch_size=2, skip_untrained=True)


def _mixture_file(tmp_path: Path) -> Path:
    web, code = _mixed_docs()
    sb.write_store(tmp_path / "web", sb.DocumentStore.from_documents(web))
    sb.write_store(tmp_path / "code", sb.DocumentStore.from_documents(code))
    entries = [{"name": "web", "path": "web", "weight": 0.6}, {"name": "code", "path": "code", "weight": 0.4}]
    path = tmp_path / "mixture.json"
    path.write_text(json.dumps({"sources": entries}))
    return path


@pytest.mark.parametrize("packed", [False, True])
def test_the_commands_take_a_mixture_with_skip_untrained(
    tmp_path: Path, packed: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _mixture_file(tmp_path)
    mode = ["--pack"] if packed else ["--stride", "2"]
    args = [str(path), "-T", "4", "-B", "2", "--seed", "3", *mode, "--skip-untrained"]
    out = io.StringIO()
    assert main(["epoch", *args], out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records
    assert all(any(row) for r in records for row in r["loss_mask"])
    note = capsys.readouterr().err
    web, code = _mixed_docs()
    if packed:
        dropped = [sum(c == 0 for _, _, c in _pieces(d, 4)) for d in (web, code)]
        assert f"'web': {dropped[0]} pieces with no counted target" in note
        assert f"'code': {dropped[1]} pieces" in note
    else:
        dropped = [sum(c == 0 for c in _windows(d, 4, 2)) for d in (web, code)]
        assert f"'web': {dropped[0]} windows with no counted target" in note
    key = "dropped_pieces" if packed else "dropped_windows"
    out = io.StringIO()
    assert main(["inspect", str(path), "-T", "4", "-B", "2", *mode, "--skip-untrained", "--json"], out) == 0
    summary = json.loads(out.getvalue())
    assert [row[key] for row in summary["sources"]] == dropped
    out = io.StringIO()
    assert main(["inspect", str(path), "-T", "4", *mode, "--skip-untrained"], out) == 0
    assert key.replace("_", " ") in out.getvalue()
    out = io.StringIO()
    assert main(["audit", *args, "--workers", "2", "--world-size", "2"], out) == 0
    assert "coverage=" in out.getvalue()
    assert "FAIL" not in out.getvalue()
    assert f"skip_untrained: web {'kept_rows' if packed else 'kept_windows'}=" in out.getvalue()
    assert f"{key}={dropped[0]}" in out.getvalue()
    out = io.StringIO()
    assert main(["audit", *args[:-1]], out) == 0  # the unfiltered mixture of masked stores proves its claims too
    state, output = tmp_path / f"state-{packed}.json", tmp_path / f"out-{packed}.jsonl"
    assert main(["epoch", *args, "-o", str(output), "--save-state", str(state)], io.StringIO()) == 0
    whole = output.read_text()
    assert main(["epoch", *args, "-o", str(output), "--resume", str(state)], io.StringIO()) == 0
    assert output.read_text() == whole == out_of(args)


def out_of(args: list[str]) -> str:
    out = io.StringIO()
    main(["epoch", *args], out)
    return out.getvalue()


def test_a_run_of_a_filtered_mixture_resumes(tmp_path: Path) -> None:
    path = _mixture_file(tmp_path)
    source = sb.open_source(path)
    for packed in (False, True):
        keywords: dict[str, Any] = {"context_length": 4, "batch_size": 2, "seed": 5, "epochs": 2, "skip_untrained": True}
        keywords["pack"] = packed
        if not packed:
            keywords["stride"] = 2
        whole = [b.token_count for b in sb.Run(source, **keywords)]
        run = sb.Run(source, **keywords)
        head = [b.token_count for _, b in zip(range(3), run, strict=False)]
        state = run.state_dict()
        again = sb.Run(source, **keywords)
        again.load_state_dict(state)
        assert head + [b.token_count for b in again] == whole
        plain = dict(keywords, skip_untrained=False)
        with pytest.raises(sb.StreamBatchError):  # a filtered mixture's state is not an unfiltered one's
            sb.Run(source, **plain).load_state_dict(state)


def test_verify_reads_a_filtered_plan_and_refuses_a_dropped_item(tmp_path: Path) -> None:
    from streambatch.order.plan import build_plan
    from tests import keyed

    web, _ = _mixed_docs()
    kinds = [sb.windows(web, context_length=4, stride=2, skip_untrained=True)]
    for items in [*kinds, sb.pack(web, context_length=4, skip_untrained=True)]:
        folder = tmp_path / items.words.kind.split()[0]
        ordered, _ = build_plan(items, 3, folder, verify=True)  # the kept items, each once
        assert len(ordered) == items.untrained.kept
        path = Path(ordered.plan_path)
        dropped = sorted(set(range(items.whole_count)) - set(items.numbers().tolist()))[0]
        body = keyed.body(path, "plan")
        body[0] = dropped if items.packed else items.space.index.positions(np.array([dropped]))[0]
        body.flush()
        keyed.redigest(path)
        with pytest.raises(StoreError, match=r"not the .* kept .* of skip_untrained"):
            build_plan(items, 3, folder, verify=True)


def test_a_run_state_names_the_filter() -> None:
    web, _ = _mixed_docs()
    for packed in (False, True):
        keywords: dict[str, Any] = {"context_length": 4, "batch_size": 1, "seed": 5, "epochs": 2, "pack": packed}
        kept, every = sb.Run(web, skip_untrained=True, **keywords), sb.Run(web, **keywords)
        assert kept.state_dict()["skip_untrained"] is True
        assert "skip_untrained" not in every.state_dict()  # unfiltered states are unchanged
        with pytest.raises(sb.StreamBatchError, match="skip_untrained"):
            kept.load_state_dict(every.state_dict())
        with pytest.raises(sb.StreamBatchError, match="skip_untrained"):
            every.load_state_dict(kept.state_dict())
        kept.load_state_dict(sb.Run(web, skip_untrained=True, **keywords).state_dict())


def test_a_corpus_of_shards_drops_the_pieces_one_store_drops(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    docs = [
        sb.Document(f"d{i}", "train", rng.integers(0, 99, n).tolist(), loss_mask=(rng.random(n) < 0.1).tolist())
        for i, n in enumerate(rng.integers(2, 40, 30).tolist())
    ]
    sb.write_store(tmp_path / "a", docs[:15])
    sb.write_store(tmp_path / "b", docs[15:])
    sb.write_corpus(tmp_path / "c.json", [tmp_path / "a", tmp_path / "b"])
    corpus, store = sb.open_source(tmp_path / "c.json"), sb.DocumentStore.from_documents(docs)
    for T in (3, 7):
        sharded = sb.pack(corpus, context_length=T, skip_untrained=True)
        whole = sb.pack(store, context_length=T, skip_untrained=True)
        assert sharded.untrained.tails.tolist() == whole.untrained.tails.tolist()
        assert sharded.untrained.dropped == whole.untrained.dropped == sum(c == 0 for _, _, c in _pieces(docs, T))
        for a, b in zip(sb.materialize(sb.chunk(sharded, 4)), sb.materialize(sb.chunk(whole, 4)), strict=True):
            assert np.array_equal(a.inputs, b.inputs)
            assert np.array_equal(a.loss_mask, b.loss_mask)
            assert a.loss_mask.any(axis=1).all()


def test_the_report_counts_items_before_the_filter_only_for_windows() -> None:
    """Windows: ``items`` is every window before the filter. Packed rows: None (kept rows and dropped pieces are
    different units; the kept pieces are packed anew)."""
    store = sb.DocumentStore.from_arrays(np.arange(1, 13), [0, 6, 12], loss_mask=[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    windows = sb.windows(store, context_length=2, stride=2, skip_untrained=True)
    everything = sb.windows(store, context_length=2, stride=2)
    assert windows.untrained.dropped > 0
    assert windows.untrained.items == len(everything) == windows.untrained.kept + windows.untrained.dropped
    rows = sb.pack(store, context_length=4, skip_untrained=True)
    assert rows.untrained.dropped > 0
    assert rows.untrained.items is None
