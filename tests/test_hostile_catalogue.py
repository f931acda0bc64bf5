"""Every promise holds under hostile input, crashes and concurrency.

One catalogue per class of failure (bounded JSON, offsets that cannot wrap,
atomic store replacement, outputs, size arguments, exception types), through the
API and through the CLI; hypothesis fuzzing of store headers, ids files and
JSONL input; a write killed at every step; readers and writers racing.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
import streambatch.io.store as store_module
from streambatch.cli import main
from streambatch.io.atomic import atomic_text
from streambatch.io.bounded_json import decode_json, decode_record, decode_string
from streambatch.io.store import INLINE_DOCUMENTS, StoreWriter, open_store, write_store
from streambatch.stages.read.jsonl import iter_jsonl

REPO = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b"9" * 5_000


def _docs(count: int, length: int, prefix: str, high: int = 1000) -> list[sb.Document]:
    rng = np.random.default_rng(length)
    return [sb.Document(f"{prefix}-{i}", "train", rng.integers(0, high, length)) for i in range(count)]


def _small_store(path: Path) -> sb.DocumentStore:
    return write_store(path, [sb.Document("a", "train", range(10)), sb.Document("b", "test", range(5))])


def _header(path: Path) -> dict[str, Any]:
    header: dict[str, Any] = json.loads((path / "header.json").read_text())
    return header


def _temporaries(parent: Path, name: str) -> list[Path]:
    return sorted(parent.glob(f".{name}.partial-*")) + sorted(parent.glob(f".{name}.old-*"))


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


# --- 1. bounded, checked JSON -------------------------------------------------------------------------


def test_msgspec_bounds_huge_integers_and_deep_nesting() -> None:
    """The two inputs that crash the stdlib decoder come back from _json as DataError with where and path."""
    with pytest.raises(sb.DataError, match=r"f:1: invalid JSON value at \$\.tokens\[0\] \(Integer value out of range\)"):
        decode_record(b'{"id": "a", "partition": "train", "tokens": [' + HUGE_INT + b"]}", "f:1")
    with pytest.raises(sb.DataError, match=r"f:2: invalid JSON \(nested too deeply\)"):
        decode_record(b'{"id": "a", "tokens": ' + DEEP + b"}", "f:2")
    with pytest.raises(sb.StoreError, match=r"h: invalid JSON \(nested too deeply\); the header must be valid JSON"):
        decode_json(DEEP, "h", "the header", error=sb.StoreError)
    with pytest.raises(sb.DataError, match=r"invalid JSON value at \$ \(Integer value out of range\)"):
        decode_json(b"-" + HUGE_INT, "h", "the header")
    with pytest.raises(sb.DataError, match=r"ids:3: invalid JSON value at \$ \(Expected `str`, got `int`\)"):
        decode_string(b"3", "ids:3", "a document id")


def test_jsonl_byte_order_mark_and_input_ids(tmp_path: Path) -> None:
    """A UTF-8 BOM at the start of a JSONL file is accepted; Hugging Face rows' input_ids stand in for tokens."""
    path = tmp_path / "docs.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"id": "a", "partition": "train", "tokens": [1, 2]}\n'
        b'{"id": "b", "partition": "train", "input_ids": [3], "attention_mask": [1], "text": "x"}\n'
    )
    store = sb.read_jsonl(path)
    assert ("a", "b") == store.ids
    assert [3] == store.document(1).tokens.tolist()


