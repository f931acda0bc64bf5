"""``--pack`` on ``epoch``, ``plan`` and ``trace``: the packed record, the shared plan file, resume, and the refusals."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import batch_record, main
from streambatch.read.jsonl import read_jsonl
from tests import keyed


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


LENGTHS = [1, 4, 5, 9, 2, 13, 7, 3, 0, 6, 11, 8]  # T = 4: one token, exactly T + 1, 2T + 1, tails of every size


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[sb.Document]]:
    rng = np.random.default_rng(5)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 900, L)) for i, L in enumerate(LENGTHS)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": d.id, "partition": "train", "tokens": d.tokens.tolist()}) + "\n" for d in docs))
    return path, docs


ARGS = ["-T", "4", "-B", "3", "--seed", "9", "--pack"]


def records(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_epoch_pack_records_cover_every_target_once(corpus: tuple[Path, list[sb.Document]]) -> None:
    path, docs = corpus
    status, text = run(["epoch", str(path), *ARGS])
    assert status == 0
    got = records(text)
    epoch = sb.Epoch(read_jsonl(path), context_length=4, batch_size=3, seed=9, pack=True)
    assert got == [json.loads(json.dumps(batch_record(b))) for b in epoch]  # the record of the library's batches
    seen: list[tuple[str, int]] = []
    for rec in got:
        assert rec["pack"] is True
        inputs, targets = np.array(rec["inputs"]), np.array(rec["targets"])
        segment_ids, positions, mask = np.array(rec["segment_ids"]), np.array(rec["position_ids"]), np.array(rec["loss_mask"])
        assert list(rec["shape"]) == list(inputs.shape) == list(mask.shape)
        assert rec["token_count"] == int(mask.sum()) == inputs.size - rec["pad_positions"]
        for r, row in enumerate(rec["rows"]):
            column = 0
            for s, seg in enumerate(row["segments"]):
                tokens = docs[seg["document_index"]].tokens
                n, start = seg["length"], seg["start"]
                span = slice(column, column + n)
                assert inputs[r, span].tolist() == tokens[start : start + n].tolist()
                assert targets[r, span].tolist() == tokens[start + 1 : start + n + 1].tolist()
                assert segment_ids[r, span].tolist() == [s] * n
                assert positions[r, span].tolist() == list(range(n))
                seen += [(seg["document"], start + j) for j in range(n)]
                column += n
            assert not mask[r, column:].any()
            assert (segment_ids[r, column:] == -1).all()
            assert (inputs[r, column:] == 0).all()  # the pad id
    expected = [(d.id, t) for d in docs for t in range(len(d.tokens) - 1)]
    assert sorted(seen) == sorted(expected)  # every target of every document, exactly once


def test_plan_pack_is_written_once_and_mapped_by_epoch(corpus: tuple[Path, list[sb.Document]], tmp_path: Path) -> None:
    path, _ = corpus
    plans = tmp_path / "plans"
    status, text = run(["plan", str(path), *ARGS, "-o", str(plans)])
    assert status == 0
    summary = json.loads(text)
    epoch = sb.Epoch(read_jsonl(path), context_length=4, batch_size=3, seed=9, pack=True)
    assert (summary["mode"], summary["rows"], summary["created"]) == ("pack", len(epoch.items), True)
    assert summary["bytes"] == 4 * len(epoch.items)  # one uint32 row number per row
    assert "windows" not in summary
    again = json.loads(run(["plan", str(path), *ARGS, "-o", str(plans)])[1])
    assert (again["plan"], again["created"]) == (summary["plan"], False)
    status, mapped = run(["epoch", str(path), *ARGS, "--plan-dir", str(plans)])
    assert status == 0
    assert mapped == run(["epoch", str(path), *ARGS])[1]
    assert sorted(p.name for p in plans.glob("*.plan")) == [Path(summary["plan"]).name]
    order = np.asarray(keyed.body(Path(summary["plan"]), "plan"))
    assert order.tolist() == epoch.order.numbers().tolist()
    window_plan = json.loads(run(["plan", str(path), "-T", "4", "-B", "3", "--seed", "9", "-o", str(plans)])[1])
    assert window_plan["plan"] != summary["plan"]  # the window mode's plan is another file


def test_epoch_pack_resume_continues_and_refuses_the_other_mode(
    corpus: tuple[Path, list[sb.Document]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = corpus
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    whole = run(["epoch", str(path), *ARGS])[1]
    assert run(["epoch", str(path), *ARGS, "-o", str(out), "--save-state", str(state)])[0] == 0
    assert out.read_text() == whole
    assert json.loads(state.read_text())["run"]["mode"] == "pack"
    # as if killed after the first batch: keep one line, rewind the state to it
    saved = json.loads(state.read_text())
    first = whole.splitlines(keepends=True)[0]

    saved["run"].update(epoch=0, batch=1)
    saved["output"].update(
        bytes=len(first.encode()), batches=1, digest=hashlib.blake2b(first.encode(), digest_size=32).hexdigest()
    )
    state.write_text(json.dumps(saved))
    window_args = [a for a in ARGS if a != "--pack"]
    status, _ = run(["epoch", str(path), *window_args, "-o", str(out), "--resume", str(state)])
    assert status == 2
    assert "mode='pack'" in capsys.readouterr().err
    assert run(["epoch", str(path), *ARGS, "-o", str(out), "--resume", str(state)])[0] == 0
    assert out.read_text() == whole


@pytest.mark.parametrize("command", [["epoch"], ["plan", "-o", "PLANS"], ["audit"], ["trace", "--svg", "SVG"], ["inspect"]])
def test_pack_refuses_stride(
    command: list[str], corpus: tuple[Path, list[sb.Document]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = corpus
    argv = [a.replace("PLANS", str(tmp_path / "p")).replace("SVG", str(tmp_path / "f.svg")) for a in command]
    given = [a for a in ARGS if a not in ("--seed", "9")] if argv[0] == "inspect" else ARGS  # inspect has no order
    status, text = run([argv[0], str(path), *given, "--stride", "4", *argv[1:]])
    assert (status, text) == (2, "")
    err = capsys.readouterr().err
    assert re.search(r"--pack with --stride 4: packing cuts every document into pieces at stride T.*drop --stride", err)
    assert not list(tmp_path.glob("p/*"))  # nothing written
    assert not (tmp_path / "f.svg").exists()


def test_epoch_pack_note_on_an_empty_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "short.jsonl"
    path.write_text('{"id": "a", "partition": "train", "tokens": [5]}\n')
    assert run(["epoch", str(path), *ARGS]) == (0, "")
    assert "has the 2 tokens one target needs" in capsys.readouterr().err


def test_trace_svg_pack_draws_rows_segments_and_dashed_padding(corpus: tuple[Path, list[sb.Document]], tmp_path: Path) -> None:
    from xml.etree import ElementTree

    path, docs = corpus
    svg, html = tmp_path / "f.svg", tmp_path / "f.html"
    status, text = run(["trace", str(path), *ARGS, "--svg", str(svg), "--html", str(html)])
    epoch = sb.Epoch(read_jsonl(path), context_length=4, batch_size=3, seed=9, pack=True)
    assert status == 0
    assert text.startswith(f"wrote {svg}: {len(epoch.items)} packed rows, {epoch.batch_count} batches, every row")
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ElementTree.parse(svg).getroot()
    rows = root.findall(".//s:g[@class='row']", ns)
    assert [int(r.get("data-number", -1)) for r in rows] == epoch.order.numbers().tolist()
    fills: dict[str, set[str]] = {}
    drawn: list[tuple[str, int]] = []
    for row in rows:
        segments = row.findall("s:g[@class='segment']", ns)
        pads = row.findall("s:g[@class='pad']", ns)
        used = sum(int(s.get("data-length", 0)) for s in segments)
        assert used + sum(int(p.get("data-positions", 0)) for p in pads) == 4  # T positions, segments then padding
        assert len(pads) == (used < 4)
        for pad in pads:
            box = pad.find("s:rect", ns)
            assert box is not None
            assert (box.get("fill"), box.get("stroke-dasharray")) == ("none", "5 3")
        for s in segments:
            box = s.find("s:rect", ns)
            assert box is not None
            fills.setdefault(s.get("data-document", ""), set()).add(box.get("fill", ""))
            drawn += [(s.get("data-document", ""), int(s.get("data-start", 0)) + j) for j in range(int(s.get("data-length", 0)))]
    assert all(len(f) == 1 for f in fills.values())  # one colour per document
    assert sorted(drawn) == sorted((d.id, t) for d in docs for t in range(len(d.tokens) - 1))
    note = root.find(".//s:text[@class='note']", ns)
    assert note is not None
    assert (note.text or "").startswith("PROOF|mode=pack|targets=")
    assert "stroke-dasharray" in html.read_text()


def test_trace_pack_large_epoch_draws_the_first_rows(tmp_path: Path) -> None:
    from streambatch.tools.figure.packed import MAX_ROWS, packed_svg

    docs = [sb.Document(f"d{i}", "train", range(3 + i % 7)) for i in range(200)]
    epoch = sb.Epoch(docs, context_length=2, batch_size=16, seed=1, pack=True)
    svg = packed_svg(epoch)
    assert svg.count('class="row"') == MAX_ROWS
    assert f"{len(epoch.items) - MAX_ROWS} more rows not drawn" in svg
