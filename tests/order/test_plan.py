"""Tests for `streambatch.plan_file`: plan files written once, atomically, checked, shared by every process."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
import streambatch.items.windows.windows as windowing
import streambatch.order.plan as planning
from streambatch import ConfigError
from streambatch.cli import main
from streambatch.errors import StoreError
from streambatch.io.keyed_file import block_digest
from streambatch.io.store import write_store
from streambatch.order.plan import plan_path
from streambatch.order.splitmix import derive_seed
from tests import keyed
from tests.strategies import configs, documents


def _docs(count: int = 12) -> list[sb.Document]:
    return [sb.Document(f"d{i}", "train", np.arange(i * 3 + 5, dtype=np.uint32) % 97) for i in range(count)]


def _windows(docs: Any = None, **config: Any) -> sb.Windows:
    return sb.windows(_docs() if docs is None else docs, **({"context_length": 2} | config))


def _no_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a plan was computed although the plan file exists")

    monkeypatch.setattr(planning, "_write_plan", refuse)


@given(documents(), configs, st.integers(0, 2**64 - 1))
def test_plan_file_gives_the_batches_of_shuffle(docs: list[sb.Document], config: dict[str, int], seed: int) -> None:
    """With a plan file the epoch is batch for batch, and state for state, the epoch without one; reopening too."""
    expected = sb.Epoch(docs, seed=seed, **config)
    with tempfile.TemporaryDirectory() as plans:
        first = sb.Epoch(docs, seed=seed, plan_dir=plans, **config)
        assert list(expected) == list(first)
        assert expected.shuffle_state_after == first.shuffle_state_after
        again = sb.Epoch(docs, seed=seed, plan_dir=plans, **config)
        assert list(expected) == list(again)
        assert first.order.plan_path == again.order.plan_path
        assert 1 == len(list(Path(plans).glob("*.plan")))


def test_stage_and_epoch_share_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sb.plan_file is the stage Epoch(plan_dir=...) runs; once written, the file is mapped, never recomputed."""
    order = sb.plan_file(_windows(), 5, tmp_path)
    assert list(sb.shuffle(_windows(), 5)) == list(order)
    assert str(plan_path(_windows(), 5, tmp_path)) == order.plan_path
    assert isinstance(order.plan, np.ndarray)
    assert isinstance(order.plan.base, np.memmap)
    assert not order.plan.flags.writeable
    _no_planning(monkeypatch)
    epoch = sb.Epoch(_docs(), context_length=2, batch_size=4, seed=5, plan_dir=tmp_path)
    assert order.plan_path == epoch.order.plan_path
    assert list(sb.Epoch(_docs(), context_length=2, batch_size=4, seed=5)) == list(epoch)