def _jsonl(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    return path


def _store_with(tmp_path: Path, change: Callable[[Path], None]) -> Path:
    path = tmp_path / "s"
    write_store(path, [sb.Document("a", "train", range(10)), sb.Document("b", "train", range(5))])
    change(path)
    return path


def _many_ids_store(tmp_path: Path, line: bytes) -> Path:
    path = tmp_path / "m"
    write_store(path, [sb.Document(f"d{i}", "train", [i % 7]) for i in range(INLINE_DOCUMENTS + 1)])
    lines = (path / "ids.jsonl").read_bytes().split(b"\n")
    lines[4] = line
    (path / "ids.jsonl").write_bytes(b"\n".join(lines))
    return path


def _write_offsets(path: Path, offsets: list[int], tokens: int) -> None:
    np.asarray(offsets, dtype="<i8").tofile(path / "offsets.bin")
    header = _header(path)
    header.update(token_count=tokens, document_count=len(offsets) - 1, ids=[f"x{i}" for i in range(len(offsets) - 1)])
    header["partitions"] = ["train"] * (len(offsets) - 1)
    (path / "header.json").write_text(json.dumps(header))
    np.zeros(tokens, dtype="<u2").tofile(path / "tokens.bin")


def _set_header(**values: Any) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        header = _header(path)
        header.update(values)
        (path / "header.json").write_text(json.dumps(header))

    return change


def _raw_header(data: bytes) -> Callable[[Path], None]:
    return lambda path: (path / "header.json").write_bytes(data)


def _huge_header(path: Path) -> None:
    with open(path / "header.json", "r+b") as handle:
        handle.truncate(65 << 20)  # sparse: nothing is written, and nothing may be read


def _fifo_header(path: Path) -> None:
    (path / "header.json").unlink()
    os.mkfifo(path / "header.json")


# (name, call(tmp_path), error, message)
API_CASES: list[tuple[str, Callable[[Path], Any], type[Exception], str]] = [
    # 1. JSON
    (
        "jsonl-huge-int",
        lambda t: sb.read_jsonl(_jsonl(t, b'{"id": "a", "partition": "train", "tokens": [1, ' + HUGE_INT + b"]}\n")),
        sb.DataError,
        r"bad.jsonl:1: invalid JSON value at \$\.tokens\[1\] \(Integer value out of range\)",
    ),
    (
        "jsonl-deep",
        lambda t: sb.read_jsonl(_jsonl(t, b'\n{"id": "a", "partition": "train", "tokens": ' + DEEP + b"}\n")),
        sb.DataError,
        r"bad.jsonl:2: invalid JSON \(nested too deeply\)",
    ),
    ("jsonl-array", lambda t: sb.read_jsonl(_jsonl(t, DEEP + b"\n")), sb.DataError, r"bad.jsonl:1: .*got `array`"),
    (
        "jsonl-not-utf8",
        lambda t: list(iter_jsonl(_jsonl(t, b'{"id": "\xff"}\n'))),
        sb.DataError,
        r"bad.jsonl: not UTF-8",
    ),
    (
        "header-huge-int",
        lambda t: open_store(_store_with(t, _raw_header(b'{"format": "streambatch.store", "version": ' + HUGE_INT + b"}"))),
        sb.StoreError,
        r"header.json: unreadable header: invalid JSON value at \$\[\.\.\.\] \(Integer value out of range\)",
    ),
    (
        "header-deep",
        lambda t: open_store(_store_with(t, _raw_header(DEEP))),
        sb.StoreError,
        r"header.json: unreadable header: invalid JSON \(nested too deeply\)",
    ),
    (
        "header-over-64MiB",
        lambda t: open_store(_store_with(t, _huge_header)),
        sb.StoreError,
        r"header.json: 68157440 bytes, more than a header may have \(64 MiB\)",
    ),
    ("header-fifo", lambda t: open_store(_store_with(t, _fifo_header)), sb.StoreError, r"header.json: not a regular file"),
    (
        "header-version-true",
        lambda t: open_store(_store_with(t, _set_header(version=True))),
        sb.StoreError,
        r"version=True is not supported",
    ),
    (
        "header-ids-file-escapes",
        lambda t: open_store(_store_with(t, _set_header(ids_file="../../etc/passwd", partitions_file="partitions.bin"))),
        sb.StoreError,
        r"ids_file='../../etc/passwd' and partitions_file='partitions.bin' must be 'ids.jsonl' and 'partitions.bin'",
    ),
    (
        "header-fingerprint-type",
        lambda t: open_store(_store_with(t, _set_header(fingerprint=[1])), verify=False),
        sb.StoreError,
        r"fingerprint=\[1\] must be a string",
    ),
    (
        "ids-huge-int",
        lambda t: open_store(_many_ids_store(t, HUGE_INT)),
        sb.StoreError,
        r"ids.jsonl:5: invalid JSON value at \$ \(Number out of range\); a document id must be one JSON string",
    ),
    (
        "ids-deep",
        lambda t: open_store(_many_ids_store(t, DEEP)),
        sb.StoreError,
        r"ids.jsonl:5: invalid JSON value at \$ \(Expected `str`, got `array`\)",
    ),
    (
        "writer-lone-surrogate-id",
        lambda t: write_store(t / "s", [sb.Document("\ud800", "train", [1])]),
        sb.DataError,
        r"holds a lone surrogate at position 0",
    ),
    # 2. offsets
    (
        "offsets-wrap",
        lambda t: sb.DocumentStore.from_arrays(np.zeros(30, np.uint16), [0, 2**63 - 1, -2, 30]),
        sb.DataError,
        r"offsets\[1\]=9223372036854775807 is outside \[0, 30\]",
    ),
    (
        "offsets-uint64",
        lambda t: sb.DocumentStore.from_arrays(np.zeros(30, np.uint16), np.array([0, 2**64 - 2, 30], dtype=np.uint64)),
        sb.DataError,
        r"offsets\[1\]=18446744073709551614 is outside \[0, 30\]",
    ),
    (
        "offsets-negative",
        lambda t: sb.DocumentStore.from_arrays(np.zeros(30, np.uint16), [0, -1, 30]),
        sb.DataError,
        r"offsets\[1\]=-1 is outside \[0, 30\]",
    ),
    (
        "store-offsets-wrap",
        lambda t: open_store(_store_with(t, lambda p: _write_offsets(p, [0, 2**63 - 1, -2, 30], 30)), verify=False),
        sb.StoreError,
        r"offsets.bin: offsets\[1\]=9223372036854775807 is outside \[0, 30\]",
    ),
    # 3. stores
    (
        "store-under-a-file",
        lambda t: (t / "file").write_text("x") and write_store(t / "file" / "s", []),
        sb.StoreError,
        r"file/s: cannot create the store \(.*/file is not a directory\); choose a writable output path",
    ),
    (
        "writer-block-negative-length",
        lambda t: StoreWriter(t / "s").add_block(np.zeros(2, np.uint16), [3, -1], ["a", "b"], "train"),
        sb.DataError,
        r"one length >= 0",
    ),
    (
        "writer-block-negative-token",
        lambda t: StoreWriter(t / "s").add_block(np.array([-1, 2]), [2], ["a"], "train"),
        sb.DataError,
        r"add_block: token\[0\]=-1 is outside",
    ),
    # 4. outputs
    ("output-directory", lambda t: atomic_text(t).__enter__(), sb.ConfigError, r"output '.*' is a directory; pass a file path"),
    (
        "output-missing-folder",
        lambda t: atomic_text(t / "no" / "out.jsonl").__enter__(),
        sb.ConfigError,
        r"output '.*/no/out.jsonl': cannot create a file in '.*/no' \(No such file or directory\)",
    ),
    # 5. sizes
    (
        "window-counts-2**64",
        lambda t: sb.window_counts([5], 2**64),
        sb.ConfigError,
        r"context_length=18446744073709551616 must be",
    ),
    ("stride-2**62", lambda t: sb.window_counts([5], 2, stride=2**62), sb.ConfigError, r"stride=4611686018427387904 must be"),
    (
        "epoch-T-2**62",
        lambda t: sb.Epoch([sb.Document("a", "train", [1, 2])], context_length=2**62, batch_size=1),
        sb.ConfigError,
        r"context_length=4611686018427387904 must be a positive int below 2\*\*48 \(larger sizes overflow int64 arithmetic\)",
    ),
    (
        "epoch-B-2**63",
        lambda t: sb.Epoch([sb.Document("a", "train", [1, 2])], context_length=1, batch_size=2**63),
        sb.ConfigError,
        r"batch_size=9223372036854775808 must be a positive int below 2\*\*48",
    ),
    ("widths-count-2**62", lambda t: sb.batch_widths(2**62, 3), sb.ConfigError, r"window_count=4611686018427387904 must be"),
    ("chunked-B-2**64", lambda t: sb.chunked(np.arange(3), 2**64), sb.ConfigError, r"batch_size=18446744073709551616 must be"),
    ("shuffle-count-2**62", lambda t: sb.shuffled_order(2**62, 7), sb.ConfigError, r"count=4611686018427387904 must be"),
    (
        "size-huge-digits",
        lambda t: sb.window_counts([5], 10**5000),
        sb.ConfigError,
        r"context_length=an int of 16610 bits must be a positive int below 2\*\*48",
    ),
    # 6. exception types
    ("contribution-10**400", lambda t: sb.TokenContribution(10**400, [1.0]), sb.AccumulationError, r"loss=1000.* is too large"),
    (
        "add-sums-10**400",
        lambda t: sb.TokenMeanAccumulator(1).add_sums(10**400, [1.0], 1),
        sb.AccumulationError,
        r"loss_sum=1000.* is too large for a float",
    ),
    (
        "add-tokens-ragged",
        lambda t: sb.TokenMeanAccumulator(2).add_tokens([1.0, 2.0], [[1.0, 2.0], [1.0]]),
        sb.AccumulationError,
        r"gradients cannot be read as a numeric array .*every row the same width",
    ),
    (
        "contribution-ragged",
        lambda t: sb.TokenContribution(1.0, [[1.0], [1.0, 2.0]]),
        sb.AccumulationError,
        r"gradient cannot be read as a numeric array",
    ),
    (
        "accumulator-width-2**64",
        lambda t: sb.TokenMeanAccumulator(2**64),
        sb.AccumulationError,
        r"gradient_width=18446744073709551616 must be a positive int below 2\*\*48",
    ),
    ("records-int", lambda t: sb.read_records(5), sb.ConfigError, r"records=5 is not an iterable of rows"),
    ("records-huge-int", lambda t: sb.read_records(10**5000), sb.ConfigError, r"records=an int of 16610 bits is not an iterable"),
    (
        "record-huge-token",
        lambda t: sb.read_records([{"id": "a", "partition": "train", "tokens": [10**5000]}]),
        sb.DataError,
        r"record 0 \(document id='a'\): token\[0\]=an int of 16610 bits is outside \[0, 2\*\*32\)",
    ),
    (
        "record-huge-partition",
        lambda t: sb.read_records([{"id": "a", "partition": 10**5000, "tokens": []}]),
        sb.DataError,
        r"partition=an int of 16610 bits is not one of",
    ),
    (
        "record-huge-id",
        lambda t: sb.read_records([{"id": 10**5000, "partition": "train", "tokens": []}]),
        sb.DataError,
        r"id=an int",
    ),
    ("document-huge-tokens", lambda t: sb.Document("a", "train", 10**5000), sb.DataError, r"tokens=an int of 16610 bits is not"),
    (
        "records-one-dict",
        lambda t: sb.read_records({"id": "a", "partition": "train", "tokens": []}),
        sb.ConfigError,
        r"records=\{'id': 'a'.* is not an iterable of rows",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_hostile_api_catalogue(tmp_path: Path, call: Callable[[Path], Any], error: type[Exception], message: str) -> None:
    """Each hostile input is a StreamBatchError of its class, naming what, where and what to do."""
    with pytest.raises(error, match=message) as caught:
        call(tmp_path)
    assert isinstance(caught.value, sb.StreamBatchError)


def _cli_jsonl(t: Path, data: bytes) -> str:
    return str(_jsonl(t, data))


GOOD = b'{"id": "a", "partition": "train", "tokens": [1, 2, 3, 4, 5]}\n'
EPOCH = ["-T", "2", "-B", "2", "--seed", "1"]

# (name, argv(tmp_path), message)
CLI_CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    (
        "jsonl-huge-int",
        lambda t: ["epoch", _cli_jsonl(t, b'{"id": "a", "partition": "train", "tokens": [' + HUGE_INT + b"]}"), *EPOCH],
        r"bad.jsonl:1: invalid JSON value at \$\.tokens\[0\]",
    ),
    (
        "jsonl-deep",
        lambda t: ["epoch", _cli_jsonl(t, b'{"tokens": ' + DEEP + b"}"), *EPOCH],
        r"bad.jsonl:1: invalid JSON \(nested too deeply\)",
    ),
    ("header-deep", lambda t: ["inspect", str(_store_with(t, _raw_header(DEEP)))], r"header.json: unreadable header"),
    (
        "ids-huge-int",
        lambda t: ["epoch", str(_many_ids_store(t, HUGE_INT)), *EPOCH],
        r"ids.jsonl:5: invalid JSON value at \$ \(Number out of range\); a document id must be one JSON string",
    ),
    (
        "offsets-wrap",
        lambda t: ["inspect", "--no-verify", str(_store_with(t, lambda p: _write_offsets(p, [0, 2**63 - 1, -2, 30], 30)))],
        r"offsets.bin: offsets\[1\]=9223372036854775807 is outside \[0, 30\]",
    ),
    (
        "prepare-under-a-file",
        lambda t: ["prepare", _cli_jsonl(t, GOOD), "-o", str(t / "bad.jsonl" / "s")],
        r"bad.jsonl/s: cannot create the store",
    ),
    ("output-directory", lambda t: ["epoch", _cli_jsonl(t, GOOD), *EPOCH, "-o", str(t)], r"output '.*' is a directory"),
    (
        "output-missing-folder",
        lambda t: ["epoch", _cli_jsonl(t, GOOD), *EPOCH, "-o", str(t / "no" / "out")],
        r"output '.*/no/out': cannot create a file in",
    ),
    (
        "T-2**64",
        lambda t: ["epoch", _cli_jsonl(t, GOOD), "-T", str(2**64), "-B", "2", "--seed", "1"],
        r"context_length=\d+ must be",
    ),
    ("B-2**63", lambda t: ["epoch", _cli_jsonl(t, GOOD), "-T", "2", "-B", str(2**63), "--seed", "1"], r"batch_size=\d+ must be"),
    (
        "stride-2**62",
        lambda t: ["epoch", _cli_jsonl(t, GOOD), *EPOCH, "--stride", str(2**62)],
        r"stride=4611686018427387904 must be",
    ),
    ("T-5000-digits", lambda t: ["epoch", _cli_jsonl(t, GOOD), "-T", "9" * 5000, "-B", "2", "--seed", "1"], r"invalid int value"),
    (
        "inspect-T-2**64",
        lambda t: ["inspect", str(_store_with(t, lambda p: None)), "-T", str(2**64)],
        r"context_length=18446744073709551616 must be",
    ),
]


@pytest.mark.parametrize(("argv", "message"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_hostile_cli_catalogue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: Callable[[Path], list[str]], message: str
) -> None:
    """Through the CLI: exit status 2 and one line `streambatch: error: ...` on stderr, no traceback."""
    args = argv(tmp_path)
    capsys.readouterr()
    assert 2 == main(args)
    err = capsys.readouterr().err
    assert 1 == err.count("\n"), err[:2000]
    assert err.startswith("streambatch: error: ")
    assert "Traceback" not in err
    assert ".partial-" not in err  # the user's path, never a temporary
    assert ".streambatch-" not in err
    assert re.search(message, err), err[:2000]


# --- fuzzing: nothing but StreamBatchError --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=16,
)
HEADER_KEYS = [
    "format",
    "version",
    "dtype",
    "token_count",
    "document_count",
    "fingerprint",
    "ids",
    "partitions",
    "ids_file",
    "partitions_file",
]


def _opens_or_store_error(path: Path) -> None:
    for verify in (False, True):
        try:
            store = open_store(path, verify=verify)
        except sb.StreamBatchError:
            continue
        list(store)  # a store that opens is usable


_FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)  # examples: the profile's


@_FUZZ
@given(
    edits=st.lists(st.tuples(st.sampled_from([*HEADER_KEYS, "other"]), st.one_of(st.just("<delete>"), json_values)), max_size=3),
    raw=st.one_of(st.none(), st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())),
)
def test_fuzz_store_header(tmp_path: Path, edits: list[tuple[str, Any]], raw: bytes | None) -> None:
    """Random headers (near-valid edits, random JSON, random bytes): the store opens or raises StreamBatchError."""
    path = tmp_path / "s"
    if not path.exists():
        _small_store(path)
        (tmp_path / "header.orig").write_bytes((path / "header.json").read_bytes())
    header = json.loads((tmp_path / "header.orig").read_bytes())
    for key, value in edits:
        if value == "<delete>":
            header.pop(key, None)
        else:
            header[key] = value
    (path / "header.json").write_bytes(raw if raw is not None else json.dumps(header).encode())
    _opens_or_store_error(path)


