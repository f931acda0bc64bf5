"""Tests for `streambatch.io.store` and `streambatch.prepare`: round trips, atomicity, corruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import streambatch as sb
from streambatch import DataError
from streambatch.errors import DuplicateIdError, StoreError
from streambatch.io.store import INLINE_DOCUMENTS, StoreWriter, open_store, write_store
from streambatch.prepare import prepare_store
from streambatch.read.text.byte_tokens import byte_detokenize
from tests.strategies import configs, documents, seeds


def _docs(rng: np.random.Generator, count: int, high: int = 1000) -> list[sb.Document]:
    parts = ["train", "validation", "test"]
    return [sb.Document(f"doc-{i}", parts[i % 3], rng.integers(0, high, rng.integers(0, 40))) for i in range(count)]


@pytest.mark.parametrize(("high", "dtype"), [(2**16, "uint16"), (2**16 + 1, "uint32"), (2**32, "uint32")])
def test_round_trip_and_dtype_choice(tmp_path: Path, high: int, dtype: str) -> None:
    """Documents in equal documents out; uint16 exactly when every id fits."""
    docs = _docs(np.random.default_rng(1), 50, high)
    docs.append(sb.Document("max", "train", [high - 1]))
    store = write_store(tmp_path / "s", docs)
    assert dtype == store.tokens.dtype.name
    assert isinstance(store.tokens, np.memmap)
    assert not store.tokens.flags.writeable
    assert docs == list(open_store(tmp_path / "s"))


def test_many_documents_keep_ids_in_files(tmp_path: Path) -> None:
    """Beyond the inline limit ids and partitions live in their own files, and still round-trip."""
    docs = _docs(np.random.default_rng(2), INLINE_DOCUMENTS + 5)
    write_store(tmp_path / "s", docs)
    header = json.loads((tmp_path / "s" / "header.json").read_text())
    assert "ids" not in header
    assert {"ids.jsonl", "partitions.bin"} <= {p.name for p in (tmp_path / "s").iterdir()}
    assert docs == list(open_store(tmp_path / "s"))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=25)
@given(documents(), configs, seeds)
def test_store_epoch_equals_memory_epoch(
    tmp_path: Path, docs: list[sb.Document], config: dict[str, int], seed: int | None
) -> None:
    """An epoch over an opened store equals the same epoch over in-memory documents, batch for batch."""
    store = write_store(tmp_path / "s", docs)
    assert list(sb.Epoch(docs, seed=seed, **config)) == list(sb.Epoch(store, seed=seed, **config))


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    """A duplicate id midway: no store, no temporary directory."""

    def write() -> None:
        with StoreWriter(tmp_path / "s") as writer:
            writer.add("a", "train", [1, 2])
            writer.add("a", "train", [3])
            writer.commit()

    with pytest.raises(DuplicateIdError, match="id='a'"):
        write()
    assert [] == list(tmp_path.iterdir())


def test_refuses_to_replace_a_non_store(tmp_path: Path) -> None:
    """An existing file or foreign folder at the output is never overwritten."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="exists and is not a streambatch store"):
        write_store(tmp_path / "notes", [sb.Document("a", "train", [1])])
    assert "mine" == (tmp_path / "notes" / "keep.txt").read_text()


