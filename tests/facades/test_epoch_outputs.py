"""Issue 25, item 7: the `epoch` command's newcomer traps and its binary output.

- abbreviated flags are refused (``--batch`` is not ``--batch-size``);
- before writing, an output far larger than the corpus is announced (with the
  ``--stride T`` hint for overlapping windows); a summary line ends every file write;
- ``--format arrow`` (or an ``.arrow`` output) writes an Arrow IPC stream with the
  same fields as the JSON lines, under the same lock, resume and digest rules;
- a ``--save-state`` pair moved together still resumes (the output is recorded
  relative to the state), and ``--save-state`` over a saved state is refused.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch.cli.epoch as cli_epoch
import streambatch.cli.outputs as cli_outputs
from streambatch.cli import main

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")

ARGS = ["-T", "3", "-B", "2", "--seed", "11"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def source(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    path = tmp_path / "in.jsonl"
    lines = [
        {"id": f"d{i}", "partition": "train", "tokens": rng.integers(0, 900, int(rng.integers(4, 16))).tolist()}
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _arrow_records(path: Path) -> list[dict[str, Any]]:
    return ipc.open_stream(str(path)).read_all().to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("flag", ["--batch", "--context", "--seq", "--out"])
def test_abbreviated_flags_are_refused(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    out = tmp_path / "x.jsonl"
    argv = ["epoch", str(source), "-T", "3", "-B", "2", "--seed", "1", "-o", str(out)]
    argv += [flag, "4"] if flag != "--seq" else [flag]
    status, text, err = _run(argv, capsys)
    assert (status, text) == (2, "")
    assert len(err.splitlines()) == 1
    assert "unrecognized arguments" in err or "not allowed" in err or "required" in err
    assert not out.exists()


def test_an_output_far_larger_than_the_corpus_is_announced_with_the_stride_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "long.jsonl", tmp_path / "x.jsonl"
    rng = np.random.default_rng(2)
    source.write_text("".join(json.dumps({"id": f"d{i}", "tokens": rng.integers(0, 500, 400).tolist()}) + "\n" for i in range(5)))
    status, _, err = _run(["epoch", str(source), "-T", "64", "-B", "64", "--seed", "1", "-o", str(out)], capsys)
    assert status == 0
    warning, summary = err.splitlines()
    ratio = float(re.search(r"([\d.,]+)x the corpus", warning)[1].replace(",", ""))  # type: ignore[index]
    assert ratio >= cli_outputs.WARN_RATIO
    assert "--stride 64 gives non-overlapping windows" in warning
    estimate = re.search(r"\(([\d.]+) (kB|B|MB) as jsonl\)", warning)
    assert estimate is not None
    size = out.stat().st_size
    assert re.fullmatch(r"streambatch: wrote \d+ batches \(.*\) to .*x\.jsonl", summary)
    shown = float(estimate[1]) * {"B": 1, "kB": 1e3, "MB": 1e6}[estimate[2]]
    assert 0.5 * size <= shown <= 2 * size  # the estimate is the first record's size times the batches


def test_non_overlapping_windows_write_without_a_warning(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.jsonl"
    status, _, err = _run(["epoch", str(source), "-T", "3", "--stride", "3", "-B", "2", "--seed", "1", "-o", str(out)], capsys)
    assert status == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert err.splitlines() == [f"streambatch: wrote {len(lines)} batches ({out.stat().st_size} B) to {out}"] or (
        len(err.splitlines()) == 1 and err.startswith(f"streambatch: wrote {len(lines)} batches")
    )


@pytest.mark.parametrize("mode", [[], ["--pack"]])
def test_arrow_output_holds_the_json_records_fields(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: list[str]
) -> None:
    args = ["-T", "3", "-B", "2", "--seed", "11"] if not mode else ["-T", "5", "-B", "2", "--seed", "11", *mode]
    jsonl, arrow = tmp_path / "x.jsonl", tmp_path / "x.arrow"
    assert _run(["epoch", str(source), *args, "-o", str(jsonl)], capsys)[0] == 0
    assert _run(["epoch", str(source), *args, "-o", str(arrow)], capsys)[0] == 0
    expected = [json.loads(line) for line in jsonl.read_text().splitlines()]
    got = _arrow_records(arrow)
    assert len(got) == len(expected)
    for record, want in zip(got, expected, strict=True):
        assert list(record) == list(want)  # the same fields, in the same order
        assert record == want
    table = ipc.open_stream(str(arrow)).read_all()
    flat = table.column("inputs").combine_chunks().flatten().flatten().to_numpy()
    assert flat.dtype.kind == "u"  # the store's token dtype, no Python object per token
    assert flat.tolist() == [t for r in expected for row in r["inputs"] for t in row]


def test_arrow_to_standard_output_is_refused(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, text, err = _run(["epoch", str(source), *ARGS, "--format", "arrow"], capsys)
    assert (status, text) == (2, "")
    assert "--format arrow writes binary: pass --output FILE" in err


@pytest.mark.parametrize(("name", "fmt"), [("out.jsonl", []), ("out.arrow", []), ("out.bin", ["--format", "arrow"])])
def test_an_interrupted_run_resumes_to_the_same_bytes_in_either_format(
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    fmt: list[str],
) -> None:
    reference, out, state = tmp_path / ("reference-" + name), tmp_path / name, tmp_path / "state.json"
    assert _run(["epoch", str(source), *ARGS, *fmt, "-o", str(reference)], capsys)[0] == 0
    real, calls = cli_epoch.atomic_text, []

    def stop(target: Any) -> Any:
        calls.append(target)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(target)

    with monkeypatch.context() as patch:
        patch.setattr(cli_epoch, "atomic_text", stop)
        assert _run(["epoch", str(source), *ARGS, *fmt, "-o", str(out), "--save-state", str(state)], capsys)[0] == 130
    assert 0 < out.stat().st_size < reference.stat().st_size
    with out.open("ab") as handle:  # a batch written after the last saved state: cut back on resume
        handle.write(b"partial record")
    moved = tmp_path / "moved"
    moved.mkdir()
    (out).rename(moved / name)
    state.rename(moved / "state.json")
    status, _, err = _run(["epoch", str(source), *ARGS, "-o", str(moved / name), "--resume", str(moved / "state.json")], capsys)
    assert status == 0, err
    assert (moved / name).read_bytes() == reference.read_bytes()
    assert json.loads((moved / "state.json").read_text())["output"]["path"] == name


def test_save_state_over_a_saved_state_is_refused(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)], capsys)[0] == 0
    before = out.read_bytes(), state.read_bytes()
    status, text, err = _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)], capsys)
    assert (status, text) == (2, "")
    assert len(err.splitlines()) == 1
    assert "already holds a run's state; continue it with --resume" in err
    assert (out.read_bytes(), state.read_bytes()) == before


def test_a_resume_in_another_format_is_refused(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, state = tmp_path / "out.arrow", tmp_path / "state.json"
    assert _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)], capsys)[0] == 0
    before = out.read_bytes(), state.read_bytes()
    status, _, err = _run(["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state), "--format", "jsonl"], capsys)
    assert status == 2
    assert "the state's output is arrow, not --format jsonl" in err
    assert (out.read_bytes(), state.read_bytes()) == before


def test_progress_is_drawn_when_asked(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    out = tmp_path / "x.jsonl"
    status, _, err = _run(["epoch", str(source), *ARGS, "--stride", "3", "-o", str(out), "--progress"], capsys)
    assert status == 0
    batches = out.read_text().count("\n")
    assert f"{batches}/{batches}" in err  # tqdm's count of batches written
