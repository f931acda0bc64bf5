"""Bounded reading: one line and one document have a documented size limit, refused (file:line) without holding them."""

from __future__ import annotations

import gzip
import io
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.cli._common import byte_size
from streambatch.prepare import iter_files
from streambatch.read import inputs as _inputs
from streambatch.read.blocks import read_options
from streambatch.read.jsonl import iter_jsonl
from tests.hostile import PEAK_RSS


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.integers(1, 40), st.integers(1, 25), st.booleans())
def test_line_chunks_refuse_the_first_long_line(lengths: list[int], size: int, limit: int, last_newline: bool) -> None:
    """Any chunk size: the first line over the limit is named by number; without one, the chunks are the file."""
    data = b"\n".join(b"x" * n for n in lengths) + (b"\n" if last_newline else b"")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.txt"
        path.write_bytes(data)
        long = next((i + 1 for i, n in enumerate(lengths) if n > limit), None)
        if long is None:
            assert data == b"".join(c.data for c in _inputs.line_chunks(path, size, limit))
        else:
            with pytest.raises(sb.DataError, match=rf"f.txt:{long}: a line of more than {limit} bytes .*--max-line-bytes"):
                list(_inputs.line_chunks(path, size, limit))


def test_the_limits_are_options(tmp_path: Path) -> None:
    """max_line_bytes / max_document_bytes refuse beyond, accept at the limit, through every reader."""
    (tmp_path / "d.jsonl").write_text('{"tokens": [1]}\n' + json.dumps({"text": "y" * 100}) + "\n")
    (tmp_path / "t.txt").write_text("short\n" + "z" * 50 + "\n")
    row = len(json.dumps({"text": "y" * 100}))
    with pytest.raises(sb.DataError, match=r"d.jsonl:2: a line of more than 99 bytes"):
        list(iter_files([tmp_path / "d.jsonl"], max_line_bytes=99))
    assert 2 == len(list(iter_files([tmp_path / "d.jsonl"], max_line_bytes=row)))
    with pytest.raises(sb.DataError, match=r"t.txt:2: a line of more than 49 bytes"):
        list(iter_files([tmp_path / "t.txt"], per_line=True, max_line_bytes=49))
    assert 2 == len(list(iter_files([tmp_path / "t.txt"], per_line=True, max_line_bytes=50)))
    with pytest.raises(sb.DataError, match=r"t.txt: a document of more than 56 bytes .*--max-document-bytes"):
        list(iter_files([tmp_path / "t.txt"], max_document_bytes=56))
    assert 1 == len(list(iter_files([tmp_path / "t.txt"], max_document_bytes=57)))
    with pytest.raises(sb.DataError, match=r"d.jsonl:2: a line of more than 20 bytes"):
        list(iter_jsonl(tmp_path / "d.jsonl", max_line_bytes=20))
    with pytest.raises(sb.DataError, match=r"d.jsonl:2: a line"):
        sb.prepare_store([tmp_path], tmp_path / "s", max_line_bytes=20, quiet=True)
    assert not (tmp_path / "s").exists()
    store = sb.prepare_store([tmp_path], tmp_path / "s", max_line_bytes=20, skip_bad=True, quiet=True)
    assert ["t.txt"] == list(store.ids)
    rows = [{"id": "small", "text": "é" * 10}, {"id": "big", "text": "é" * 30}]  # 20 and 60 bytes of UTF-8
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(sb.DataError, match=r"r.jsonl:2 \(document id='big'\): a text of more than 59 bytes"):
        list(iter_files([tmp_path / "r.jsonl"], max_document_bytes=59))
    assert 2 == len(list(iter_files([tmp_path / "r.jsonl"], max_document_bytes=60)))
    for bad in (0, -1, True, 1.5, "64MiB", None):
        with pytest.raises(sb.ConfigError, match="must be a positive number of bytes"):
            read_options(max_line_bytes=bad)  # type: ignore[arg-type]
    assert (_inputs.MAX_LINE_BYTES, _inputs.MAX_DOCUMENT_BYTES) == (64 << 20, 256 << 20)


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-line-bytes on prepare and on every SOURCE command; --max-document-bytes on prepare; exit 2, one line."""
    data = tmp_path / "d.jsonl.gz"
    data.write_bytes(
        gzip.compress(b'{"id": "a", "tokens": [0, 5, 6, 7, 8, 1]}\n' + b'{"id": "b", "tokens": [' + b"3, " * 400 + b"1]}\n")
    )
    code, _ = cli("prepare", str(data), "-o", str(tmp_path / "s"), "--max-line-bytes", "1K")
    err = capsys.readouterr().err.strip().splitlines()
    assert 2 == code
    assert 1 == len(err)
    assert "d.jsonl.gz:2: a line of more than 1,024 bytes" in err[0]
    assert (0, "") == cli("prepare", str(data), "-o", str(tmp_path / "s"), "--max-line-bytes", "2KiB", "-q")
    code, _ = cli("inspect", str(data), "--max-line-bytes", "1024")
    assert 2 == code
    assert "d.jsonl.gz:2: a line of more than 1,024 bytes" in capsys.readouterr().err
    assert 0 == cli("inspect", str(data), "--max-line-bytes", "2k")[0]
    text = tmp_path / "t.txt"
    text.write_text("x" * 2000)
    code, _ = cli("prepare", str(text), "-o", str(tmp_path / "t"), "--max-document-bytes", "1K")
    assert 2 == code
    assert "t.txt: a document of more than 1,024 bytes" in capsys.readouterr().err
    assert (1024, 64 << 20, 3 << 30, 12) == (byte_size("1K"), byte_size("64MiB"), byte_size("3G"), byte_size("12"))
    for bad in ("0", "x", "1.5M", "-3"):
        with pytest.raises(Exception, match=r"size in bytes|at least 1 byte"):
            byte_size(bad)


_CHILD = (
    PEAK_RSS
    + """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from streambatch.cli import main