def test_prepare_text_folder_per_file_and_per_line(tmp_path: Path) -> None:
    """Text folders become one document per file (id = relative path) or per line; bytes round-trip."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("héllo\nworld\n")
    (folder / "sub" / "b.txt").write_text("\nsecond file\n")
    (folder / ".hidden").write_text("skipped")
    store = prepare_store([folder], tmp_path / "s", quiet=True)
    assert ("a.txt", "sub/b.txt") == store.ids
    assert "héllo\nworld\n" == byte_detokenize(store.document(0).tokens)
    assert "uint16" == store.tokens.dtype.name
    lines = prepare_store([folder], tmp_path / "l", per_line=True, partition="validation", quiet=True)
    assert ("a.txt:1", "a.txt:2", "sub/b.txt:2") == lines.ids
    assert {sb.Partition.VALIDATION} == {lines.partition(i) for i in range(len(lines))}


def test_prepare_jsonl_and_custom_tokenizer(tmp_path: Path) -> None:
    """JSONL token files keep their ids/partitions; any str -> ids callable tokenizes text."""
    (tmp_path / "t.jsonl").write_text('{"id": "x", "partition": "test", "tokens": [70000, 1]}\n')
    (tmp_path / "w.txt").write_text("a bb ccc")
    store = prepare_store(
        [tmp_path / "t.jsonl", tmp_path / "w.txt"], tmp_path / "s", tokenizer=lambda s: [len(w) for w in s.split()], quiet=True
    )
    assert "uint32" == store.tokens.dtype.name
    assert [70000, 1] == store.document(0).tokens.tolist()
    assert [1, 2, 3] == store.document(1).tokens.tolist()


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [(lambda s: [1.5], r"tokenizer output: token\[0\]=1.5"), (lambda s: 1 / 0, "the tokenizer raised ZeroDivisionError")],
    ids=["float-ids", "raises"],
)
def test_prepare_bad_tokenizer(tmp_path: Path, tokenizer: Any, message: str) -> None:
    """A tokenizer's bad output or exception names the file; nothing is left behind."""
    (tmp_path / "w.txt").write_text("text")
    with pytest.raises(DataError, match=message):
        prepare_store([tmp_path / "w.txt"], tmp_path / "s", tokenizer=tokenizer, quiet=True)
    assert ["w.txt"] == [p.name for p in tmp_path.iterdir()]


def test_prepare_rejects_non_utf8_and_missing(tmp_path: Path) -> None:
    """Undecodable text and missing inputs are DataErrors naming the file."""
    (tmp_path / "bad.txt").write_bytes(b"ok\xff")
    with pytest.raises(DataError, match=r"bad.txt: not UTF-8 text .* at byte 2"):
        prepare_store([tmp_path / "bad.txt"], tmp_path / "s", quiet=True)
    with pytest.raises(DataError, match="does not exist"):
        prepare_store([tmp_path / "nope"], tmp_path / "s", quiet=True)


def _corrupt(path: Path, kind: str) -> None:
    s = path / "s"
    if kind == "truncated-tokens":
        data = (s / "tokens.bin").read_bytes()
        (s / "tokens.bin").write_bytes(data[:-2])
    elif kind == "longer-tokens":
        with open(s / "tokens.bin", "ab") as handle:
            handle.write(b"\0\0")
    elif kind == "missing-tokens":
        (s / "tokens.bin").unlink()
    elif kind == "truncated-offsets":
        (s / "offsets.bin").write_bytes((s / "offsets.bin").read_bytes()[:-8])
    elif kind == "non-monotonic":
        offsets = np.fromfile(s / "offsets.bin", dtype="<i8")
        offsets[1], offsets[2] = offsets[2], offsets[1]
        offsets.tofile(s / "offsets.bin")
    elif kind == "fingerprint":
        data = bytearray((s / "tokens.bin").read_bytes())
        data[0] ^= 1
        (s / "tokens.bin").write_bytes(bytes(data))
    else:
        header = json.loads((s / "header.json").read_text())
        if kind == "version":
            header["version"] = 99
        elif kind == "dtype":
            header["dtype"] = "float32"
        elif kind == "ids":
            header["ids"] = header["ids"][:-1]
            header["partitions"] = header["partitions"][:-1]
        elif kind == "duplicate-ids":
            header["ids"][1] = header["ids"][0]
        elif kind == "count":
            header["document_count"] = -1
        (s / "header.json").write_text(json.dumps(header) if kind != "json" else "{broken")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated-tokens", r"tokens.bin: size 40 bytes but the header describes 21 tokens of uint16 \(42 bytes\): truncated"),
        ("longer-tokens", r"tokens.bin: size 44 bytes .* longer than the header says"),
        ("missing-tokens", r"tokens.bin: missing"),
        ("truncated-offsets", r"offsets.bin: size 24 bytes but the header describes 4 int64 offsets"),
        ("non-monotonic", r"offsets.bin: offsets\[2\]=.* is less than offsets\[1\]=.*non-decreasing"),
        ("fingerprint", r"fingerprint mismatch"),
        ("version", r"header.json: version=99 is not supported"),
        ("dtype", r"header.json: dtype='float32' must be"),
        ("ids", r"header.json: 2 ids but document_count=3"),
        ("duplicate-ids", r"header.json: duplicate document id='a': first at document index 0, repeated at document index 1"),
        ("count", r"header.json: document_count=-1 must be a non-negative int"),
        ("json", r"header.json: unreadable header"),
    ],
)
def test_every_corruption_is_rejected(tmp_path: Path, kind: str, message: str) -> None:
    """Each corruption class raises StoreError naming the file and the check."""
    write_store(
        tmp_path / "s",
        [sb.Document("a", "train", range(10)), sb.Document("b", "train", range(5)), sb.Document("c", "train", range(6))],
    )
    _corrupt(tmp_path, kind)
    with pytest.raises(StoreError, match=message):
        open_store(tmp_path / "s")