@pytest.fixture(scope="module")
def many_ids_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose ids live in ids.jsonl."""
    path = tmp_path_factory.mktemp("ids") / "s"
    write_store(path, [sb.Document(f"d{i}", "train", [i % 5]) for i in range(INLINE_DOCUMENTS + 1)])
    return path


@_FUZZ
@given(
    line=st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())),
    at=st.integers(0, INLINE_DOCUMENTS + 1),
    mode=st.sampled_from(["replace", "insert", "whole"]),
)
def test_fuzz_store_ids_file(tmp_path: Path, many_ids_store: Path, line: bytes, at: int, mode: str) -> None:
    """Random lines in ids.jsonl (or random bytes as the whole file): only StreamBatchError."""
    path = tmp_path / "s"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(many_ids_store, path)
    lines = (path / "ids.jsonl").read_bytes().split(b"\n")
    if mode == "whole":
        (path / "ids.jsonl").write_bytes(line)
    else:
        if mode == "replace":
            lines[min(at, len(lines) - 1)] = line
        else:
            lines.insert(at, line)
        (path / "ids.jsonl").write_bytes(b"\n".join(lines))
    _opens_or_store_error(path)


def _near_valid(value: Any, key: str) -> bytes:
    record: dict[str, Any] = {"id": "x", "partition": "train", "tokens": [1, 2]}
    if value == "<delete>":
        record.pop(key, None)
    else:
        record[key] = value
    return json.dumps(record).encode()


jsonl_lines = st.one_of(
    st.binary(max_size=40),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        _near_valid, st.one_of(st.just("<delete>"), json_values), st.sampled_from(["id", "partition", "tokens", "input_ids"])
    ),
)


@_FUZZ
@given(lines=st.lists(jsonl_lines, max_size=5), bom=st.booleans(), raw=st.one_of(st.none(), st.binary(max_size=200)))
def test_fuzz_jsonl(tmp_path: Path, lines: list[bytes], bom: bool, raw: bytes | None) -> None:
    """read_jsonl / iter_jsonl over random bytes, random JSON values and near-valid lines: only StreamBatchError."""
    data = raw if raw is not None else b"\n".join(lines)
    path = tmp_path / "f.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    with contextlib.suppress(sb.StreamBatchError):
        list(iter_jsonl(path))
    with contextlib.suppress(sb.StreamBatchError):
        sb.read_jsonl(path)


# --- 2. offsets ------------------------------------------------------------------------------------------


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6), st.integers(0, 50))
def test_offsets_check_is_sound(offsets: list[int], token_count: int) -> None:
    """from_arrays accepts exactly the offsets that start at 0, never decrease and end at the token count."""
    valid = offsets[0] == 0 and offsets[-1] == token_count and all(a <= b for a, b in itertools.pairwise(offsets))
    try:
        store = sb.DocumentStore.from_arrays(np.zeros(token_count, np.uint16), offsets)
    except sb.DataError:
        assert not valid
    else:
        assert valid
        assert offsets[1:] == (store.starts + store.lengths).tolist()


# --- 3. atomic replace, crashes and concurrency -----------------------------------------------------------

_CONTENT = textwrap.dedent(
    """
    import numpy as np
    import streambatch as sb
    from streambatch.io.store import StoreWriter

    def write_new(target, kind):
        with StoreWriter(target) as writer:
            if kind == "inline":
                writer.add("n0", "train", [1, 2, 3])
                writer.add("n1", "test", [4, 5])
                writer.add("n2", "train", [70000, 6])  # widens the staged tokens to uint32
            else:
                count = 1100  # ids in their own files
                tokens = np.arange(3 * count, dtype=np.uint16) % 50
                writer.add_block(tokens, [3] * count, [f"n{i}" for i in range(count)], "train")
            return writer.commit()
    """
)
_KILL_AT = textwrap.dedent(
    """
    import os, sys
    import streambatch.io.store as store
    target, kill_at, kind, fallback = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    if fallback:
        store._renameat2_function = None
    steps = []
    def hook(name):
        if len(steps) == kill_at:
            os._exit(9)
        steps.append(name)
    store.step_hook = hook
    """
)


def _write_new(target: Path, kind: str) -> sb.DocumentStore:
    scope: dict[str, Any] = {}
    exec(_CONTENT, scope)
    result: sb.DocumentStore = scope["write_new"](target, kind)
    return result


def _steps(tmp_path: Path, kind: str, fallback: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    _small_store(tmp_path / "count")
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "step_hook", names.append)
        if fallback:
            patch.setattr(store_module, "_renameat2_function", None)
        _write_new(tmp_path / "count", kind)
    return names


@pytest.mark.skipif(store_module._renameat2_function is None, reason="renameat2 is not available here")
@pytest.mark.parametrize("kind", ["inline", "files"])
def test_replace_killed_at_every_step(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replacing write killed at each step: the target is the old store or the new one; a later writer cleans up."""
    steps = _steps(tmp_path, kind, False, monkeypatch)
    assert {"add", "finish", "fsync", "header", "replace", "exchanged", "removed"} <= set(steps)
    target = tmp_path / "s"
    new = _write_new(tmp_path / "reference", kind).fingerprint
    seen = []
    for kill_at in range(len(steps) + 1):
        old = _small_store(target).fingerprint
        script = _KILL_AT + _CONTENT + "\nwrite_new(target, kind)\n"
        done = subprocess.run([sys.executable, "-c", script, str(target), str(kill_at), kind, "0"], env=ENV, capture_output=True)
        assert (9 if kill_at < len(steps) else 0) == done.returncode, done.stderr.decode()[-2000:]
        opened = open_store(target).fingerprint
        assert opened in {old, new}, f"killed before step {kill_at}"
        seen.append(opened == new)
        if kill_at < len(steps) and steps[kill_at] in {"exchanged"}:
            assert _temporaries(tmp_path, "s"), "the exchanged-out old store should be left for the next writer"
        _small_store(target)  # the next writer removes what the dead one left
        assert [] == _temporaries(tmp_path, "s")
    swapped = steps.index("exchanged")  # the hook of this step runs right after the exchange
    assert [k >= swapped for k in range(len(steps) + 1)] == seen