code = main(sys.argv[1:])
print("exit", code, "peak", peak())
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "argv", "message", "peak"),
    [
        ("bomb.txt.zst", ["prepare", "--per-line", "-o", "S"], ":1: a line of more than 67,108,864 bytes", 256 << 20),
        ("bomb.jsonl.zst", ["prepare", "-o", "S"], ":1: a line of more than 67,108,864 bytes", 256 << 20),
        ("bomb.jsonl.zst", ["inspect"], ":1: a line of more than 67,108,864 bytes", 256 << 20),
        ("bomb.txt.zst", ["prepare", "-o", "S"], ": a document of more than 268,435,456 bytes", 640 << 20),
    ],
)
def test_zst_bomb_under_an_address_space_limit(tmp_path: Path, name: str, argv: list[str], message: str, peak: int) -> None:
    """A 190 KiB .zst of one 6 GiB line: refused (exit 2, file:line) under a 1 GiB address space, peak RSS asserted."""
    zstandard = pytest.importorskip("zstandard")
    frame = zstandard.ZstdCompressor(level=19).compress(b"a" * (64 << 20))
    bomb = tmp_path / name
    bomb.write_bytes(frame * 96)  # frames concatenate: 6 GiB of one line
    assert bomb.stat().st_size < 256 << 10
    args = [a.replace("S", str(tmp_path / "S")) for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args[:1], str(bomb), *args[1:]], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr
    assert "MemoryError" not in done.stderr
    assert 1 == len(done.stderr.strip().splitlines())
    assert f"{name}{message}" in done.stderr
    words = done.stdout.split()
    assert ["exit", "2"] == words[:2]
    assert int(words[3]) < peak, f"peak RSS {int(words[3]) >> 20} MiB"
    assert not (tmp_path / "S").exists()
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != 1 << 30  # the limit was the child's only
