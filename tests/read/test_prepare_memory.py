"""prepare's memory per document: ids kept as one buffer (`IdLines`), repeats found by hashes, records streamed to disk."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import DuplicateIdError, StoreError
from streambatch.io.store import StoreWriter
from streambatch.model import ids as ids_module
from streambatch.model.ids import IdHashes, IdLines, first_repeat, hashes_of, json_line
from streambatch.model.store import content_fingerprint
from tests.hostile import PEAK_RSS

ID = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=6)


def _reference_fingerprint(tokens: bytes, offsets: bytes, ids: list[str], codes: list[int]) -> str:
    digest = hashlib.blake2b(tokens + offsets, digest_size=32)
    digest.update(json.dumps([ids, codes], separators=(",", ":")).encode())
    return "blake2b-256:" + digest.hexdigest()


@settings(max_examples=60, deadline=None)
@given(st.lists(ID, max_size=30), st.data())
def test_id_lines_are_a_tuple(ids: list[str], data: st.DataObject) -> None:
    """Length, indexing (negative too), slices, iteration, ==, pickling and the fingerprint: as the tuple's."""
    lines = IdLines.of(b"".join(json_line(i) + b"\n" for i in ids))
    assert len(lines) == len(ids)
    assert lines == tuple(ids)
    assert lines == list(ids)
    assert list(lines) == ids
    assert [json.loads(line) for line in lines.lines()] == ids
    if ids:
        index = data.draw(st.integers(-len(ids), len(ids) - 1))
        assert lines[index] == ids[index]
        lo, hi = sorted(data.draw(st.lists(st.integers(-40, 40), min_size=2, max_size=2)))
        assert lines[lo:hi] == tuple(ids[lo:hi])
        assert lines != tuple(ids[:-1])
    with pytest.raises(IndexError):
        lines[len(ids)]
    assert pickle.loads(pickle.dumps(lines)) == lines
    codes = data.draw(st.lists(st.integers(0, 2), min_size=len(ids), max_size=len(ids)))
    expected = _reference_fingerprint(b"tok", b"off", ids, codes)
    array = np.array(codes, dtype=np.uint8)
    assert expected == content_fingerprint([b"tok"], [b"off"], ids, array)
    assert expected == content_fingerprint([b"tok"], [b"off"], lines, array)
    assert expected == content_fingerprint([b"tok"], [b"off"], (), array, id_lines=map(json_line, ids))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=5), max_size=6), st.booleans())
def test_repeats_are_found_as_a_dict_finds_them(blocks: list[list[str]], collide: bool) -> None:
    """IdHashes and first_repeat name the first repeat a dict would, even when every hash collides."""
    flat = [i for block in blocks for i in block]
    seen: dict[str, int] = {}
    expected = next(((seen[i], k) for k, i in enumerate(flat) if seen.setdefault(i, k) != k), None)
    with pytest.MonkeyPatch.context() as patch:
        if collide:  # every id hashes alike: the ids themselves must decide
            patch.setattr(ids_module, "hash", lambda _: 7, raising=False)
        assert expected == first_repeat(flat, hashes_of(flat, len(flat)))
        assert expected == first_repeat(flat)
    runs, found, at = IdHashes(), None, 0
    for block in blocks:  # candidates never miss a repeat
        earlier, within = runs.candidates(hashes_of(block, len(block)))
        for k, name in enumerate(block):
            if name in flat[:at] or name in block[:k]:
                assert earlier[k] or within[k]
                found = found or (at + k)
        runs.add(hashes_of(block, len(block)))
        at += len(block)
    assert (expected[1] if expected else None) == found


def test_writer_finds_repeats_across_blocks_and_after_rollback(tmp_path: Path) -> None:
    """A repeated id is refused naming both places (earlier block, same block); a rolled-back id may come again."""
    with StoreWriter(tmp_path / "s") as writer:
        writer.add_block(np.arange(4, dtype=np.uint16), [1, 3], ["a", "b"], "train", wheres=["f:1", "f:2"])
        mark = writer.mark()
        writer.add_block(np.arange(2, dtype=np.uint16), [2], ["c"], "train", wheres=["g:1"])
        with pytest.raises(DuplicateIdError, match=r"id='b': first at f:2 \(document id='b'\), repeated at h:2"):
            writer.add_block(np.arange(2, dtype=np.uint16), [1, 1], ["x", "b"], "train", wheres=["h:1", "h:2"])
        with pytest.raises(DuplicateIdError, match=r"id='y': first at h:1 \(document id='y'\), repeated at h:2"):
            writer.add_block(np.arange(2, dtype=np.uint16), [1, 1], ["y", "y"], "train", wheres=["h:1", "h:2"])
        with pytest.raises(DuplicateIdError, match=r"id='c': first at g:1"):
            writer.add("c", "test", [1])
        writer.rollback(mark)
        writer.add("c", "test", [70_000])  # no longer a repeat; widens to uint32
        store = writer.commit()
    assert ("a", "b", "c") == store.ids
    assert [[0], [1, 2, 3], [70_000]] == [d.tokens.tolist() for d in store]
    assert sb.open_store(tmp_path / "s").fingerprint == store.fingerprint


