"""Mixture files with ``--pack``: every command builds a mixture of each source's packed rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
import streambatch.cli.epoch as cli_epoch
from tests.cli.test_mixture_cli import run, write

ARGS = ["-T", "4", "-B", "3", "--seed", "7", "--pack"]


@pytest.fixture
def mixture(tmp_path: Path) -> Path:
    """web: 3 documents (63 targets), code: a corpus of two documents (12 targets), weights 0.75 / 0.25."""
    sb.write_store(tmp_path / "web", [sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 18 + 3 * i)) for i in range(3)])
    sb.write_store(tmp_path / "a", [sb.Document("a0", "train", range(1000, 1005)), sb.Document("a1", "train", range(2000, 2009))])
    sb.write_corpus(tmp_path / "code.json", [tmp_path / "a"])
    entries = [{"name": "web", "path": "web", "weight": 0.75}, {"name": "code", "path": "code.json", "weight": 0.25}]
    return write(tmp_path / "mixture.json", entries, length=40)


def test_epoch_writes_packed_batches_and_resumes_exactly(mixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = tmp_path / "reference.jsonl"
    assert run(["epoch", str(mixture), *ARGS, "-o", str(reference)])[0] == 0
    records = [json.loads(line) for line in reference.read_text().splitlines()]
    assert len(records) == 14  # 40 rows in batches of 3
    assert all(r["pack"] for r in records)
    assert {row["source"] for r in records for row in r["rows"]} == {"web", "code"}
    assert sum(r["token_count"] for r in records) == sum(sum(map(sum, r["loss_mask"])) for r in records)
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    real, calls = cli_epoch.atomic_text, []

    def interrupted(target: Any) -> Any:
        calls.append(target)
        if len(calls) == 8:  # the start, then after batches 0..6
            raise KeyboardInterrupt
        return real(target)

    monkeypatch.setattr(cli_epoch, "atomic_text", interrupted)
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--save-state", str(state)])[0] == 130
    monkeypatch.setattr(cli_epoch, "atomic_text", real)
    saved = json.loads(state.read_text())["run"]
    assert (saved["batch"], saved["mode"]) == (6, "pack")
    before = out.read_bytes(), state.read_bytes()
    window_args = [a for a in ARGS if a != "--pack"]
    assert run(["epoch", str(mixture), *window_args, "-o", str(out), "--resume", str(state)]) == (2, "")  # a mode change
    assert (out.read_bytes(), state.read_bytes()) == before  # refused: nothing written
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--resume", str(state)]) == (0, "")
    assert out.read_text() == reference.read_text()


def test_a_changed_weight_is_refused_on_resume(mixture: Path, tmp_path: Path) -> None:
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--save-state", str(state)])[0] == 0
    before = out.read_bytes(), state.read_bytes()
    document = json.loads(mixture.read_text())
    document["sources"][0]["weight"] = 0.7
    mixture.write_text(json.dumps(document))
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--resume", str(state)]) == (2, "")
    assert (out.read_bytes(), state.read_bytes()) == before


def test_inspect_shows_each_sources_rows_and_targets(mixture: Path) -> None:
    code, text = run(["inspect", str(mixture), "-T", "4", "-B", "3", "--pack", "--json"])
    summary = json.loads(text)
    assert code == 0
    assert (summary["mode"], summary["items"], summary["batches"]) == ("pack", 40, 14)
    web, code_row = summary["sources"]
    assert (web["rows"], web["targets"], web["items"]) == (15, 60, 30)
    assert (code_row["rows"], code_row["targets"], code_row["items"]) == (3, 12, 10)
    assert code_row["source_epochs"] == pytest.approx(10 / 3)
    code, text = run(["inspect", str(mixture), "-T", "4", "-B", "3", "--pack"])
    assert code == 0
    assert "packed rows of T=4" in text
    assert "targets" in text


@pytest.mark.parametrize(("workers", "world"), [(1, 1), (2, 3)])
def test_audit_proves_a_packed_mixture(mixture: Path, workers: int, world: int) -> None:
    code, text = run(["audit", str(mixture), *ARGS, "--workers", str(workers), "--world-size", str(world)])
    assert code == 0
    assert text.startswith("PROOF|coverage=40/40|duplicates=0|tijdeman_order=ok|prefix_bound=ok")
    assert "every_target_once_per_source_epoch" in text


def test_audit_finds_rows_that_are_not_their_sources(mixture: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streambatch.items.mix.packed_gather import PackedMixGather

    real = PackedMixGather.__call__

    def shifted(self: PackedMixGather, sources: Any, numbers: Any, index: int) -> Any:
        batch = real(self, sources, numbers, index)
        batch.targets[:, :1] += 1  # one wrong target per row
        return batch

    monkeypatch.setattr(PackedMixGather, "__call__", shifted)
    code, text = run(["audit", str(mixture), *ARGS, "--json"])
    assert code == 1
    assert "tokens" in json.loads(text)["failures"]


def test_plan_and_trace(mixture: Path, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    code, text = run(["plan", str(mixture), *ARGS, "-o", str(plans)])
    summary = json.loads(text)
    assert code == 0
    assert (summary["mode"], summary["items"], summary["rows"]) == ("pack", 40, [15, 3])
    mapped = sb.Epoch(sb.open_source(mixture), context_length=4, batch_size=3, seed=7, pack=True, plan_dir=plans)
    plain = sb.Epoch(sb.open_source(mixture), context_length=4, batch_size=3, seed=7, pack=True)
    assert list(mapped) == list(plain)
    svg = tmp_path / "mix.svg"
    assert run(["trace", str(mixture), *ARGS, "--svg", str(svg)])[0] == 0
    assert svg.read_text().count('class="row"') == 40


def test_pack_refuses_a_stride_and_a_window_mixture(mixture: Path) -> None:
    opened = sb.open_source(mixture)
    with pytest.raises(sb.ConfigError, match="stride"):
        sb.Epoch(opened, context_length=4, batch_size=3, seed=7, stride=2, pack=True)
    assert run(["epoch", str(mixture), *ARGS, "--stride", "2"]) == (2, "")
    windows = sb.Epoch(opened, context_length=4, batch_size=3, seed=7)
    with pytest.raises(sb.ConfigError, match="blends windows"):
        sb.Epoch(windows.items, batch_size=3, pack=True)
    packed = sb.Epoch(opened, context_length=4, batch_size=3, seed=7, pack=True)
    assert packed.pack
    assert "packed rows" in repr(packed.items)