def test_fallback_replace_killed_at_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without renameat2 (two renames), as documented: old, new, or (between the renames) the old one kept aside."""
    steps = _steps(tmp_path, "inline", True, monkeypatch)
    assert "moved-aside" in steps
    assert "exchanged" not in steps
    target = tmp_path / "s"
    new = _write_new(tmp_path / "reference", "inline").fingerprint
    for kill_at in range(len(steps) + 1):
        if target.exists():
            shutil.rmtree(target)
        old = _small_store(target).fingerprint
        script = _KILL_AT + _CONTENT + "\nwrite_new(target, kind)\n"
        done = subprocess.run(
            [sys.executable, "-c", script, str(target), str(kill_at), "inline", "1"], env=ENV, capture_output=True
        )
        assert done.returncode in (0, 9), done.stderr.decode()[-2000:]
        if kill_at < len(steps) and steps[kill_at] == "moved-aside":  # killed between the two renames
            assert not target.exists()
            (aside,) = tmp_path.glob(".s.old-*")
            assert old == open_store(aside).fingerprint
        else:
            assert open_store(target).fingerprint in {old, new}
        with monkeypatch.context() as patch:
            patch.setattr(store_module, "_renameat2_function", None)
            _small_store(target)
        assert [] == _temporaries(tmp_path, "s")


def test_open_retries_when_its_version_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replace that removes the version being opened makes open_store start over on the new one."""
    target = tmp_path / "s"
    _small_store(target)
    new = _write_new(tmp_path / "reference", "files").fingerprint
    real = store_module._open_at
    calls: list[int] = []

    def racing(dfd: int, root: Path, verify: bool) -> sb.DocumentStore:
        calls.append(dfd)
        if len(calls) == 1:
            monkeypatch.setattr(store_module, "_open_at", real)
            _write_new(target, "files")  # exchanged out and deleted under the open directory fd
            monkeypatch.setattr(store_module, "_open_at", racing)
        return real(dfd, root, verify)

    monkeypatch.setattr(store_module, "_open_at", racing)
    assert new == open_store(target).fingerprint
    assert 2 == len(calls)


