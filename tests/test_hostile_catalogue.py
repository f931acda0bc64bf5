"""Every hostile input is a StreamBatchError of its class, naming what, where and what to do.

One catalogue per class of failure (bounded JSON, offsets that cannot wrap, store paths, outputs, size
arguments, exception types), through the API and through the CLI.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import StoreError
from streambatch.io.atomic import atomic_text
from streambatch.io.store import INLINE_DOCUMENTS, StoreWriter, open_store, write_store
from streambatch.items.windows.window_index import window_counts
from streambatch.order.shuffle import shuffled_order
from streambatch.read.jsonl import iter_jsonl, read_jsonl, read_records
from streambatch.stages.chunk import batch_widths, chunked

from .hostile import DEEP, EPOCH, GOOD, HUGE_INT, jsonl_file


def _header(path: Path) -> dict[str, Any]:
    header: dict[str, Any] = json.loads((path / "header.json").read_text())
    return header


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
        lambda t: read_jsonl(jsonl_file(t, b'{"id": "a", "partition": "train", "tokens": [1, ' + HUGE_INT + b"]}\n")),
        sb.DataError,
        r"bad.jsonl:1: invalid JSON value at \$\.tokens\[1\] \(Integer value out of range\)",
    ),
    (
        "jsonl-deep",
        lambda t: read_jsonl(jsonl_file(t, b'\n{"id": "a", "partition": "train", "tokens": ' + DEEP + b"}\n")),
        sb.DataError,
        r"bad.jsonl:2: invalid JSON \(nested too deeply\)",
    ),
    ("jsonl-array", lambda t: read_jsonl(jsonl_file(t, DEEP + b"\n")), sb.DataError, r"bad.jsonl:1: .*got `array`"),
    (
        "jsonl-not-utf8",
        lambda t: list(iter_jsonl(jsonl_file(t, b'{"id": "\xff"}\n'))),
        sb.DataError,
        r"bad.jsonl: not UTF-8",
    ),
    (
        "header-huge-int",
        lambda t: open_store(_store_with(t, _raw_header(b'{"format": "streambatch.store", "version": ' + HUGE_INT + b"}"))),
        StoreError,
        r"header.json: unreadable header: invalid JSON value at \$\[\.\.\.\] \(Integer value out of range\)",
    ),
    (
        "header-deep",
        lambda t: open_store(_store_with(t, _raw_header(DEEP))),
        StoreError,
        r"header.json: unreadable header: invalid JSON \(nested too deeply\)",
    ),
    (
        "header-over-64MiB",
        lambda t: open_store(_store_with(t, _huge_header)),
        StoreError,
        r"header.json: 68157440 bytes, more than a header may have \(64 MiB\)",
    ),
    ("header-fifo", lambda t: open_store(_store_with(t, _fifo_header)), StoreError, r"header.json: not a regular file"),
    (
        "header-version-true",
        lambda t: open_store(_store_with(t, _set_header(version=True))),
        StoreError,
        r"version=True is not supported",
    ),
    (
        "header-ids-file-escapes",
        lambda t: open_store(_store_with(t, _set_header(ids_file="../../etc/passwd", partitions_file="partitions.bin"))),
        StoreError,
        r"ids_file='../../etc/passwd' and partitions_file='partitions.bin' must be 'ids.jsonl' and 'partitions.bin'",
    ),
    (
        "header-fingerprint-type",
        lambda t: open_store(_store_with(t, _set_header(fingerprint=[1])), verify=False),
        StoreError,
        r"fingerprint=\[1\] must be a string",
    ),
    (
        "ids-huge-int",
        lambda t: open_store(_many_ids_store(t, HUGE_INT)),
        StoreError,
        r"ids.jsonl:5: invalid JSON value at \$ \(Number out of range\); a document id must be one JSON string",
    ),
    (
        "ids-deep",
        lambda t: open_store(_many_ids_store(t, DEEP)),
        StoreError,
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
        StoreError,
        r"offsets.bin: offsets\[1\]=9223372036854775807 is outside \[0, 30\]",
    ),
    # 3. stores
    (
        "store-under-a-file",
        lambda t: (t / "file").write_text("x") and write_store(t / "file" / "s", []),
        StoreError,
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
        r"/s: token\[0\]=-1 is outside",
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
        lambda t: window_counts([5], 2**64),
        sb.ConfigError,
        r"context_length=18446744073709551616 must be",
    ),
    ("stride-2**62", lambda t: window_counts([5], 2, stride=2**62), sb.ConfigError, r"stride=4611686018427387904 must be"),
    (
        "epoch-T-2**62",
        lambda t: sb.Epoch([sb.Document("a", "train", [1, 2])], context_length=2**62, batch_size=1, seed=None),
        sb.ConfigError,
        r"context_length=4611686018427387904 must be a positive int below 2\*\*48 \(larger sizes overflow int64 arithmetic\)",
    ),
    (
        "epoch-B-2**63",
        lambda t: sb.Epoch([sb.Document("a", "train", [1, 2])], context_length=1, batch_size=2**63, seed=None),
        sb.ConfigError,
        r"batch_size=9223372036854775808 must be a positive int below 2\*\*48",
    ),
    ("widths-count-2**62", lambda t: batch_widths(2**62, 3), sb.ConfigError, r"window_count=4611686018427387904 must be"),
    ("chunked-B-2**64", lambda t: chunked(np.arange(3), 2**64), sb.ConfigError, r"batch_size=18446744073709551616 must be"),
    ("shuffle-count-2**62", lambda t: shuffled_order(2**62, 7), sb.ConfigError, r"count=4611686018427387904 must be"),
    (
        "size-huge-digits",
        lambda t: window_counts([5], 10**5000),
        sb.ConfigError,
        r"context_length=an int of 16610 bits must be a positive int below 2\*\*48",
    ),
    # 6. exception types
    ("contribution-10**400", lambda t: sb.TokenContribution(10**400, [1.0]), sb.AccumulationError, r"loss=1000.* is too large"),
    (
        "add-sums-10**400",
        lambda t: sb.TokenMeanAccumulator(1).add_sums(10**400, 1, [1.0]),
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
    ("records-int", lambda t: read_records(5), sb.ConfigError, r"records=5 is not an iterable of rows"),
    ("records-huge-int", lambda t: read_records(10**5000), sb.ConfigError, r"records=an int of 16610 bits is not an iterable"),
    (
        "record-huge-token",
        lambda t: read_records([{"id": "a", "partition": "train", "tokens": [10**5000]}]),
        sb.DataError,
        r"record 0 \(document id='a'\): token\[0\]=an int of 16610 bits is outside \[0, 2\*\*32\)",
    ),
    (
        "record-huge-partition",
        lambda t: read_records([{"id": "a", "partition": 10**5000, "tokens": []}]),
        sb.DataError,
        r"partition=an int of 16610 bits is not one of",
    ),
    (
        "record-huge-id",
        lambda t: read_records([{"id": 10**5000, "partition": "train", "tokens": []}]),
        sb.DataError,
        r"id=an int",
    ),
    ("document-huge-tokens", lambda t: sb.Document("a", "train", 10**5000), sb.DataError, r"tokens=an int of 16610 bits is not"),
    (
        "records-one-dict",
        lambda t: read_records({"id": "a", "partition": "train", "tokens": []}),
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
    return str(jsonl_file(t, data))


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
