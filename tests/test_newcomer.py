"""A newcomer's first day (issue 18, item 7): explicit seeds, install hints, binary input, one meaning of ``-``.

Each refusal is checked through the API and the command line (exit 2, one line
naming the path or option and what to do, nothing written).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import EXTRAS, MissingDependencyError, install_hint
from streambatch.io.files import short_path
from streambatch.tools.figure import write_figure

ROOT = Path(__file__).resolve().parent.parent
DOCS = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def docs_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "tokens": [0, 10, 11, 12, 1]}\n{"id": "b", "tokens": [0, 20, 21, 1]}\n')
    return path


# --- the seed is explicit ------------------------------------------------------------------------------


def test_epoch_without_seed_warns_and_keeps_document_order() -> None:
    """Leaving seed= out still gives document order (old code keeps working), with a DeprecationWarning saying what to pass."""
    with pytest.warns(DeprecationWarning, match=r"pass seed=N .* or seed=None for document order") as caught:
        old = sb.Epoch(DOCS, context_length=2, batch_size=3)
    assert caught[0].filename == __file__  # points at the caller's line, where the fix goes
    explicit = sb.Epoch(DOCS, context_length=2, batch_size=3, seed=None)
    assert old.seed is None
    assert [str(p) for b in old for p in b.provenance] == [str(p) for b in explicit for p in b.provenance]
    assert [str(p) for b in old for p in b.provenance][:3] == ["train-a@0", "train-a@1", "train-a@2"]


def test_explicit_seed_or_none_does_not_warn() -> None:
    """seed=N, seed=None, and windows passed already shuffled need no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sb.Epoch(DOCS, context_length=2, batch_size=3, seed=7).seed == 7
        assert sb.Epoch(DOCS, context_length=2, batch_size=3, seed=None).seed is None
        shuffled = sb.shuffle(sb.windows(DOCS, context_length=2), seed=7)
        assert sb.Epoch(shuffled, batch_size=3).seed == 7
        assert sb.Epoch.from_windows(sb.windows(DOCS, context_length=2), batch_size=3).seed is None
        assert sb.Run(DOCS, context_length=2, batch_size=3, seed=None, epochs=1).seed is None


def test_run_requires_a_seed_and_the_cli_requires_an_order(docs_jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sb.Run has no default seed; the CLI needs --seed N or --sequential (exit 2, one line)."""
    with pytest.raises(TypeError, match="seed"):
        sb.Run(DOCS, context_length=2, batch_size=3)  # type: ignore[call-arg]
    status, out, err = run(["epoch", str(docs_jsonl), "-T", "2", "-B", "3"], capsys)
    assert (status, out) == (2, "")
    assert "--seed" in err
    assert "--sequential" in err
    assert len(err.strip().splitlines()) == 1


def test_every_readme_and_docstring_epoch_names_a_seed() -> None:
    """Every `Epoch(` call in the README, docs/, the package's docstrings and the scripts passes seed= (or passes windows)."""
    texts = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "streambatch").rglob("*.py")),
        *sorted((ROOT / "scripts").glob("*.py")),
    ]
    missing = []
    for path in texts:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            stripped = line.strip().removeprefix(">>> ")
            # a call written out (not elided as sb.Epoch(...), sb.Epoch(source, ...)) names its seed
            call = re.search(r"sb\.Epoch\((?!\.\.\.|\w+, \.\.\.\))", stripped) and not stripped.endswith("(")
            if call and "seed" not in stripped:
                missing.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert [] == missing


# --- install hints -------------------------------------------------------------------------------------


def test_extras_match_pyproject() -> None:
    """The hints' table of extras is pyproject's (bar the aggregates and the tools)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with (ROOT / "pyproject.toml").open("rb") as handle:
        declared = tomllib.load(handle)["project"]["optional-dependencies"]
    assert {k: tuple(v) for k, v in declared.items() if k in EXTRAS} == EXTRAS
    assert set(declared) - set(EXTRAS) == {"all-formats", "integrations", "test", "dev"}


def test_install_hint_installs_this_project_not_the_namesake() -> None:
    """A hint names the extra's packages and this checkout, never `pip install streambatch[...]` from an index."""
    for extra in EXTRAS:
        hint = install_hint(extra)
        assert "pip install streambatch" not in hint
        assert "'streambatch[" not in hint
        assert f"pip install -e '{short_path(ROOT)}[{extra}]'" in hint  # the checkout, as messages show paths
        assert all(f"'{package}'" in hint for package in EXTRAS[extra])


