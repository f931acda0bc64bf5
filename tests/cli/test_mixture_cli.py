"""Tests for mixture files (`streambatch.io.mixture_file`) and every command that takes one as its SOURCE."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
import streambatch.cli.epoch as cli_epoch
from streambatch.cli import main
from streambatch.errors import ConfigError, StoreError, StreamBatchError
from streambatch.io.mixture_file import MixtureSource, read_mixture_file

ARGS = ["-T", "2", "-B", "3", "--seed", "7"]


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def write(path: Path, sources: list[dict[str, Any]], **more: Any) -> Path:
    path.write_text(json.dumps({"sources": sources, **more}))
    return path


@pytest.fixture
def mixture(tmp_path: Path) -> Path:
    """web: 3 documents (48 windows at T=2), code: one of 5 tokens (3 windows), weights 0.75 / 0.25."""
    sb.write_store(tmp_path / "web", [sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 18)) for i in range(3)])
    sb.write_store(tmp_path / "a", [sb.Document("a0", "train", range(1000, 1005))])
    sb.write_corpus(tmp_path / "code.json", [tmp_path / "a"])
    entries = [{"name": "web", "path": "web", "weight": 0.75}, {"name": "code", "path": "code.json", "weight": 0.25}]
    return write(tmp_path / "mixture.json", entries)


def test_open_source_reads_a_mixture_file(mixture: Path) -> None:
    opened = sb.open_source(mixture)
    assert isinstance(opened, MixtureSource)
    assert opened.kind == "mixture"
    assert opened.spec.names == ("web", "code")
    assert opened.spec.weights == (0.75, 0.25)
    epoch = sb.Epoch(opened, context_length=2, batch_size=3, seed=7)
    assert epoch.window_count == 64
    assert epoch.order.counts().tolist() == [48, 16]
    with pytest.raises(ConfigError, match="seed"):
        sb.Epoch(opened, context_length=2, batch_size=3)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"sources": [{"name": "a", "path": "web", "weight": 1}], "extra": 1}, "unknown key 'extra'"),
        ({"sources": [{"name": "a", "path": "web", "weight": 1, "seed": 3}]}, "unknown key 'seed'"),
        ({"sources": [{"name": "a", "path": "web"}]}, "missing 'weight'"),
        ({"sources": [{"name": "a", "path": "web", "weight": 1}, {"name": "a", "path": "web", "weight": 1}]}, "own name"),
        ({"sources": [{"name": "a", "path": "/abs/web", "weight": 1}]}, "absolute"),
        ({"sources": [{"name": "a", "path": "web", "weight": 0}]}, "positive finite"),
        ({"sources": [{"name": "a", "path": "web", "weight": -0.5}]}, "positive finite"),
        ({"sources": [{"name": "a", "path": "web", "weight": 1e400}]}, "out of range"),
        ({"sources": [{"name": "a", "path": "web", "weight": "0.5"}]}, "positive finite"),
        ({"sources": [{"name": "a", "path": "web", "weight": True}]}, "positive finite"),
        ({"sources": []}, "1 to 255"),
        ({"sources": [{"name": "a", "path": "web", "weight": 1}], "length": 0}, "length"),
        ([1, 2], "top level"),
    ],
)
def test_bad_mixture_files_are_refused(tmp_path: Path, document: Any, message: str) -> None:
    path = tmp_path / "mixture.json"
    path.write_text(json.dumps(document).replace("Infinity", "1e400"))
    with pytest.raises(ConfigError, match=message):
        read_mixture_file(path)


def test_nan_weight_and_missing_sources_are_refused(mixture: Path, tmp_path: Path) -> None:
    (tmp_path / "nan.json").write_text('{"sources": [{"name": "a", "path": "web", "weight": NaN}]}')
    with pytest.raises(StreamBatchError):
        read_mixture_file(tmp_path / "nan.json")
    missing = write(tmp_path / "missing.json", [{"name": "gone", "path": "nowhere", "weight": 1}])
    with pytest.raises(StreamBatchError, match=r"source 'gone'.*no such"):
        sb.open_source(missing)
    assert run(["epoch", str(missing), *ARGS]) == (2, "")


def test_epoch_resumes_in_the_third_epoch_of_the_upsampled_source(
    mixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """code has 3 windows and 16 of the 64 items: a state saved after batch 9 (item 30) is in its third source epoch."""
    reference = tmp_path / "reference.jsonl"
    assert run(["epoch", str(mixture), *ARGS, "-o", str(reference)])[0] == 0
    epoch = sb.Epoch(sb.open_source(mixture), context_length=2, batch_size=3, seed=7)
    assert 6 <= epoch.order.counts(30)[1] < 9  # source epoch 2 of code
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    real, calls = cli_epoch.atomic_text, []

    def interrupted(target: Any) -> Any:
        calls.append(target)
        if len(calls) == 11:  # the start, then after batches 0..9
            raise KeyboardInterrupt
        return real(target)

    monkeypatch.setattr(cli_epoch, "atomic_text", interrupted)
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--save-state", str(state)])[0] == 130
    monkeypatch.setattr(cli_epoch, "atomic_text", real)
    assert json.loads(state.read_text())["run"]["batch"] == 9
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--resume", str(state)]) == (0, "")
    assert out.read_text() == reference.read_text()
    rows = [json.loads(line) for line in reference.read_text().splitlines()]
    assert {r["source"] for b in rows for r in b["rows"]} == {"web", "code"}


@pytest.mark.parametrize("change", ["weight", "source", "missing"])
def test_a_changed_mixture_is_refused_on_resume_and_nothing_is_written(mixture: Path, tmp_path: Path, change: str) -> None:
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--save-state", str(state)])[0] == 0
    before = out.read_bytes(), state.read_bytes()
    document = json.loads(mixture.read_text())
    if change == "weight":
        document["sources"][0]["weight"] = 0.7
    elif change == "source":
        sb.write_store(tmp_path / "other", [sb.Document("o", "train", range(30))])
        document["sources"][0]["path"] = "other"
    else:
        document["sources"][1]["path"] = "gone.json"
    mixture.write_text(json.dumps(document))
    assert run(["epoch", str(mixture), *ARGS, "-o", str(out), "--resume", str(state)]) == (2, "")
    assert (out.read_bytes(), state.read_bytes()) == before


def test_inspect_shows_each_source(mixture: Path) -> None:
    code, text = run(["inspect", str(mixture), "-T", "2", "-B", "3", "--json"])
    summary = json.loads(text)
    assert code == 0
    assert summary["items"] == 64
    assert summary["batches"] == 22
    web, code_row = summary["sources"]
    assert (web["items"], web["windows"], web["source_epochs"], web["weight"]) == (48, 48, 1.0, 0.75)
    assert (code_row["items"], code_row["windows"], code_row["effective_share"]) == (16, 3, 0.25)
    assert code_row["source_epochs"] == pytest.approx(16 / 3)
    assert code_row["tokens"] == 5
    code, text = run(["inspect", str(mixture)])
    assert code == 0
    assert "web" in text
    assert "code" in text


@pytest.mark.parametrize(("workers", "world"), [(1, 1), (2, 3)])
def test_audit_proves_a_mixture(mixture: Path, workers: int, world: int) -> None:
    code, text = run(["audit", str(mixture), *ARGS, "--workers", str(workers), "--world-size", str(world)])
    assert code == 0
    assert text.startswith(
        "PROOF|coverage=64/64|duplicates=0|tijdeman_order=ok|prefix_bound=ok|source_order=ok|no_repeat_in_source_epoch=ok|tokens=ok|sources=2"
    )


def test_audit_finds_a_broken_order(mixture: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import streambatch.items.mix.space as mix_space

    real = mix_space.source_epoch_seed
    monkeypatch.setattr(mix_space, "source_epoch_seed", lambda seed, s, e: real(seed, s, 0))  # every epoch alike
    code, text = run(["audit", str(mixture), *ARGS, "--json"])
    assert code == 1
    found = json.loads(text)
    assert "order" in found["failures"]
    assert found["ok"] is False
    assert "|source_order=FAIL|" in found["proof"]


def test_trace_and_plan(mixture: Path, tmp_path: Path) -> None:
    svg = tmp_path / "mix.svg"
    assert run(["trace", str(mixture), *ARGS, "--svg", str(svg)])[0] == 0
    assert svg.read_text().count('class="row"') == 64
    code, text = run(["plan", str(mixture), *ARGS, "--epoch", "1", "-o", str(tmp_path / "plans")])
    summary = json.loads(text)
    assert code == 0
    assert summary["items"] == 64
    assert len(summary["source_plans"]) == 1 + 6
    assert all(os.path.exists(p) for p in [summary["plan"], *summary["source_plans"]])
    again = sb.Run(sb.open_source(mixture), context_length=2, batch_size=3, seed=7, plan_dir=tmp_path / "plans")
    plain = sb.Run(sb.open_source(mixture), context_length=2, batch_size=3, seed=7)
    assert [b.inputs.tolist() for b in again.iter_steps(22, 44)] == [b.inputs.tolist() for b in plain.iter_steps(22, 44)]


def test_a_foreign_plan_file_is_refused(mixture: Path, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    assert run(["plan", str(mixture), *ARGS, "-o", str(plans)])[0] == 0
    (path,) = plans.glob("*.mixplan")
    data = bytearray(path.read_bytes())
    data[:4096] = data[:4096].replace(b'"items": 64', b'"items": 65')
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError):
        sb.Epoch(sb.open_source(mixture), context_length=2, batch_size=3, seed=7, plan_dir=plans)
