"""Hypothesis fuzzing of store headers, ids files, JSONL input and offsets."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import DuplicateIdError, StoreError
from streambatch.io.store import INLINE_DOCUMENTS, open_store, write_store
from streambatch.read.jsonl import iter_jsonl, read_jsonl

from .hostile import SMALL, small_store

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


def _open(path: Path, verify: bool) -> sb.DocumentStore | StoreError:
    try:
        return open_store(path, verify=verify)
    except StoreError as err:
        return err


def _opens_or_store_error(path: Path, written: Sequence[sb.Document], fingerprint: str) -> None:
    """The store opens with exactly the documents written, or open_store raises a StoreError naming the store.

    verify=False trusts the header's ids and partitions (it skips the fingerprint), so a relabelled store may open
    that way, but only with the tokens written and only if verify=True refuses it.
    """
    verified, trusted = _open(path, True), _open(path, False)
    for opened in (verified, trusted):
        if isinstance(opened, StoreError):
            assert str(path) in str(opened), opened
    if isinstance(verified, sb.DocumentStore):
        assert list(written) == list(verified)
        assert fingerprint == verified.fingerprint
    if isinstance(trusted, sb.DocumentStore):
        assert [d.tokens.tolist() for d in written] == [d.tokens.tolist() for d in trusted]
        if list(written) != list(trusted):  # ids or partitions relabelled in the header: the fingerprint catches it
            assert isinstance(verified, StoreError)


_FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)  # examples: the profile's


@_FUZZ
@given(
    edits=st.lists(st.tuples(st.sampled_from([*HEADER_KEYS, "other"]), st.one_of(st.just("<delete>"), json_values)), max_size=3),
    raw=st.one_of(st.none(), st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())),
)
def test_fuzz_store_header(tmp_path: Path, edits: list[tuple[str, Any]], raw: bytes | None) -> None:
    """Random headers (near-valid edits, random JSON, random bytes): the written documents, or a StoreError."""
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
    _opens_or_store_error(path, SMALL, json.loads((tmp_path / "header.orig").read_bytes())["fingerprint"])


MANY = [sb.Document(f"d{i}", "train", [i % 5]) for i in range(INLINE_DOCUMENTS + 1)]


@pytest.fixture(scope="module")
def many_ids_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store whose ids live in ids.jsonl, and its fingerprint."""
    path = tmp_path_factory.mktemp("ids") / "s"
    return path, write_store(path, MANY).fingerprint


@_FUZZ
@given(
    line=st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())),
    at=st.integers(0, INLINE_DOCUMENTS + 1),
    mode=st.sampled_from(["replace", "insert", "whole"]),
)
def test_fuzz_store_ids_file(tmp_path: Path, many_ids_store: tuple[Path, str], line: bytes, at: int, mode: str) -> None:
    """Random lines in ids.jsonl (or random bytes as the whole file): the written documents, or a StoreError."""
    path = tmp_path / "s"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(many_ids_store[0], path)
    lines = (path / "ids.jsonl").read_bytes().split(b"\n")
    if mode == "whole":
        (path / "ids.jsonl").write_bytes(line)
    else:
        if mode == "replace":
            lines[min(at, len(lines) - 1)] = line
        else:
            lines.insert(at, line)
        (path / "ids.jsonl").write_bytes(b"\n".join(lines))
    _opens_or_store_error(path, MANY, many_ids_store[1])


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
    """iter_jsonl / read_jsonl over random bytes, random JSON values and near-valid lines.

    Each document read is its line as written (id, partition, tokens, defaults filled in); a refusal is a DataError
    naming the file and the first line it cannot accept, after every line before it was read.
    """
    data = (b"\xef\xbb\xbf" if bom else b"") + (raw if raw is not None else b"\n".join(lines))
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    docs: list[sb.Document] = []
    refusal: sb.StreamBatchError | None = None
    try:
        docs.extend(iter_jsonl(path))
    except sb.StreamBatchError as err:
        refusal = err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert isinstance(refusal, sb.DataError), refusal
        assert str(refusal).startswith(f"{path}: not UTF-8")
        assert [] == docs
    else:
        text = text.removeprefix("\ufeff")  # one byte-order mark
        rows = text.split("\n")
        if rows and not rows[-1]:
            rows.pop()
        numbered = [(n, row.removesuffix("\r")) for n, row in enumerate(rows, start=1) if row.strip()]
        if refusal is None:
            assert len(numbered) == len(docs)
        else:
            assert isinstance(refusal, sb.DataError), refusal
            named = re.match(re.escape(f"{path}:") + r"(\d+)\b", str(refusal))
            assert named, refusal
            assert int(named[1]) in [n for n, _ in numbered]
            assert [n for n, _ in numbered if n < int(named[1])] == [n for n, _ in numbered[: len(docs)]]
        for doc, (number, row) in zip(docs, numbered, strict=False):
            record = json.loads(row)
            written = record["tokens"] if "tokens" in record else record["input_ids"]
            assert (record.get("id", str(number)), record.get("partition", "train"), written) == (
                doc.id,
                doc.partition.value,
                doc.tokens.tolist(),
            )
    if refusal is not None:
        with pytest.raises(type(refusal)) as caught:
            read_jsonl(path)
        assert str(refusal) == str(caught.value)
        return
    firsts: dict[str, int] = {}
    repeated = next(((firsts[d.id], i) for i, d in enumerate(docs) if firsts.setdefault(d.id, i) != i), None)
    if repeated is None:
        assert docs == list(read_jsonl(path))
    else:
        first, again = (numbered[i][0] for i in repeated)
        with pytest.raises(DuplicateIdError, match=re.escape(f"first at {path}:{first}, repeated at {path}:{again}")):
            read_jsonl(path)


@pytest.mark.parametrize(
    "tokens",
    [{}, {1: 2}, set(), frozenset({3}), {}.keys(), bytearray(b"ab")],
    ids=["empty-dict", "dict", "set", "frozenset", "keys", "bytearray"],
)
def test_tokens_must_be_a_sequence(tokens: object) -> None:
    """A mapping or set is not a token sequence: refused like a string is, not read as its keys."""
    with pytest.raises(sb.DataError, match="is not a sequence"):
        sb.Document("x", "train", tokens)


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
