"""The part plan (``--part I/N`` cuts one large file at line / row-group boundaries) and the corpus folder of a local run.

The Ray executor runs the same per-part function: tests/on_ray compares it with what these tests pin.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.read.blocks import read_options
from streambatch.read.inputs import line_chunks
from streambatch.read.parts import bounds, owner, part_pieces, rows_in
from streambatch.read.select import select_inputs
from tests.parts_corpus import PROMPTS, docs, epoch_rows, every_reader, folder_bytes, part_stores, prompt_rows
from tests.read.test_prepare import cli
from tests.read.test_read_tokenizers import CORPUS

pytest.importorskip("pyarrow")
pytest.importorskip("datasets")


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    tail=st.binary(max_size=6).map(lambda b: b.replace(b"\n", b"")),
    count=st.integers(1, 9),
    size=st.integers(1, 16),
)
def test_spans_of_a_file_are_its_lines_once_numbered_as_whole(lines: list[bytes], tail: bytes, count: int, size: int) -> None:
    """Each line belongs to the part holding its first byte: the parts' chunks, in order, are the file, line numbers kept."""
    data = b"".join(line + b"\n" for line in lines) + tail
    with tempfile.NamedTemporaryFile(delete=False) as handle:
        handle.write(data)
    try:
        seen = b""
        for i in range(count):
            lo, hi = bounds(len(data), count)[i : i + 2]
            for chunk in line_chunks(handle.name, size, 1 << 20, span=(lo, hi)):
                assert (chunk.offset, chunk.first_line) == (len(seen), 1 + seen.count(b"\n"))
                assert lo <= chunk.offset < hi or not chunk.data
                seen += chunk.data
        assert seen == data
    finally:
        os.unlink(handle.name)


@given(total=st.integers(0, 10**6), count=st.integers(1, 50), position=st.integers(0, 10**6))
def test_every_byte_has_one_owner(total: int, count: int, position: int) -> None:
    """owner() is the part whose range holds the byte (the last part for what lies past the end)."""
    starts = bounds(total, count)
    part = owner(starts, position)
    assert starts[part] <= position
    assert position < starts[part + 1] or part == count - 1


@given(rows=st.integers(0, 500), size=st.integers(1, 10**5), count=st.integers(1, 12))
def test_dataset_rows_split_once(rows: int, size: int, count: int) -> None:
    """Rows cut by their byte position: the parts' row ranges tile [0, rows)."""
    ranges = [rows_in((lo, hi), rows, size) for lo, hi in zip(bounds(size, count), bounds(size, count)[1:], strict=False)]
    assert ranges[0][0] == 0
    assert ranges[-1][1] == rows
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize("count", [1, 2, 3, 7, 40])
def test_parts_read_in_order_are_the_whole(tmp_path: Path, count: int) -> None:
    """--part i/n of every reader, read in order as a corpus: the documents, masks and epoch of one store."""
    inputs = [every_reader(tmp_path / "c")]
    options = {"eos_id": 0}
    whole = sb.prepare_store(inputs, tmp_path / "whole", quiet=True, **options)
    folder = part_stores(inputs, tmp_path / "parts", count, **options)
    corpus = sb.open_corpus(folder / "corpus.json")
    assert docs(corpus) == docs(whole)
    assert epoch_rows(corpus) == epoch_rows(whole)
    assert len(whole) > 350


