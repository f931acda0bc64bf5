"""SIGTERM cleans up as Ctrl-C does: no temporary beside an ``epoch -o`` output, no ``prepare`` worker left alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch._signals import stops_deferred, terminate_as_interrupt
from streambatch.errors import Terminated
from streambatch.read.workers import available_cpus

from .hostile import ENV
from .test_hostile_hangs import TIMEOUT, _finish, _start_prepare, _state


def _children(parent: int) -> list[int]:
    """Every process whose parent is *parent* (read from /proc: psutil may not be installed)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) != "Z"]


def _terminated_in_block() -> None:
    with terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted at once


def _terminated_while_deferred(reached: list[str]) -> None:
    with terminate_as_interrupt():
        with stops_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("end of block")
        reached.append("after")  # never: delivered at the end of the block


def test_sigterm_raises_terminated_inside_the_block_only() -> None:
    """In the block SIGTERM is a `Terminated` (a KeyboardInterrupt); after it, the previous handler is back."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        _terminated_in_block()
    assert issubclass(Terminated, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) == before


def test_stops_are_deferred_to_the_end_of_the_block() -> None:
    """A SIGTERM while a worker starts is delivered when the block ends, not lost."""
    reached: list[str] = []
    with pytest.raises(Terminated):
        _terminated_while_deferred(reached)
    assert reached == ["end of block"]


def test_sigterm_during_epoch_output_leaves_no_temporary(tmp_path: Path) -> None:
    """``epoch -o F`` killed by SIGTERM mid-write: exit 143, one line, no ``.streambatch-PID.tmp``, no F."""
    store = tmp_path / "store"
    sb.write_store(store, [sb.Document(f"d{i}", "train", np.arange(200_000) % 500) for i in range(40)])
    out = tmp_path / "out.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambatch",
            "epoch",
            str(store),
            "-T",
            "64",
            "--stride",
            "64",
            "-B",
            "32",
            "--seed",
            "1",
            "-o",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        temporaries = list(tmp_path.glob(".streambatch-*.tmp"))
        if temporaries and temporaries[0].stat().st_size > 1 << 20:
            break
        time.sleep(0.01)
    assert process.poll() is None, "the epoch finished before it could be killed"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=TIMEOUT)
    assert (process.returncode, err) == (128 + signal.SIGTERM, "streambatch: terminated\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


@pytest.mark.skipif(available_cpus() < 2, reason="--workers 2 is capped at one CPU here")
def test_sigterm_during_prepare_workers_stops_every_child(tmp_path: Path) -> None:
    """``prepare --workers 2`` killed by SIGTERM (the main process only): exit 143, one line, no store, and none
    of its children (workers, resource tracker) alive 3 s later."""
    process, workers, out = _start_prepare(tmp_path)
    assert workers, "no worker process appeared"
    children = _children(process.pid)
    os.kill(process.pid, signal.SIGTERM)
    code, err = _finish(process)
    assert (code, err) == (128 + signal.SIGTERM, "streambatch: terminated\n")
    assert not out.exists()
    deadline = time.monotonic() + 3
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(children)
    assert not list(tmp_path.glob(".out*"))
