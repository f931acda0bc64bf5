"""Formats that cannot lie (issue 43): overflow-safe pointers, an index that must cover its .bin exactly, folders of
two kinds, and writer messages that name the file, never an internal function."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import DataError
from streambatch.io.formats import FormatWriter
from streambatch.io.store_writer import StoreWriter
from tests.format_files import write_datatrove, write_megatron

GOOD = [[[0, 10, 11], [12, 1]], [[0, 20, 21, 1]], [[5, 6]]]  # 4 sequences, 3 documents
POINTERS = 34 + 16  # where the pointers start in GOOD's .idx


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _use(path: Path) -> None:
    store = sb.open_source(path).store
    assert store.lengths.size + store.tokens.size >= 0


@pytest.mark.parametrize("pointer", [2**63 - 8, 2**63 - 4096, 2**62])
def test_a_pointer_near_two_to_the_63_is_refused(tmp_path: Path, pointer: int, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's 200-byte .bin reported a 2.1 G-token document: the sum wrapped int64. Now: out of range."""
    prefix = write_megatron(tmp_path / "c", GOOD, "int32")
    _patch(prefix.with_name("c.idx"), POINTERS + 24, struct.pack("<q", pointer))
    with pytest.raises(DataError, match=rf"c.idx: pointer {pointer} of sequence 3 is past the end of .*c.bin .*out of range"):
        _use(prefix)
    assert main(["inspect", str(prefix)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "out of range" in err


def test_an_index_from_another_corpus_is_refused_naming_both_files(tmp_path: Path) -> None:
    """Same document count, other lengths: the .idx leaves bytes of the .bin uncovered (or skips some)."""
    mine = write_megatron(tmp_path / "mine", GOOD, "int32")
    other = write_megatron(tmp_path / "other", [[[1, 2]], [[3]], [[4, 5, 6]]], "int32")
    mine.with_name("mine.idx").write_bytes(other.with_name("other.idx").read_bytes())
    with pytest.raises(DataError, match=r"mine.idx does not cover .*mine.bin exactly .*do not belong together"):
        _use(mine)


def test_bytes_past_the_last_sequence_are_refused(tmp_path: Path) -> None:
    prefix = write_megatron(tmp_path / "c", GOOD, "int32")
    data = prefix.with_name("c.bin")
    data.write_bytes(data.read_bytes() + b"\0" * 8)
    with pytest.raises(DataError, match=r"c.idx does not cover .*c.bin exactly \(its sequences end at byte 44 of 52\)"):
        _use(prefix)


def test_a_gap_between_documents_is_refused(tmp_path: Path) -> None:
    prefix = write_megatron(tmp_path / "c", GOOD, "int32")
    _patch(prefix.with_name("c.idx"), POINTERS + 16, struct.pack("<q", 24))  # document 1 starts 4 bytes late
    with pytest.raises(DataError, match=r"sequence 2 starts at byte 24, not at byte 20 where the one before ends"):
        _use(prefix)


def test_exact_files_still_read(tmp_path: Path) -> None:
    prefix = write_megatron(tmp_path / "c", [*GOOD, [], [[7], [], [8, 9]]], "uint16")
    expected = [[0, 10, 11, 12, 1], [0, 20, 21, 1], [5, 6], [], [7, 8, 9]]
    assert [d.tokens.tolist() for d in sb.open_source(prefix).store] == expected


def test_a_folder_of_both_kinds_is_refused_unless_one_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "both"
    folder.mkdir()
    write_megatron(folder / "m", GOOD, "int32")
    write_datatrove(folder / "d.ds", [[1, 2, 3], [4]])
    with pytest.raises(DataError, match=r"both: holds both Megatron-LM files \(.*m.idx\) and datatrove files \(.*d.ds\)"):
        sb.open_source(folder)
    assert main(["inspect", str(folder)]) == 2
    assert "holds both Megatron-LM files" in capsys.readouterr().err
    megatron = sb.open_source(folder, format="megatron")
    datatrove = sb.open_source(folder, format="datatrove")
    assert (megatron.kind, len(megatron.store)) == ("megatron", 3)
    assert (datatrove.kind, len(datatrove.store)) == ("datatrove", 2)
    with pytest.raises(sb.ConfigError, match=r"format='arrow' is not one of 'megatron', 'datatrove'"):
        sb.open_source(folder, format="arrow")


@pytest.mark.parametrize("kind", ["megatron", "datatrove"])
def test_writer_messages_name_the_file_never_a_function(tmp_path: Path, kind: str) -> None:
    with FormatWriter(tmp_path / "out", kind) as writer:
        with pytest.raises(DataError) as raised:
            writer.add_block(np.array([1, 2, 3], np.uint32), [2], ["a"], "train")
        assert not str(raised.value).startswith("add_block")
        assert "out" in str(raised.value).split(":")[0]
        if kind == "megatron":
            with pytest.raises(DataError, match=r"^\S*out\.bin: megatron files hold no loss mask"):
                writer.add_block(np.array([1, 2], np.uint32), [2], ["a"], "train", loss_mask=[0, 1])


def test_store_writer_messages_name_the_store(tmp_path: Path) -> None:
    with StoreWriter(tmp_path / "s") as writer, pytest.raises(DataError, match=r"^\S*s: lengths, ids and tokens disagree"):
        writer.add_block(np.array([1, 2, 3], np.uint32), [2], ["a"], "train")
