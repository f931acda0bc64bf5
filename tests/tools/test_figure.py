"""Tests for `streambatch.tools.figure`, ``streambatch trace`` and ``streambatch demo --svg/--html``: read the picture back."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.tools import chapter
from streambatch.tools.figure import epoch_html, epoch_svg, xml_text

NS = {"svg": "http://www.w3.org/2000/svg"}


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert "{http://www.w3.org/2000/svg}svg" == root.tag
    return root


def groups(root: ET.Element, kind: str) -> list[ET.Element]:
    return root.findall(f".//svg:g[@class='{kind}']", NS)


def texts(element: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in element.iter("{http://www.w3.org/2000/svg}text")]


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def test_chapter_figure_content() -> None:
    """The chapter's figure: five slots in order, batches of 3 and 2 rows, denominators 6 and 4, one dashed empty row."""
    root = parse(epoch_svg(chapter.build_epoch()))
    slots = groups(root, "slot")
    assert ["train-b@1", "train-a@1", "train-b@0", "train-a@0", "train-a@2"] == [s.get("data-origin") for s in slots]
    assert ["0", "0", "0", "1", "1"] == [s.get("data-batch") for s in slots]
    batches = groups(root, "batch")
    assert [("3", "[3, 2]", "6"), ("2", "[2, 2]", "4")] == [
        (b.get("data-width"), b.get("data-shape"), b.get("data-denominator")) for b in batches
    ]
    assert [3, 2] == [len(b.findall("svg:g[@class='row']", NS)) for b in batches]
    assert "denominator 3 × 2 = 6 target tokens" in " ".join(texts(batches[0]))
    assert "denominator 2 × 2 = 4 target tokens" in " ".join(texts(batches[1]))
    first_row = batches[0].find("svg:g[@class='row']", NS)
    assert first_row is not None
    assert ["row 0", "train-b@1", "20", "21", "21", "1"] == texts(first_row)  # inputs [20, 21], targets [21, 1]
    assert [] == batches[0].findall("svg:g[@class='unused']", NS)
    (empty,) = batches[1].findall("svg:g[@class='unused']", NS)
    (slot,) = empty.findall("svg:rect", NS)
    assert ("1", "6 4", "none") == (empty.get("data-rows"), slot.get("stroke-dasharray"), slot.get("fill"))
    assert ["row 2: not created — contributes nothing"] == texts(empty)


def test_chapter_figure_final_batch_against_capacity() -> None:
    """Section 3: capacity 3 × 2 = 6 drawn dashed, the actual 2 × 2 = 4 solid, the rest dashed and empty."""
    root = parse(epoch_svg(chapter.build_epoch()))
    (capacity,) = groups(root, "capacity")
    (final,) = groups(root, "final")
    assert ("6", "2", "4") == (capacity.get("data-tokens"), final.get("data-width"), final.get("data-denominator"))
    assert "requested capacity: 3 × 2 = 6 token slots" in texts(capacity)
    assert "actual final width: 2 × 2 = 4 target tokens, the denominator" in texts(final)
    (unused,) = final.findall("svg:g[@class='unused']", NS)
    assert ["1 × 2 = 2 slots not created: contribute nothing"] == texts(unused)
    full = float(capacity.find("svg:rect", NS).get("width"))  # type: ignore[union-attr]
    solid = float(final.find("svg:rect", NS).get("width"))  # type: ignore[union-attr]
    assert 4 / 6 == pytest.approx(solid / full)


def test_notes_and_escaping() -> None:
    """Document ids are XML-escaped (control characters shown as \\xNN); notes print under the figure."""
    docs = [sb.Document('a<&>"\x01', "train", [1, 2, 3])]
    svg = epoch_svg(sb.Epoch(docs, context_length=1, batch_size=4, seed=None), notes=["PROOF|x=1"])
    root = parse(svg)
    assert ['a<&>"\\x01@0', 'a<&>"\\x01@1'] == [s.get("data-origin") for s in groups(root, "slot")]
    assert ["PROOF|x=1"] == [n.text for n in root.findall(".//svg:text[@class='note']", NS)]
    assert "a&lt;&amp;&gt;&quot;\\x01" == xml_text('a<&>"\x01')


def test_large_epoch_draws_a_summary() -> None:
    """More than 64 windows: length bins with window span and tail, [B] x k plus the final batch; no rows."""
    docs = [sb.Document(f"d{i}", "train", range(3 + 7 * i)) for i in range(12)] + [sb.Document("short", "train", [1, 2])]
    epoch = sb.Epoch(docs, context_length=4, batch_size=16, stride=2, seed=1)
    assert 64 < epoch.window_count
    root = parse(epoch_svg(epoch))
    assert [] == groups(root, "row")
    bins = groups(root, "bin")
    assert 13 == sum(int(b.get("data-documents", "0")) for b in bins)
    assert all(b.find("svg:rect[@class='windowed']", NS) is not None for b in bins)
    (full,) = groups(root, "full-batches")
    (final,) = groups(root, "final")
    full_count, rest = divmod(epoch.window_count, 16)
    assert (str(full_count), "16", "64") == (full.get("data-count"), full.get("data-width"), full.get("data-denominator"))
    assert (str(rest), str(rest * 4)) == (final.get("data-width"), final.get("data-denominator"))
    assert 1 == len(final.findall("svg:g[@class='unused']", NS))
    assert any("T + 1 = 5" == t for t in texts(root))