_LOOP_WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import streambatch as sb
    from streambatch.io.store import write_store
    target, seconds, which = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    rng = np.random.default_rng(0)
    contents = {
        "a": [sb.Document(f"a{i}", "train", rng.integers(0, 900, 20)) for i in range(60)],
        "b": [sb.Document(f"b{i}", "train", rng.integers(0, 70000, 6)) for i in range(1100)],
    }
    order = ["a", "b"] if which == "both" else [which]
    end = time.monotonic() + seconds
    count = 0
    while time.monotonic() < end:
        write_store(target, contents[order[count % len(order)]])
        count += 1
    print(count)
    """
)


def _contents() -> dict[str, list[sb.Document]]:
    scope: dict[str, Any] = {}
    source = _LOOP_WRITER.split("order =")[0].replace("target, seconds, which = sys.argv[1], float(sys.argv[2]), sys.argv[3]", "")
    exec(source, scope)
    contents: dict[str, list[sb.Document]] = scope["contents"]
    return contents


def test_readers_see_old_or_new_while_a_writer_replaces(tmp_path: Path) -> None:
    """One process replaces a store in a loop; this one opens and iterates it meanwhile: zero errors."""
    target = tmp_path / "s"
    contents = _contents()
    expected = {}
    for name, docs in contents.items():
        fingerprint = write_store(tmp_path / name, docs).fingerprint
        expected[fingerprint] = list(sb.Epoch(docs, context_length=2, batch_size=3))
    write_store(target, contents["a"])
    writer = subprocess.Popen(
        [sys.executable, "-c", _LOOP_WRITER, str(target), "2.5", "both"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    opened: dict[str, int] = {}
    try:
        while writer.poll() is None:
            store = open_store(target)
            assert store.fingerprint in expected
            assert expected[store.fingerprint] == list(sb.Epoch(store, context_length=2, batch_size=3))
            opened[store.fingerprint] = opened.get(store.fingerprint, 0) + 1
    finally:
        out, err = writer.communicate(timeout=60)
    assert 0 == writer.returncode, err.decode()[-2000:]
    assert int(out) >= 4, "the writer should have replaced the store several times"
    assert 2 == len(opened), opened
    assert [] == _temporaries(tmp_path, "s")


def test_two_concurrent_writers_both_succeed(tmp_path: Path) -> None:
    """Two writers replacing one target at the same time: no error on either side; the last one wins."""
    target = tmp_path / "s"
    command = [sys.executable, "-c", _LOOP_WRITER, str(target), "1.5"]
    writers = [subprocess.Popen([*command, w], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for w in ("a", "b")]
    results = [w.communicate(timeout=60) for w in writers]
    for writer, (out, err) in zip(writers, results, strict=True):
        assert 0 == writer.returncode, err.decode()[-2000:]
        assert b"" == err
        assert int(out) >= 1
    contents = _contents()
    fingerprints = {write_store(tmp_path / n, d).fingerprint for n, d in contents.items()}
    assert open_store(target).fingerprint in fingerprints
    assert [] == _temporaries(tmp_path, "s")


def test_writer_returns_its_own_store_even_when_replaced_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """commit's store is the one it wrote, even if another writer replaces it before commit returns."""
    target = tmp_path / "s"
    _small_store(target)
    mine = _write_new(tmp_path / "reference", "inline")

    def replace_then(name: str) -> None:
        if name == "removed":
            monkeypatch.setattr(store_module, "step_hook", None)
            write_store(target, [sb.Document("other", "train", [9])])

    monkeypatch.setattr(store_module, "step_hook", replace_then)
    got = _write_new(target, "inline")
    assert mine.fingerprint == got.fingerprint
    assert list(mine) == list(got)
    assert ("other",) == open_store(target).ids


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """partial and old directories of a dead pid are removed by the next writer; a live pid's are kept."""
    dead, alive = _dead_pid(), os.getpid()
    names = [f".s.partial-{dead}-aaaa", f".s.old-{dead}-bbbb", f".s.partial-{alive}-cccc", ".s.old-legacy", ".other.partial-1-x"]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokens.bin").write_bytes(b"\0" * 10)
    _small_store(tmp_path / "s")
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert sorted([f".s.partial-{alive}-cccc", ".s.old-legacy", ".other.partial-1-x"]) == left