def test_one_large_file_is_cut_at_lines_and_row_groups(tmp_path: Path) -> None:
    """A single JSONL file, a single Parquet file and a saved dataset each spread over the parts, never one part's alone."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    texts = [f"{CORPUS[i % len(CORPUS)]} {i}" for i in range(2000)]
    (tmp_path / "big.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "rows.parquet", row_group_size=100, compression="none")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    opts = read_options()
    for name in ("big.jsonl", "rows.parquet", "ds"):
        files = select_inputs([tmp_path / name])
        pieces = [part_pieces(files, (i, 4), opts) for i in range(4)]
        assert all(len(p) == 1 and p[0].span is not None for p in pieces), name
        stores = [
            sb.prepare_store([tmp_path / name], tmp_path / f"{name}-{i}", part=f"{i}/4", eos_id=0, quiet=True) for i in range(4)
        ]
        assert all(len(s) >= 200 for s in stores), (name, [len(s) for s in stores])
        whole = sb.prepare_store([tmp_path / name], tmp_path / f"{name}-whole", eos_id=0, quiet=True)
        assert [d for s in stores for d in docs(s)] == docs(whole)


def test_prompt_completion_parts_keep_masks(tmp_path: Path) -> None:
    """Prompt/completion rows cut into parts: the same ids, tokens and masks as one store."""
    path = prompt_rows(tmp_path / "pc.jsonl")
    options = {"prompt_field": "q", "completion_field": "a", "eos_id": 0}
    whole = sb.prepare_store([path], tmp_path / "whole", quiet=True, **options)
    corpus = sb.open_corpus(part_stores([path], tmp_path / "parts", 3, **options) / "corpus.json")
    assert whole.has_loss_mask
    assert docs(corpus) == docs(whole)
    assert len(whole) == len(PROMPTS)
    assert epoch_rows(corpus) == epoch_rows(whole)


def test_corpus_folder_is_the_parts_byte_for_byte(tmp_path: Path) -> None:
    """parts=n writes part-00000.. and corpus.json: the same bytes as --part i/n into those names, then sb.write_corpus."""
    inputs = [every_reader(tmp_path / "c")]
    corpus = sb.prepare_store(inputs, tmp_path / "out", parts=4, eos_id=0, quiet=True)
    reference = part_stores(inputs, tmp_path / "ref", 4, eos_id=0)
    assert folder_bytes(tmp_path / "out") == folder_bytes(reference)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        ["corpus.json"] + [f"part-{i:05d}{end}" for i in range(4) for end in ("", ".done.json")]
    )
    whole = sb.prepare_store(inputs, tmp_path / "whole", eos_id=0, quiet=True)
    assert docs(corpus) == docs(whole)
    marker = json.loads((tmp_path / "out" / "part-00002.done.json").read_text())
    assert marker["fingerprint"] == corpus.shards[2].fingerprint
    assert marker["part"] == [2, 4]


def test_a_rerun_skips_complete_parts_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A part whose marker matches its store is kept (same directory); a missing one is redone; a changed input redoes all."""
    inputs = [every_reader(tmp_path / "c")]
    out = tmp_path / "out"
    sb.prepare_store(inputs, out, parts=3, eos_id=0, quiet=True)
    stamp = {i: os.stat(out / f"part-{i:05d}.done.json").st_mtime_ns for i in range(3)}
    first = folder_bytes(out)
    import shutil

    shutil.rmtree(out / "part-00001")
    sb.prepare_store(inputs, out, parts=3, eos_id=0)
    assert "3 parts (2 already complete, 1 prepared by local)" in capsys.readouterr().err
    assert [os.stat(out / f"part-{i:05d}.done.json").st_mtime_ns == stamp[i] for i in range(3)] == [True, False, True]
    assert folder_bytes(out) == first
    with open(tmp_path / "c" / "big.jsonl", "a") as handle:
        handle.write('{"text": "one more"}\n')
    sb.prepare_store(inputs, out, parts=3, eos_id=0)
    assert "3 parts (0 already complete, 3 prepared by local)" in capsys.readouterr().err
    assert docs(sb.open_corpus(out)) == docs(sb.prepare_store(inputs, tmp_path / "whole", eos_id=0, quiet=True))


def test_a_corpus_folder_is_a_source_everywhere(tmp_path: Path) -> None:
    """prepare --executor local --parts 3 -o OUT: inspect and epoch take OUT and OUT/corpus.json; so does sb.open_source."""
    inputs = every_reader(tmp_path / "c")
    status, text = cli(
        "prepare", str(inputs), "-o", str(tmp_path / "out"), "--executor", "local", "--parts", "3", "--eos-id", "0"
    )
    assert status == 0
    assert text.startswith(f"wrote {tmp_path / 'out'}: ")
    whole = sb.prepare_store([inputs], tmp_path / "whole", eos_id=0, quiet=True)
    for source in (tmp_path / "out", tmp_path / "out" / "corpus.json"):
        opened = sb.open_source(source)
        assert opened.kind == "corpus"
        assert docs(opened.store) == docs(whole)
        for command in (
            ["inspect", str(source), "-T", "3", "-B", "4"],
            ["epoch", str(source), "-T", "3", "-B", "4", "--seed", "1"],
        ):
            assert cli(*command)[0] == 0


def test_skip_bad_names_the_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad line inside a cut file: --skip-bad leaves out that part's piece, named with its part and bytes; the rest stays."""
    rows = [json.dumps({"id": f"r{i:02d}", "text": f"row {i}"}) for i in range(90)]
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "a.jsonl").write_text("\n".join(rows) + "\n")
    clean = sb.prepare_store([tmp_path / "good" / "a.jsonl"], tmp_path / "clean", parts=3, eos_id=0, quiet=True)
    rows[45] = '{"id": "r45", not json'
    (tmp_path / "a.jsonl").write_text("\n".join(rows) + "\n")
    corpus = sb.prepare_store([tmp_path / "a.jsonl"], tmp_path / "out", parts=3, skip_bad=True, eos_id=0, quiet=True)
    err = capsys.readouterr().err
    assert "prepare: skipped " in err
    assert "a.jsonl" in err
    assert "(part 1/3, bytes " in err
    assert err.count("skipped") == 1
    assert "r45" in clean.shards[1].ids
    assert len(corpus.shards[1]) == 0
    assert [docs(s) for s in corpus.shards[::2]] == [docs(s) for s in clean.shards[::2]]
    with pytest.raises(sb.DataError, match=r"^part 1/3: .*a.jsonl"):
        sb.prepare_store([tmp_path / "a.jsonl"], tmp_path / "bad", parts=3, eos_id=0, quiet=True)
    assert not (tmp_path / "bad" / "corpus.json").exists()