@pytest.mark.slow
def test_streambatch_torch_without_torch_names_the_extra() -> None:
    """`import streambatch.torch` where torch cannot be imported raises MissingDependencyError, not ModuleNotFoundError."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from streambatch.errors import MissingDependencyError\n"
        "try:\n    import streambatch.torch\n"
        "except MissingDependencyError as err:\n    print(type(err).__name__, isinstance(err, ImportError), err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.startswith("MissingDependencyError True streambatch.torch needs the torch package")
    assert "pip install 'torch>=2.1' 'torchdata>=0.8' (the torch extra of streambatch" in done.stdout
    assert issubclass(MissingDependencyError, ImportError)


# --- binary input ---------------------------------------------------------------------------------------


def _archive(tmp_path: Path) -> Path:
    inner = tmp_path / "inner.txt"
    inner.write_text("hello world\n")
    path = tmp_path / "corpus.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(inner, arcname="inner.txt")
    return path


def test_binary_files_are_refused_not_read_as_text(tmp_path: Path) -> None:
    """A .tar.gz (text after gunzip, but a tar holds NUL bytes) and a NUL-holding file are DataErrors naming the file."""
    archive = _archive(tmp_path)
    with pytest.raises(sb.DataError, match=r"corpus\.tar\.gz: binary data, not text \(a NUL byte at byte \d+\); extract"):
        list(sb.iter_text(archive))
    blob = tmp_path / "blob.dat"
    blob.write_bytes(b"looks like text" * 100 + b"\0\1\2")
    with pytest.raises(sb.DataError, match=r"blob\.dat: binary data, not text \(a NUL byte at byte 1500\)"):
        list(sb.iter_text(blob))
    with pytest.raises(sb.DataError, match=r"blob\.dat: binary data, not text \(a NUL byte at byte 1500\)"):
        list(sb.iter_text(blob, per_line=True))
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(sb.DataError, match=r"latin\.txt: not UTF-8 text .* at byte 3\): a binary file\?"):
        list(sb.iter_text(latin))


def test_prepare_refuses_or_skips_a_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`prepare` on an archive: exit 2 and no store; with --skip-bad the archive is listed and left out."""
    archive = _archive(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("plain text\n")
    store = tmp_path / "store"
    status, out, err = run(["prepare", str(archive), str(text), "-o", str(store)], capsys)
    assert (status, out) == (2, "")
    assert err.startswith(f"streambatch: error: {archive}: binary data, not text")
    assert not store.exists()
    status, out, err = run(["prepare", str(archive), str(text), "-o", str(store), "--skip-bad", "--quiet"], capsys)
    assert status == 0
    assert f"skipped {archive}: binary data" in err
    written = sb.open_store(store)
    assert [Path(written.document(i).id).name for i in range(len(written))] == ["notes.txt"]


# --- one meaning of "-" ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["prepare", "{docs}", "-o", "-"], "prepare --output -"),
        (["prepare", "-", "-o", "{tmp}/store"], "prepare INPUTS -"),
        (["plan", "{docs}", "-T", "2", "-B", "3", "--seed", "7", "-o", "-"], "plan --output -"),
        (["epoch", "{docs}", "-T", "2", "-B", "3", "--seed", "7", "--plan-dir", "-"], "epoch --plan-dir -"),
        (["epoch", "{docs}", "-T", "2", "-B", "3", "--seed", "7", "-o", "{tmp}/o.jsonl", "--save-state", "-"], "--save-state -"),
        (["inspect", "-"], "inspect SOURCE -"),
        (["audit", "-", "-T", "2", "-B", "3", "--seed", "7"], "audit SOURCE -"),
    ],
)
def test_dash_is_refused_where_no_stream_is_written(
    argv: list[str],
    option: str,
    docs_jsonl: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store, a plan folder, a state file or a source named '-' is refused (exit 2): no file or folder named '-'."""
    monkeypatch.chdir(tmp_path)
    args = [a.format(docs=docs_jsonl, tmp=tmp_path) for a in argv]
    status, out, err = run(args, capsys)
    assert (status, out) == (2, "")
    assert option in err
    assert "is accepted only where a stream is written" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_dash_is_standard_output_for_streams(docs_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """epoch -o -, trace --svg -, trace --html - and demo --svg - write to standard output, reports go to stderr."""
    status, out, _ = run(["epoch", str(docs_jsonl), "-T", "2", "-B", "3", "--seed", "7", "-o", "-"], capsys)
    assert status == 0
    assert len(out.splitlines()) == 2
    status, out, err = run(["trace", str(docs_jsonl), "-T", "2", "-B", "3", "--seed", "7", "--svg", "-"], capsys)
    assert status == 0
    assert out.startswith("<svg ")
    assert out.rstrip().endswith("</svg>")
    assert "wrote standard output: 5 windows, 2 batches" in err
    page = tmp_path / "page.html"
    status, out, err = run(
        ["trace", str(docs_jsonl), "-T", "2", "-B", "3", "--seed", "7", "--html", "-", "--svg", str(page)], capsys
    )
    assert status == 0
    assert out.startswith("<!DOCTYPE html>")
    assert page.read_text().startswith("<svg ")
    status, out, _ = run(["demo", "--svg", "-"], capsys)
    assert status == 0
    assert out.startswith("<svg ")
    status, out, err = run(["trace", str(docs_jsonl), "-T", "2", "-B", "3", "--seed", "7", "--html", "-", "--svg", "-"], capsys)
    assert (status, out) == (2, "")
    assert "both name standard output" in err


def test_write_figure_dash_needs_a_stream() -> None:
    """In Python, '-' is the stream passed as stdout=; without one it is refused."""
    epoch = sb.Epoch(DOCS, context_length=2, batch_size=3, seed=7)
    with pytest.raises(sb.ConfigError, match="needs a stream"):
        write_figure(epoch, svg="-")
    stream = io.StringIO()
    assert write_figure(epoch, svg="-", stdout=stream) == ["-"]
    assert stream.getvalue().startswith("<svg ")


def test_a_missing_extra_on_the_command_line_names_the_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prepare x.txt.zst` without zstandard: exit 2, one line with the extra's command, no store."""
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    path = tmp_path / "notes.txt.zst"
    path.write_bytes(b"not read")
    status, out, err = run(["prepare", str(path), "-o", str(tmp_path / "store")], capsys)
    assert (status, out) == (2, "")
    assert "needs the zstandard package, which is not installed: pip install 'zstandard>=0.21' (the zstd extra" in err
    assert f"pip install -e '{short_path(ROOT)}[zstd]'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "store").exists()