def test_staging_is_never_larger_than_the_store(tmp_path: Path) -> None:
    """Without a fixed dtype, tokens are staged as uint16 and widened once when an id needs 32 bits."""
    with StoreWriter(tmp_path / "s") as writer:
        writer.add("a", "train", list(range(1000)))
        staged = writer._tmp
        assert staged is not None
        writer._tokens.flush()
        assert 2 * 1000 == (staged / "tokens.bin").stat().st_size
        writer.add("b", "train", [70_000, 1])
        writer._tokens.flush()
        assert 4 * 1002 == (staged / "tokens.bin").stat().st_size
        store = writer.commit()
    assert "uint32" == store.tokens.dtype.name
    assert [70_000, 1] == store.document(1).tokens.tolist()
    assert list(range(1000)) == store.document(0).tokens.tolist()


def test_store_symlink_is_followed_and_kept(tmp_path: Path) -> None:
    """A store path that is a symlink: the directory it points to is replaced, the link stays."""
    real = tmp_path / "real"
    _small_store(real)
    (tmp_path / "link").symlink_to(real)
    write_store(tmp_path / "link", [sb.Document("new", "train", [1])])
    assert (tmp_path / "link").is_symlink()
    assert ("new",) == open_store(real).ids == open_store(tmp_path / "link").ids


