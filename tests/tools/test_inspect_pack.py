"""``streambatch inspect --pack`` and `streambatch.tools.inspect.mode_summaries`: both modes side by side, by enumeration."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.cli import main
from streambatch.tools.inspect import mode_summaries


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def brute(lengths: list[int], T: int) -> dict[str, tuple[int, int, int]]:
    """(covered targets, documents seen, rows) of each mode, by enumerating windows and pieces one by one."""
    covered, seen, windows = set(), set(), 0
    for d, L in enumerate(lengths):
        for start in range(0, L - T, T):  # windows of T + 1 tokens at stride T
            windows += 1
            seen.add(d)
            covered |= {(d, start + j) for j in range(1, T + 1)}
    targets = sum(max(L - 1, 0) for L in lengths)
    return {
        "windows": (len(covered), len(seen), windows),
        "packed": (targets, sum(L > 1 for L in lengths), -1),
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=12), st.integers(1, 9), st.integers(1, 5))
def test_mode_summaries_match_enumeration(lengths: list[int], T: int, B: int) -> None:
    modes = mode_summaries(np.array(lengths, dtype=np.int64), T, B)
    expected = brute(lengths, T)
    targets = sum(max(L - 1, 0) for L in lengths)
    for mode in ("windows", "packed"):
        m = modes[mode]
        covered, seen, rows = expected[mode]
        assert (m["covered_targets"], m["documents_seen"]) == (covered, seen)
        if rows >= 0:
            assert m["rows"] == rows
        assert m["positions"] == m["rows"] * T
        assert m["pad_positions"] == m["positions"] - covered
        assert m["coverage"] == (covered / targets if targets else 1.0)
        assert m["batches"] == -(-m["rows"] // B)
    assert modes["windows"]["pad_positions"] == 0  # windows never pad
    packed = modes["packed"]
    assert packed["row_lower_bound"] == -(-targets // T) <= packed["rows"]
    assert packed["skipped_one_token_documents"] == lengths.count(1)
    # every packed row holds at least one segment: no more rows than pieces with a target
    assert packed["rows"] <= sum(-(-(L - 1) // T) for L in lengths if L > 1)


DOCS = (
    '{"id": "a", "partition": "train", "tokens": [0, 10, 11, 12, 1]}\n'
    '{"id": "b", "partition": "train", "tokens": [0, 20, 21, 1]}\n'
    '{"id": "c", "partition": "train", "tokens": [0, 40]}\n'
    '{"id": "v", "partition": "validation", "tokens": [0, 30, 31, 32, 1]}\n'
)


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text(DOCS)
    return path


def test_inspect_pack_text_shows_both_modes(jsonl: Path) -> None:
    status, text = run(["inspect", str(jsonl), "-T", "3", "-B", "2", "--pack"])
    assert status == 0
    # the mode asked for first: the packed table, then the window mode's
    assert text.index("T=3: packed vs windows at stride 3") < text.index("windows: T=3, stride=3, B=2")
    table = text[text.index("T=3: packed vs windows at stride 3") :].split("\n\n")[0].splitlines()
    assert table[0].split("  ")[-1].strip() == "validation: windows"
    cells = {line[:24].strip(): line[24:].split() for line in table[1:]}
    # train: targets 4 + 3 + 1 = 8; windows at stride 3 cover a@0 and b@0 (6); packing covers all 8 in 3 rows, 1 pad
    assert " ".join(cells["target tokens covered"]) == "8 (100.0 %) 6 (75.0 %) 4 (100.0 %) 3 (75.0 %)"
    assert cells["documents seen"] == ["3", "2", "1", "1"]
    assert cells["rows of 3 positions"] == ["3", "2", "2", "1"]
    assert cells["pad share of positions"] == ["11.111", "%", "0.000", "%", "33.333", "%", "0.000", "%"]
    assert cells["batches"] == ["2", "1", "1", "1"]


def test_inspect_pack_json_matches_the_library(jsonl: Path) -> None:
    status, text = run(["inspect", str(jsonl), "-T", "3", "--pack", "--json", "--partition", "train"])
    assert status == 0
    summary = json.loads(text)
    assert summary["pack"] is True
    assert summary["stride"] == 3
    assert summary["partitions"]["train"]["modes"] == mode_summaries(np.array([5, 4, 2]), 3, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pack"], "--pack needs --context-length"),
        (["-T", "3", "--stride", "1", "--pack"], "--pack with --stride 1: packing cuts every document into pieces at stride T"),
    ],
)
def test_inspect_pack_refusals(jsonl: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, text = run(["inspect", str(jsonl), *argv])
    assert (status, text) == (2, "")
    assert message in capsys.readouterr().err