@pytest.mark.parametrize(("kind", "suffixes"), [("megatron", ("bin", "idx")), ("datatrove", ("ds", "ds.index"))])
def test_format_parts_are_a_folder_the_readers_take(tmp_path: Path, kind: str, suffixes: tuple[str, ...]) -> None:
    """--format megatron/datatrove: one file set per part; the folder reads as one corpus with the tokens of one store."""
    inputs = [every_reader(tmp_path / "c")]
    corpus = sb.prepare_store(inputs, tmp_path / "out", parts=3, format=kind, eos_id=0, quiet=True)
    whole = sb.prepare_store(inputs, tmp_path / "whole", eos_id=0, quiet=True)
    names = sorted(p for p in os.listdir(tmp_path / "out") if not p.endswith(".done.json"))
    assert names == sorted(f"part-{i:05d}.{e}" for i in range(3) for e in suffixes)
    opened = sb.open_source(tmp_path / "out").store
    assert [t for _, _, t, _ in docs(opened)] == [t for _, _, t, _ in docs(whole)] == [t for _, _, t, _ in docs(corpus)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"executor": "spark"}, r"executor='spark' is not one of local, ray"),
        ({"parts": 0}, r"parts=0 must be a positive int"),
        ({"parts": 2, "part": "0/2"}, r"part='0/2' with executor=None: a corpus run prepares every part"),
        ({"executor": "local", "workers": 2}, r"workers=2 with executor='local': each part runs on one CPU"),
    ],
)
def test_bad_corpus_options(tmp_path: Path, options: dict[str, object], message: str) -> None:
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(sb.ConfigError, match=message):
        sb.prepare_store([tmp_path / "a.txt"], tmp_path / "out", quiet=True, **options)  # type: ignore[call-overload]
    assert not (tmp_path / "out").exists()


def test_an_existing_store_is_not_made_a_corpus_folder(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    sb.prepare_store([tmp_path / "a.txt"], tmp_path / "store", quiet=True)
    with pytest.raises(StoreError, match=r"is a store; a corpus run writes a folder of parts"):
        sb.prepare_store([tmp_path / "a.txt"], tmp_path / "store", parts=2, quiet=True)


def test_the_core_never_imports_ray_and_names_the_extra(tmp_path: Path) -> None:
    """Without ray installed, executor='ray' is a MissingDependencyError naming the ray extra; streambatch imports without it."""
    (tmp_path / "a.txt").write_text("hello")
    script = (
        "import sys; sys.modules['ray'] = None\n"
        "import streambatch as sb, streambatch.parts.corpus\nfrom streambatch.errors import MissingDependencyError\n"
        "try:\n"
        f"    sb.prepare_store([{str(tmp_path / 'a.txt')!r}], {str(tmp_path / 'out')!r}, executor='ray', quiet=True)\n"
        "except MissingDependencyError as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("MissingDependencyError ")
    assert "ray" in done.stdout
    assert "[ray]" in done.stdout


def test_a_corpus_run_writes_to_object_storage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """parts=3 to s3:// (moto on loopback): each part uploaded header last, its marker and corpus.json beside them; the
    address (or its corpus.json) opens as the corpus of one local store; a re-run keeps every part."""
    from tests.remote_server import BUCKET, moto_server

    inputs = [prompt_rows(tmp_path / "pc.jsonl")]
    options = {"prompt_field": "q", "completion_field": "a", "eos_id": 0}
    with moto_server():
        url = f"s3://{BUCKET}/runs/corpus"
        sb.prepare_store(inputs, url, parts=3, **options)
        assert "3 parts (0 already complete, 3 prepared by local)" in capsys.readouterr().err
        local = sb.prepare_store(inputs, tmp_path / "out", parts=3, quiet=True, **options)
        for source in (url, f"{url}/corpus.json"):
            remote = sb.open_source(source).store
            assert [s.fingerprint for s in remote.shards] == [s.fingerprint for s in local.shards]
            assert docs(remote) == docs(local)
        sb.prepare_store(inputs, url, parts=3, **options)
        assert "3 parts (3 already complete, 0 prepared by local)" in capsys.readouterr().err


def test_the_bar_counts_parts_documents_and_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the corpus run draws a bar of parts with the documents and tokens written so far."""
    pytest.importorskip("tqdm")
    import io

    path = prompt_rows(tmp_path / "pc.jsonl")
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stderr", shown)
    monkeypatch.setattr(shown, "isatty", lambda: True, raising=False)
    corpus = sb.prepare_store([path], tmp_path / "out", parts=3, prompt_field="q", completion_field="a", eos_id=0)
    text = shown.getvalue()
    assert "3/3" in text
    assert f"{len(corpus):,} docs, {corpus.token_count:,} tokens" in text
