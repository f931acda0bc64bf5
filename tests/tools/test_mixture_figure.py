"""Issue 25, item 7: mixture pictures at the level of the store and packed pictures.

`trace --html` of a mixture works; the title, subtitle and legend lie inside the
drawing; every batch is drawn, one strip per batch up to `MAX_STRIPS`, else
groups of consecutive batches, and the figure says which.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.tools.figure.mixture import MAX_STRIPS, mixture_svg
from streambatch.tools.figure.svg import text_width


def _mixture(tmp_path: Path, docs: int) -> Path:
    rng = np.random.default_rng(1)
    entries = []
    for name, weight, count in (("web-crawl-english", 0.6, docs), ("code", 0.3, max(1, docs // 4)), ("math", 0.1, 2)):
        sb.write_store(
            tmp_path / name,
            [sb.Document(f"{name}{i}", "train", rng.integers(0, 500, int(rng.integers(10, 60))).tolist()) for i in range(count)],
        )
        entries.append({"name": name, "path": name, "weight": weight})
    path = tmp_path / "mixture.json"
    path.write_text(json.dumps({"sources": entries}))
    return path


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def _inside(svg: str) -> None:
    """Every text's drawn extent lies inside the SVG's width and height."""
    width, height = (float(v) for v in re.search(r'<svg [^>]*width="(\d+)" height="(\d+)"', svg).groups())  # type: ignore[union-attr]
    for x, y, size, value in re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*font-size="(\d+)"[^>]*>([^<]*)</text>', svg):
        assert float(x) + text_width(value, int(size)) <= width, value
        assert float(y) <= height, value


def test_trace_html_of_a_mixture_draws_every_batch_with_its_legend(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, 6)
    svg, page = tmp_path / "m.svg", tmp_path / "m.html"
    status, text = _run(["trace", str(mixture), "-T", "8", "-B", "8", "--seed", "3", "--svg", str(svg), "--html", str(page)])
    assert status == 0
    epoch = sb.Epoch(sb.open_source(mixture), context_length=8, batch_size=8, seed=3)
    assert text.count("wrote ") == 2
    assert "every batch" in text
    drawn = svg.read_text()
    assert epoch.batch_count <= MAX_STRIPS
    assert drawn.count('class="row"') == len(epoch.order)  # one cell per row of every batch
    cells = re.findall(r'class="row" data-batch="(\d+)" data-source="(\d+)"', drawn)
    assert [int(s) for _, s in cells] == epoch.order.sources().tolist()
    for name in ("web-crawl-english", "code", "math"):
        assert name in drawn
        assert name in page.read_text()
    assert "one strip per batch" in drawn
    _inside(drawn)
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert "<svg" in page.read_text()


def test_a_long_mixture_epoch_draws_every_batch_in_groups_and_says_so(tmp_path: Path) -> None:
    mixture = _mixture(tmp_path, 120)
    epoch = sb.Epoch(sb.open_source(mixture), context_length=4, batch_size=4, seed=3)
    assert epoch.batch_count > MAX_STRIPS
    drawn = mixture_svg(epoch)
    group = -(-epoch.batch_count // MAX_STRIPS)
    strips = -(-epoch.batch_count // group)
    assert f"each strip is {group} consecutive batches ({strips} strips)" in drawn
    shares = re.findall(r'class="share" data-source="(\d+)"', drawn)
    assert len(shares) >= strips  # every strip drawn, at least one source each
    assert {int(s) for s in shares} == {0, 1, 2}
    _inside(drawn)


@pytest.mark.parametrize("name", ["<script>", 'a"b&c'])
def test_source_names_are_escaped(tmp_path: Path, name: str) -> None:
    sb.write_store(tmp_path / "s", [sb.Document("d", "train", list(range(30)))])
    path = tmp_path / "mixture.json"
    path.write_text(json.dumps({"sources": [{"name": name, "path": "s", "weight": 1}]}))
    drawn = mixture_svg(sb.Epoch(sb.open_source(path), context_length=4, batch_size=4, seed=1))
    assert name not in drawn