# --- 4. outputs and permissions --------------------------------------------------------------------------


def test_permissions_follow_the_umask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under umask 022 store directories are 0755, store files and -o outputs 0644 (077: 0700 / 0600)."""
    source = _jsonl(tmp_path, GOOD)
    for mask, directory_mode, file_mode in ((0o022, 0o755, 0o644), (0o077, 0o700, 0o600)):
        with _umask(mask):
            path = tmp_path / f"store-{mask:o}"
            write_store(path, [sb.Document(f"d{i}", "train", [i]) for i in range(INLINE_DOCUMENTS + 1)])
            write_store(path, [sb.Document(f"d{i}", "train", [i]) for i in range(INLINE_DOCUMENTS + 1)])  # a replace
            out = tmp_path / f"out-{mask:o}.jsonl"
            assert 0 == main(["epoch", str(source), *EPOCH, "-o", str(out)])
        assert directory_mode == stat.S_IMODE(path.stat().st_mode)
        for name in ("header.json", "tokens.bin", "offsets.bin", "ids.jsonl", "partitions.bin"):
            assert file_mode == stat.S_IMODE((path / name).stat().st_mode), name
        assert file_mode == stat.S_IMODE(out.stat().st_mode)


def test_output_to_a_fifo_is_written_through(tmp_path: Path) -> None:
    """-o a named pipe: the batches are written into it (read here by a thread), the FIFO stays a FIFO."""
    source = _jsonl(tmp_path, GOOD)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    try:
        assert 0 == main(["epoch", str(source), *EPOCH, "-o", str(fifo)])
    finally:
        reader.join(timeout=30)
    assert 2 == len(received[0].decode().splitlines())
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [] == list(tmp_path.glob(".streambatch-*"))


def test_output_to_a_character_device(tmp_path: Path) -> None:
    """-o /dev/null is written through, never replaced."""
    assert 0 == main(["epoch", str(_jsonl(tmp_path, GOOD)), *EPOCH, "-o", os.devnull])
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_output_to_dev_stdout_appends_to_a_redirected_log(tmp_path: Path) -> None:
    """-o /dev/stdout writes to the open descriptor: a `>>` log is appended to, not truncated or replaced."""
    log = tmp_path / "log.jsonl"
    log.write_text("earlier\n")
    source = _jsonl(tmp_path, GOOD)
    script = f"from streambatch.cli import main; raise SystemExit(main({['epoch', str(source), *EPOCH, '-o', '/dev/stdout']!r}))"
    with open(log, "a") as handle:
        done = subprocess.run([sys.executable, "-c", script], stdout=handle, env=ENV)
    assert 0 == done.returncode
    lines = log.read_text().splitlines()
    assert "earlier" == lines[0]
    assert 3 == len(lines)  # the earlier line, then two batches
    assert 0 == json.loads(lines[1])["index"]


def test_output_symlink_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    """-o a symlink: the file it points to is replaced atomically, the link stays a link; a dangling link creates it."""
    source = _jsonl(tmp_path, GOOD)
    (tmp_path / "real.jsonl").write_text("old\n")
    (tmp_path / "link.jsonl").symlink_to("real.jsonl")
    assert 0 == main(["epoch", str(source), *EPOCH, "-o", str(tmp_path / "link.jsonl")])
    assert (tmp_path / "link.jsonl").is_symlink()
    assert 2 == len((tmp_path / "real.jsonl").read_text().splitlines())
    (tmp_path / "dangling.jsonl").symlink_to("created.jsonl")
    assert 0 == main(["epoch", str(source), *EPOCH, "-o", str(tmp_path / "dangling.jsonl")])
    assert (tmp_path / "dangling.jsonl").is_symlink()
    assert 2 == len((tmp_path / "created.jsonl").read_text().splitlines())


def test_output_failure_keeps_the_previous_file(tmp_path: Path) -> None:
    """An error in the middle of writing leaves the previous file and no temporary."""
    target = tmp_path / "out.txt"
    target.write_text("previous\n")

    def fail() -> None:
        with atomic_text(target) as handle:
            handle.write("partial")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fail()
    assert "previous\n" == target.read_text()
    assert [] == list(tmp_path.glob(".streambatch-*"))


def test_output_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """.streambatch-PID-*.tmp of a dead pid is removed by the next -o write into the folder; a live one is kept."""
    dead = tmp_path / f".streambatch-{_dead_pid()}-0000.tmp"
    alive = tmp_path / f".streambatch-{os.getpid()}-0000.tmp"
    legacy = tmp_path / ".streambatch-abc_defg.tmp"
    for path in (dead, alive, legacy):
        path.write_text("partial")
    with atomic_text(tmp_path / "out.txt") as handle:
        handle.write("x")
    assert not dead.exists()
    assert alive.exists()
    assert legacy.exists()


def test_output_error_names_the_users_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o into an unwritable folder: the message names the path given, not the temporary."""
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert 2 == main(["epoch", str(_jsonl(tmp_path, GOOD)), *EPOCH, "-o", str(folder / "out.jsonl")])
    finally:
        folder.chmod(0o700)
    err = capsys.readouterr().err
    assert "ro/out.jsonl" in err
    assert ".streambatch-" not in err


