"""-o outputs: atomic replacement, FIFOs, devices, symlinks, permissions and temporaries of dead writers."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.io.atomic import atomic_text
from streambatch.io.store import INLINE_DOCUMENTS, write_store
from tests.hostile import ENV, EPOCH, GOOD, dead_pid, jsonl_file


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_permissions_follow_the_umask(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under umask 022 store directories are 0755, store files and -o outputs 0644 (077: 0700 / 0600)."""
    source = jsonl_file(tmp_path, GOOD)
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
    source = jsonl_file(tmp_path, GOOD)
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
    assert 0 == main(["epoch", str(jsonl_file(tmp_path, GOOD)), *EPOCH, "-o", os.devnull])
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.slow
def test_output_to_dev_stdout_appends_to_a_redirected_log(tmp_path: Path) -> None:
    """-o /dev/stdout writes to the open descriptor: a `>>` log is appended to, not truncated or replaced."""
    log = tmp_path / "log.jsonl"
    log.write_text("earlier\n")
    source = jsonl_file(tmp_path, GOOD)
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
    source = jsonl_file(tmp_path, GOOD)
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


@pytest.mark.slow
def test_output_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """.streambatch-PID-*.tmp of a dead pid is removed by the next -o write into the folder; a live one is kept."""
    dead = tmp_path / f".streambatch-{dead_pid()}-0000.tmp"
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
        assert 2 == main(["epoch", str(jsonl_file(tmp_path, GOOD)), *EPOCH, "-o", str(folder / "out.jsonl")])
    finally:
        folder.chmod(0o700)
    err = capsys.readouterr().err
    assert "ro/out.jsonl" in err
    assert ".streambatch-" not in err


def test_output_to_a_fifo_waits_for_its_reader(tmp_path: Path) -> None:
    """-o a FIFO whose reader comes late: the writer waits for it (nothing opens the read end behind its back)."""
    source = jsonl_file(tmp_path, GOOD)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    status: list[int] = []
    writer = threading.Thread(target=lambda: status.append(main(["epoch", str(source), *EPOCH, "-o", str(fifo)])))
    writer.start()
    time.sleep(0.5)  # the writer is blocked in open() until a reader comes
    assert writer.is_alive()
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    received = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                block = os.read(fd, 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not block and not writer.is_alive():
                break
            received += block
            if not block:
                time.sleep(0.01)
    finally:
        os.close(fd)
        writer.join(timeout=30)
    assert [0] == status
    assert 2 == len(received.decode().splitlines())