def test_not_a_store(tmp_path: Path) -> None:
    """A folder without a header is not a store."""
    with pytest.raises(StoreError, match=r"not a streambatch store \(header.json is missing\)"):
        open_store(tmp_path)


_KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from streambatch.prepare import prepare_store
    prepare_store([sys.argv[1]], sys.argv[2], per_line=True, quiet=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("previous", [False, True], ids=["new", "replacing"])
def test_prepare_killed_mid_write_leaves_nothing_that_opens(tmp_path: Path, previous: bool) -> None:
    """SIGKILL during prepare: no store (or the complete previous one), never a partial one that opens."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of the corpus\n" for i in range(400_000)))
    target = tmp_path / "store"
    old = write_store(target, [sb.Document("old", "train", [1, 2, 3])]).fingerprint if previous else None
    process = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(corpus), str(target)])
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".store.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert process.poll() is None, "prepare finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    if previous:
        assert old == open_store(target).fingerprint
    else:
        with pytest.raises(StoreError, match="not a streambatch store"):
            open_store(target)
    for partial in tmp_path.glob(".store.partial-*"):
        with pytest.raises(StoreError):
            open_store(partial)
    write_store(target, [sb.Document("new", "train", [4])])  # the next writer cleans up after the dead one
    assert [] == list(tmp_path.glob(".store.partial-*"))


def test_sequential_epoch_allocates_no_per_window_array() -> None:
    """A sequential epoch over 2 million windows allocates only per-document and per-batch memory."""
    tokens = np.zeros(2_000_000 + 2, dtype=np.uint16)
    store = sb.DocumentStore.from_arrays(tokens, [0, tokens.size])
    tracemalloc.start()
    try:
        epoch = sb.Epoch(store, context_length=1, batch_size=64, seed=None)
        batches = iter(epoch)
        for _ in range(100):
            next(batches)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 2_000_001 == epoch.window_count
    assert peak < 200_000  # a per-window array would be >= 2 MB (1 byte per window)
    assert 0 == epoch.plan_nbytes


def test_shuffled_plan_is_four_bytes_per_window() -> None:
    """A shuffled epoch keeps one uint32 per window."""
    store = sb.DocumentStore.from_arrays(np.zeros(100_001, dtype=np.uint16), [0, 100_001])
    epoch = sb.Epoch(store, context_length=1, batch_size=64, seed=3)
    assert 4 * 100_000 == epoch.plan_nbytes


@pytest.mark.slow
def test_cli_prepare_inspect_epoch(tmp_path: Path) -> None:
    """prepare -> inspect -> epoch over the store directory, all through the CLI."""
    (tmp_path / "a.txt").write_text("hello world")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    run = lambda *a: subprocess.run([sys.executable, "-m", "streambatch", *a], capture_output=True, text=True, env=env)  # noqa: E731
    assert 0 == run("prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "s"), "--quiet").returncode
    summary = json.loads(run("inspect", str(tmp_path / "s"), "-T", "4", "--json").stdout)
    assert {"documents": 1, "tokens": 11, "dtype": "uint16"} == {k: summary[k] for k in ("documents", "tokens", "dtype")}
    assert 7 == summary["partitions"]["train"]["windows"]
    batches = [json.loads(x) for x in run("epoch", str(tmp_path / "s"), "-T", "4", "-B", "4", "--seed", "1").stdout.splitlines()]
    assert [4, 3] == [b["shape"][0] for b in batches]
    broken = run("inspect", str(tmp_path / "nothing"))
    assert 2 == broken.returncode
    assert 1 == len(broken.stderr.splitlines())


def test_pickled_store_epoch_reopens_the_file(tmp_path: Path) -> None:
    """A store-backed epoch pickles as file names plus the plan, not a copy of the tokens."""
    import pickle

    docs = [sb.Document(f"d{i}", "train", np.arange(5000, dtype=np.uint32) % 300) for i in range(40)]
    store = write_store(tmp_path / "s", docs)
    epoch = sb.Epoch(store, context_length=8, stride=8, batch_size=16, seed=3)
    payload = pickle.dumps(epoch)
    assert len(payload) < store.tokens.nbytes / 4
    assert list(epoch) == list(pickle.loads(payload))


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm runs when stderr is a terminal and --quiet is off; otherwise nothing is drawn."""
    from streambatch._progress import FileProgress, NoBar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    bar = FileProgress(100, progress=None).bar
    assert "tqdm" == type(bar).__name__
    bar.close()
    assert isinstance(FileProgress(100, progress=False).bar, NoBar)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert isinstance(FileProgress(100, progress=None).bar, NoBar)


def test_writer_rejects_uint64_ids_beyond_uint32(tmp_path: Path) -> None:
    """A uint64 array is checked like any other input: ids >= 2**32 never wrap silently."""
    with StoreWriter(tmp_path / "t") as writer:
        with pytest.raises(DataError, match=r"token\[1\]=4294967296 is outside"):
            writer.add("a", "train", np.array([1, 2**32], dtype=np.uint64))
        writer.abort()
    assert [] == list(tmp_path.iterdir())


def test_pickled_store_refuses_a_replaced_store(tmp_path: Path) -> None:
    """A pickled memory-mapped store reopens its file by name only if it is still the same file."""
    import pickle

    path = tmp_path / "s"
    store = write_store(path, [sb.Document("a", "train", [1, 2, 3])])
    again = pickle.loads(pickle.dumps(store))
    assert again.tokens.tolist() == [1, 2, 3]
    assert isinstance(again.tokens, np.memmap)
    blob = pickle.dumps(store)
    write_store(path, [sb.Document("b", "train", [4, 5, 6, 7])])
    with pytest.raises(StoreError, match="the store was replaced after this process opened it"):
        pickle.loads(blob)


def test_rollback_forgets_documents_ids_and_width(tmp_path: Path) -> None:
    """rollback(mark) discards what was added after the mark: documents, their ids, and a wide id's uint32 width."""
    with StoreWriter(tmp_path / "s") as writer:
        writer.add("a", "train", [1, 2])
        mark = writer.mark()
        writer.add_block(np.array([70000, 3, 4], dtype=np.uint32), [1, 2], ["b", "c"], "test", wheres=["f:1", "f:2"])
        with pytest.raises(
            DuplicateIdError, match=r"duplicate document id='b': first at f:1 \(document id='b'\), repeated at g:1"
        ):
            writer.add_block(np.array([5], dtype=np.uint16), [1], ["b"], "train", wheres=["g:1"])
        writer.rollback(mark)
        writer.add("b", "validation", [5])
        store = writer.commit()
    assert [("a", [1, 2]), ("b", [5])] == [(d.id, d.tokens.tolist()) for d in store]
    assert "uint16" == store.tokens.dtype.name
    assert [sb.Partition.TRAIN, sb.Partition.VALIDATION] == [store.partition(i) for i in range(2)]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents(partition="validation", max_docs=6))
def test_content_fingerprint_is_the_store_fingerprint(tmp_path: Path, docs: list[sb.Document]) -> None:
    """An in-memory store's content fingerprint is the one write_store records for the same documents (any view)."""
    memory = sb.DocumentStore.from_documents(docs)
    target = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    assert write_store(target, docs).fingerprint == memory.content_fingerprint()
    lengths = [len(d) for d in docs]
    tokens = np.concatenate([[7, 7], *[d.tokens for d in docs]]).astype(np.uint32)
    offsets = np.concatenate([[0, 2], 2 + np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    ids = ["gap", *[d.id for d in docs]]
    gapped = sb.DocumentStore.from_arrays(tokens, offsets, ids, partition=["test"] + ["validation"] * len(docs))
    view = gapped.select("validation")  # the first document is left out: a gap before the view's tokens
    assert memory.content_fingerprint() == view.content_fingerprint()
