"""Hypothesis fuzzing of store headers, ids files, JSONL input and offsets."""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.io.store import INLINE_DOCUMENTS, open_store, write_store
from streambatch.stages.read.jsonl import iter_jsonl

from .hostile import small_store

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
        small_store(path)
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


# --- offsets ------------------------------------------------------------------------------------------


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