def test_large_stores_keep_ids_in_one_buffer(tmp_path: Path) -> None:
    """Over 1,024 documents, an opened store's ids are an IdLines (no str per id), equal to the ids written."""
    ids = [f"doc-{i}" for i in range(3000)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": i, "tokens": [1, 2]}) + "\n" for i in ids))
    store = sb.prepare_store([tmp_path / "d.jsonl"], tmp_path / "s", quiet=True)
    assert isinstance(store.ids, IdLines)
    assert store.ids == tuple(ids)
    again = sb.open_store(tmp_path / "s")
    assert isinstance(again.ids, IdLines)
    assert again.fingerprint == store.fingerprint == again.content_fingerprint()
    assert "doc-2999" == again.document(2999).id
    lines = (tmp_path / "s" / "ids.jsonl").read_bytes().split(b"\n")
    lines[2500] = lines[7]  # a repeated id in the file
    (tmp_path / "s" / "ids.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(
        StoreError, match=r"duplicate document id='doc-7': first at document index 7, repeated at document index 2500"
    ):
        sb.open_store(tmp_path / "s", verify=False)


_CHILD = (
    PEAK_RSS
    + """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # 2 GiB of address space (the old writer needed ~8 GiB here)
import streambatch as sb
sb.prepare_store([sys.argv[1]], sys.argv[2], per_line=True, quiet=True)
print(peak())
"""
)


def _peak(tmp_path: Path, count: int) -> int:
    path = tmp_path / f"{count}.txt"
    path.write_bytes(b"a\n" * count)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / f"s{count}")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@pytest.mark.slow
def test_prepare_holds_at_most_64_bytes_per_document(tmp_path: Path) -> None:
    """3 * 10**6 one-character lines under a 2 GiB address space: peak RSS grows <= 64 bytes per document (it was
    ~700-844, which alone would pass 2 GiB here)."""
    small, large = 200_000, 3_000_000
    growth = (_peak(tmp_path, large) - _peak(tmp_path, small)) / (large - small)
    assert growth <= 64, f"{growth:.1f} bytes per document"
    assert large == len(sb.open_store(tmp_path / f"s{large}"))


def test_id_hashes_mix_single_ids_and_blocks() -> None:
    """Ids added one at a time (a set) and in blocks (sorted runs) are all found again, across every flush."""
    seen = IdHashes()
    names = [f"s{i}" for i in range(5000)]
    for name in names:  # past the set's size: flushed into a run
        assert not seen.candidates(hashes_of([name], 1))[0].any()
        seen.add(hashes_of([name], 1))
    block = [f"b{i}" for i in range(6000)] + ["s4321"]
    earlier, within = seen.candidates(hashes_of(block, len(block)))
    assert [6000] == np.flatnonzero(earlier).tolist()
    assert not within.any()
    seen.add(hashes_of(block[:-1], 6000))
    for probe, found in (("b5999", True), ("s0", True), ("s4999", True), ("new", False)):
        assert found == bool(seen.candidates(hashes_of([probe], 1))[0][0])
    assert 11_000 == len(seen)


def test_rollback_forgets_only_the_documents_after_the_mark(tmp_path: Path) -> None:
    """After a rollback past many documents (sets and runs), their ids are free again and the kept ones still repeat."""
    with StoreWriter(tmp_path / "s") as writer:
        for i in range(3000):
            writer.add(f"k{i}", "train", [1])
        mark = writer.mark()
        writer.add_block(np.ones(70_000, np.uint16), np.ones(70_000, np.int64), [f"r{i}" for i in range(70_000)], "train")
        for i in range(2000):
            writer.add(f"q{i}", "train", [2])
        writer.rollback(mark)
        writer.add_block(np.ones(3, np.uint16), [1, 1, 1], ["r5", "q7", "r69999"], "train")
        with pytest.raises(DuplicateIdError, match="id='k2999'"):
            writer.add("k2999", "train", [1])
        with pytest.raises(DuplicateIdError, match="id='r5'"):
            writer.add("r5", "train", [1])
        store = writer.commit()
    assert 3003 == len(store)
    assert ("k0", "r5", "q7", "r69999") == (store.ids[0], *store.ids[3000:])