def test_html_page_embeds_the_svg() -> None:
    """The HTML page has a title, a legend and the same SVG inline."""
    epoch = chapter.build_epoch()
    page = epoch_html(epoch, title="Chapter 21 & friends")
    assert "<title>Chapter 21 &amp; friends</title>" in page
    assert 3 == page.count("<li>")
    assert epoch_svg(epoch) in page


def test_cli_trace_writes_svg_and_html(tmp_path: Path) -> None:
    """`streambatch trace` draws any small epoch and prints its PROOF line under it."""
    source = tmp_path / "docs.jsonl"
    source.write_text(
        '{"id": "train-a", "tokens": [0, 10, 11, 12, 1]}\n{"id": "train-b", "tokens": [0, 20, 21, 1]}\n'
        '{"id": "val", "partition": "validation", "tokens": [5, 6, 7]}\n'
    )
    svg, page = tmp_path / "e.svg", tmp_path / "e.html"
    status, text = run(
        ["trace", str(source), "--keep-partition", "-T", "2", "-B", "3", "--seed", "7", "--svg", str(svg), "--html", str(page)]
    )
    assert 0 == status
    assert [
        f"wrote {svg}: 5 windows, 2 batches, every row",
        f"wrote {page}: 5 windows, 2 batches, every row",
    ] == text.splitlines()
    root = parse(svg.read_text())
    assert ["6", "4"] == [b.get("data-denominator") for b in groups(root, "batch")]
    (note,) = root.findall(".//svg:text[@class='note']", NS)
    assert (note.text or "").startswith("PROOF|coverage=5/5|duplicates=0|")
    assert svg.read_text() in page.read_text()


def test_cli_trace_needs_an_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --svg or --html there is nothing to draw: exit 2, no file."""
    source = tmp_path / "docs.jsonl"
    source.write_text('{"id": "a", "tokens": [1, 2, 3]}\n')
    assert (2, "") == run(["trace", str(source), "-T", "1", "-B", "2", "--sequential"])
    assert re.search("trace needs --svg FILE and/or --html FILE", capsys.readouterr().err)
    assert (2, "") == run(["trace", str(source), "-T", "0", "-B", "2", "--sequential", "--svg", str(tmp_path / "x.svg")])
    assert not (tmp_path / "x.svg").exists()


def test_cli_demo_draws_the_chapter(tmp_path: Path, golden: Path) -> None:
    """`streambatch demo --svg --html` draws the chapter's epoch and says what it wrote, as trace does."""
    svg, page = tmp_path / "demo.svg", tmp_path / "demo.html"
    status, text = run(["demo", "--svg", str(svg), "--html", str(page)])
    assert status == 0
    assert [line.split(":")[0] for line in text.splitlines()] == [f"wrote {svg}", f"wrote {page}"]
    assert (golden / "expected-report.txt").read_text() == run(["demo"])[1]
    root = parse(svg.read_text())
    assert [3, 2] == [len(b.findall("svg:g[@class='row']", NS)) for b in groups(root, "batch")]
    (note,) = root.findall(".//svg:text[@class='note']", NS)
    assert chapter.proof_line(chapter.learner_evidence()) == note.text
    assert "Chapter 21" in page.read_text()


def _text_boxes(root: ET.Element) -> list[tuple[str, float, float, float, float]]:
    """(text, left, top, right, bottom) of every text element, with the width estimate the canvas uses."""
    from streambatch.tools.figure.svg import text_width

    boxes = []
    for t in root.iter("{http://www.w3.org/2000/svg}text"):
        value, size = "".join(t.itertext()), float(t.get("font-size", "13"))
        x, y, width = float(t.get("x", "0")), float(t.get("y", "0")), text_width(value, size)
        left = x - {"middle": width / 2, "end": width}.get(t.get("text-anchor", ""), 0.0)
        boxes.append((value, left, y - 0.8 * size, left + width, y + 0.2 * size))
    return boxes


@pytest.mark.parametrize(
    ("lengths", "T", "B"),
    [
        ([130] * 300 + [5000] * 3, 128, 32),  # the tallest bar right of the T + 1 mark (its count label at the top)
        ([129, 130, 200] * 100, 128, 7),  # final batch almost full: the unused-capacity note has no room in its slot
        ([2, 3, 9, 40, 300, 2000] * 30, 8, 1000),  # one batch, the final one, nearly empty
        ([17] * 2000 + [1, 1, 1], 16, 3),  # short documents, windows in one bin, final width 2 of 3
        ([70000, 3, 4], 2, 4096),  # empty bins between the used ones
    ],
)
def test_summary_labels_never_overlap(lengths: list[int], T: int, B: int) -> None:
    """No two labels of a large epoch's summary are drawn over each other (text boxes as the canvas sizes them)."""
    docs = [sb.Document(f"d{i}", "train", [1] * n) for i, n in enumerate(lengths)]
    epoch = sb.Epoch(docs, context_length=T, batch_size=B, seed=7)
    assert epoch.window_count > 64
    root = parse(epoch_svg(epoch))
    boxes = _text_boxes(root)
    clashes = [
        (a[0], b[0])
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
    ]
    assert [] == clashes
    assert f"T + 1 = {T + 1}" in texts(root) or len({min(n.bit_length(), 99) for n in lengths}) == 1
    assert "not created: contributes nothing" in texts(root)