def test_in_memory_and_on_disk_stores_share_a_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-memory store is keyed by its content fingerprint: the one write_store records for the same documents."""
    memory = sb.DocumentStore.from_documents(_docs())
    disk = write_store(tmp_path / "store", _docs())
    assert disk.fingerprint == memory.content_fingerprint()
    planned = sb.plan_file(sb.windows(memory, context_length=3), 9, tmp_path / "plans")
    _no_planning(monkeypatch)
    assert planned.plan_path == sb.plan_file(sb.windows(disk, context_length=3), 9, tmp_path / "plans").plan_path


def test_header_records_key_count_dtype_and_state(tmp_path: Path) -> None:
    """The JSON header holds the full key, the window count, the dtype, state_after and one digest per block."""
    order = sb.plan_file(_windows(), 7, tmp_path)
    header = keyed.header(Path(str(order.plan_path)))
    assert {"format": "streambatch.plan", "version": 2, "key": planning.plan_key(_windows(), 7)} == {
        k: header[k] for k in ("format", "version", "key")
    }
    assert (len(order), "<u4", order.shuffle_state_after) == (
        header["key"]["windows"],
        header["key"]["dtype"],
        header["state_after"],
    )
    ((dtype, entries, offset),) = keyed.sections(Path(str(order.plan_path))).values()
    table_at, blocks, _ = header["digests"]
    assert ("<u4", len(order), 1) == (dtype, entries, blocks)
    assert offset + 4 * len(order) <= table_at
    assert table_at + 16 == os.path.getsize(str(order.plan_path))
    body = Path(str(order.plan_path)).read_bytes()[offset : offset + 4 * len(order)]
    assert block_digest(body, 0) == Path(str(order.plan_path)).read_bytes()[table_at:]


def _foreign_copy(tmp_path: Path, other: sb.Windows, other_seed: int) -> Path:
    """Write the plan of (_windows(), seed 7) under the file name of (*other*, *other_seed*)."""
    source = Path(str(sb.plan_file(_windows(), 7, tmp_path / "a").plan_path))
    target = plan_path(other, other_seed, tmp_path / "b")
    target.parent.mkdir()
    shutil.copyfile(source, target)
    return target


@pytest.mark.parametrize(
    ("other", "seed", "message"),
    [
        (lambda: _windows(), 8, r"seed=7 \(expected 8\)"),
        (lambda: _windows(context_length=3), 7, r"context_length=2 \(expected 3\)"),
        (lambda: _windows(stride=2), 7, r"stride=1 \(expected 2\)"),
        (lambda: _windows([*_docs()[:-1], sb.Document("d11", "train", np.arange(38) * 7 % 97)]), 7, r"corpus='blake2b-256:"),
        (lambda: _windows(partition="test", docs=[sb.Document(d.id, "test", d.tokens) for d in _docs()]), 7, "partition="),
    ],
    ids=["other-seed", "other-context-length", "other-stride", "other-corpus", "other-partition"],
)
def test_foreign_plan_is_refused(tmp_path: Path, other: Any, seed: int, message: str) -> None:
    """A plan file whose header key differs from the expected key is refused with the differing fields, never used."""
    windows = other()
    _foreign_copy(tmp_path, windows, seed)
    with pytest.raises(StoreError, match=f"a plan for another key: .*{message}.*stale or foreign; remove"):
        sb.plan_file(windows, seed, tmp_path / "b")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-4], "truncated"),
        (lambda b: b[:100], "truncated within its header"),
        (lambda b: b + b"\0\0\0\0", "longer than its header says"),
        (lambda b: b"x" + b[1:], "not a streambatch plan, packing or mixture plan file"),
        (lambda b: b.replace(b'"version": 2', b'"version": 9'), "its header does not match its digest"),
        (lambda b: b.replace(b'"state_after": ', b'"state_after":-'), "its header does not match its digest"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "its table of block digests does not match the header"),
        (lambda b: b"{" + b[1:], "an earlier layout .*without block digests.*plan again"),
    ],
    ids=["truncated", "header-only", "extended", "garbage", "version", "state", "table", "old-layout"],
)
def test_damaged_plan_is_refused(tmp_path: Path, damage: Any, message: str) -> None:
    """Truncated, extended or corrupted plan files raise StoreError naming the file and the fix."""
    path = Path(str(sb.plan_file(_windows(), 7, tmp_path).plan_path))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StoreError, match=message):
        sb.plan_file(_windows(), 7, tmp_path)


def test_failure_before_rename_leaves_no_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while planning (here at the rename) leaves no plan file and no temporary file."""

    def crash(*args: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(planning.os, "replace", crash)
    with pytest.raises(StoreError, match=r"plan_dir=.*cannot write the plan there \(disk gone\); pass a writable folder"):
        sb.plan_file(_windows(), 7, tmp_path)
    assert [] == [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")]


_KILLED_PLANNER = """
import os, signal, sys
import streambatch as sb, streambatch.order.plan as planning
planning.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die just before the rename
docs = [sb.Document(f"d{i}", "train", list(range(i * 3 + 5))) for i in range(12)]
sb.plan_file(sb.windows(docs, context_length=2), 7, sys.argv[1])
"""


@pytest.mark.slow
def test_killed_planner_leaves_no_plan(tmp_path: Path) -> None:
    """A planner killed before its rename leaves only a temporary file: never taken for a plan, removed by the next."""
    done = subprocess.run([sys.executable, "-c", _KILLED_PLANNER, str(tmp_path)], check=False)
    assert -signal.SIGKILL == done.returncode
    assert [] == list(tmp_path.glob("*.plan"))
    assert 1 == len(list(tmp_path.glob(".*.partial-*")))
    docs = [sb.Document(f"d{i}", "train", list(range(i * 3 + 5))) for i in range(12)]
    order = sb.plan_file(sb.windows(docs, context_length=2), 7, tmp_path)
    assert list(sb.shuffle(sb.windows(docs, context_length=2), 7)) == list(order)
    assert [] == list(tmp_path.glob(".*.partial-*"))


def _planner(plans: str, log: str, barrier: Any, results: Any) -> None:
    original = planning._write_plan

    def logged(*args: Any) -> None:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # hold the lock long enough for the other planner to arrive and wait
        original(*args)

    planning._write_plan = logged  # type: ignore[assignment]
    barrier.wait()
    order = sb.plan_file(_windows(_docs(40)), 3, plans)
    results.put((order.plan_path, order.shuffle_state_after, order.numbers().tolist()))


@pytest.mark.slow
def test_lock_serializes_concurrent_planners(tmp_path: Path) -> None:
    """Two processes planning the same key together: exactly one computes, both map the same plan."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    log = tmp_path / "computed.log"
    workers = [context.Process(target=_planner, args=(str(tmp_path / "plans"), str(log), barrier, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    got = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [0, 0] == [w.exitcode for w in workers]
    assert 1 == len(log.read_text().splitlines())
    assert got[0] == got[1]
    assert list(sb.shuffle(_windows(_docs(40)), 3)) == got[0][2]


def test_pickled_epoch_maps_the_plan_file_again(tmp_path: Path) -> None:
    """A pickled epoch (store and plan memory-mapped) carries file names, not bytes; unpickled it maps the same files."""
    docs = [sb.Document(f"d{i}", "train", np.arange(3000, dtype=np.uint32) % 300) for i in range(20)]
    store = write_store(tmp_path / "store", docs)
    epoch = sb.Epoch(store, context_length=4, batch_size=16, seed=3, plan_dir=tmp_path / "plans")
    assert epoch.plan_nbytes == 4 * epoch.window_count
    chunk = epoch.chunks()[2]
    payload = pickle.dumps(epoch)
    assert len(payload) < epoch.plan_nbytes / 10
    assert len(pickle.dumps(chunk)) < epoch.plan_nbytes / 10
    twin = pickle.loads(payload)
    assert epoch.order.plan_path == twin.order.plan_path
    assert isinstance(twin.order.plan.base, np.memmap)
    assert list(epoch) == list(twin)
    assert list(chunk) == list(pickle.loads(pickle.dumps(chunk)))


def test_window_number_plans_in_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources of 2**32+ tokens keep window numbers in the file (4 bytes each); keyed apart from position plans."""
    expected = list(sb.Epoch(_docs(), context_length=2, batch_size=4, seed=5))
    positions = plan_path(_windows(), 5, tmp_path)
    monkeypatch.setattr(windowing, "POSITION_LIMIT", 10)
    epoch = sb.Epoch(_docs(), context_length=2, batch_size=4, seed=5, plan_dir=tmp_path)
    assert not epoch.order.space.plan_holds_positions
    assert "window_numbers" == planning.plan_key(epoch.items, 5)["holds"]
    assert positions != Path(str(epoch.order.plan_path))
    assert (np.uint32, 4 * epoch.window_count) == (epoch.order.plan.dtype, epoch.plan_nbytes)
    assert expected == list(epoch)


def test_plan_file_orders_whole_sources_only(tmp_path: Path) -> None:
    """A view or an already ordered Windows is refused: a plan file orders every window of a source."""
    with pytest.raises(ConfigError, match="a view or already ordered"):
        sb.plan_file(_windows()[2:], 1, tmp_path)
    with pytest.raises(ConfigError, match="a view or already ordered"):
        sb.plan_file(sb.shuffle(_windows(), 1), 1, tmp_path)
    with pytest.raises(ConfigError, match=r"seed=-1 must be an int"):
        sb.plan_file(_windows(), -1, tmp_path)
    with pytest.raises(ConfigError, match=r"plan_dir=3 is not a folder path"):
        sb.Epoch(_docs(), context_length=2, batch_size=4, seed=1, plan_dir=3)  # type: ignore[arg-type]


def test_cli_plan_then_epochs_map_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`streambatch plan --seed R --epoch E` writes the plan that Epoch(seed=derive_seed(R, E)) maps; a rerun reuses it."""
    write_store(tmp_path / "store", _docs())
    argv = ["plan", str(tmp_path / "store"), "-T", "2", "-B", "4", "--seed", "7", "--epoch", "2", "-o", str(tmp_path / "p")]
    assert 0 == main(argv)
    summary = json.loads(capsys.readouterr().out)
    assert (True, derive_seed(7, 2), 59) == (summary["created"], summary["shuffle_seed"], summary["batches"])
    header = keyed.header(Path(summary["plan"]))
    assert {"seed": 7, "epoch": 2} == header["run"]
    _no_planning(monkeypatch)
    assert 0 == main(argv)
    assert not json.loads(capsys.readouterr().out)["created"]
    store = sb.open_store(tmp_path / "store")
    epoch = sb.Epoch(store, context_length=2, batch_size=4, seed=derive_seed(7, 2), plan_dir=tmp_path / "p")
    assert summary["plan"] == epoch.order.plan_path
    assert summary["state_after"] == epoch.shuffle_state_after


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seed", "-1"], "seed=-1 must be an int"),
        (["--seed", "1", "--epoch", "-2"], "epoch=-2 must be a non-negative int"),
        (["--seed", "1", "-B", "0"], "batch_size=0 must be a positive int"),
    ],
    ids=["seed", "epoch", "batch-size"],
)
def test_cli_plan_errors(tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad plan arguments: one line on stderr, exit 2, no plan written."""
    write_store(tmp_path / "store", _docs())
    assert 2 == main(["plan", str(tmp_path / "store"), "-T", "2", "-B", "4", *argv, "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert 1 == len(err.splitlines())
    assert message in err
    assert [] == list(tmp_path.glob("p/*.plan"))