def test_time_budget_sanity() -> None:
    """The hostile inputs above are decoded quickly (bounded work, no quadratic blow-up)."""
    start = time.perf_counter()
    for _ in range(20):
        with contextlib.suppress(sb.DataError):
            decode_record(b'{"tokens": ' + DEEP + b"}", "x")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"format": "streambatch.corpus", "version": 1, "shards": [' + "9" * 5000 + "]}",
        "\xff",
    ],
    ids=["deep", "huge-int", "not-utf8"],
)
def test_hostile_corpus_manifest_is_a_store_error(tmp_path: Path, text: str) -> None:
    """A corpus manifest goes through the bounded JSON decoder too: a StoreError, never a RecursionError or ValueError."""
    path = tmp_path / "corpus.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff")
    with pytest.raises(sb.StoreError, match=r"corpus\.json"):
        sb.open_corpus(path)


def test_hostile_plan_header_is_a_store_error(tmp_path: Path) -> None:
    """A plan file whose header is deeply nested JSON is refused as a StoreError."""
    from streambatch.stages.plan import open_plan

    path = tmp_path / "x.plan"
    path.write_bytes(b"[" * 2000 + b"]" * 2000 + b" " * 96)
    with pytest.raises(sb.StoreError, match=r"x\.plan"):
        open_plan(path, {})
