"""Issue 18, item 1: `epoch -o F --save-state/--resume` can never lose or silently corrupt data.

Every attack goes through the CLI: a second writer on a locked output, a resume
after the output was overwritten, each field of the state edited, an output that
is the input or a file of a store, and state files that are devices, folders or
inside the source.  Each refusal is exit 2, one line, and nothing changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
import streambatch.cli.epoch as cli_epoch
from streambatch.cli import main
from streambatch.io.store import write_store
from streambatch.read.jsonl import read_jsonl
from tests.hostile import ENV

ARGS = ["-T", "3", "-B", "2", "--seed", "11"]


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    path = tmp_path / "in.jsonl"
    lines = [
        {"id": f"d{i}", "partition": "train", "tokens": rng.integers(0, 900, int(rng.integers(4, 16))).tolist()}
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _reference(source: Path, tmp_path: Path, epoch: int = 0) -> bytes:
    reference = tmp_path / f"reference-{epoch}.jsonl"
    assert (0, "") == _run(["epoch", str(source), *ARGS, "--epoch", str(epoch), "-o", str(reference)])
    return reference.read_bytes()


def _interrupted(source: Path, out: Path, state: Path, monkeypatch: pytest.MonkeyPatch, after: int = 6) -> None:
    """Run epoch 0 with --save-state and stop it (KeyboardInterrupt) when the state is saved for the *after*-th time."""
    real, calls = cli_epoch.atomic_text, []

    def stop(target: Any) -> Any:
        calls.append(target)
        if len(calls) == after:
            raise KeyboardInterrupt
        return real(target)

    with monkeypatch.context() as patch:
        patch.setattr(cli_epoch, "atomic_text", stop)
        assert 130 == _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)])[0]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], message: str, *kept: Path) -> None:
    """*argv* exits 2 with one line matching *message*, and every file of *kept* is byte for byte as before."""
    before = [p.read_bytes() if p.exists() else None for p in kept]
    capsys.readouterr()
    status, text = _run(argv)
    err = capsys.readouterr().err
    assert (2, "") == (status, text), err
    assert 1 == len(err.splitlines()), err
    assert re.search(message, err), err
    assert before == [p.read_bytes() if p.exists() else None for p in kept]


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """Hold the output's lock as a running `epoch --save-state` does (another open file description)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_a_second_writer_is_refused_while_the_output_is_locked(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While a writer holds F, a second `-o F --save-state`, `--resume` or plain `-o F` exits 2 and touches nothing."""
    out, state, other = tmp_path / "out.jsonl", tmp_path / "state.json", tmp_path / "other.json"
    assert 0 == _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)])[0]
    message = r"--output .*out\.jsonl: another streambatch epoch is writing it"
    with _held(out):
        _refused(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(other)], capsys, message, out, state, other)
        _refused(["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state)], capsys, message, out, state)
        _refused(["epoch", str(source), *ARGS, "--epoch", "1", "-o", str(out)], capsys, message, out)
    assert not other.exists()
    assert [] == list(tmp_path.glob(".streambatch-*"))


_RACER = "import sys; from streambatch.cli import main; sys.stdin.readline(); raise SystemExit(main(sys.argv[1:]))"


@pytest.mark.slow
def test_two_concurrent_writers_one_is_refused_the_other_completes(source: Path, tmp_path: Path) -> None:
    """Two real processes on one output: the second exits 2 while the first runs; the first's output is exact."""
    big = tmp_path / "big.jsonl"
    rng = np.random.default_rng(1)
    big.write_text("".join(json.dumps({"id": f"d{i}", "tokens": rng.integers(0, 9, 40).tolist()}) + "\n" for i in range(20)))
    out, first, second = tmp_path / "out.jsonl", tmp_path / "first.json", tmp_path / "second.json"
    argv = ["epoch", str(big), "-T", "3", "-B", "1", "--seed", "2", "-o", str(out)]
    # the racer imports streambatch first and starts on a line from stdin, so it races the writer, not its start-up
    racer = subprocess.Popen(
        [sys.executable, "-c", _RACER, *argv, "--save-state", str(second)],
        env=ENV,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = subprocess.Popen([sys.executable, "-m", "streambatch", *argv, "--save-state", str(first)], env=ENV)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (first.exists() and json.loads(first.read_text())["output"]["batches"] >= 3):
        time.sleep(0.005)
    assert child.poll() is None, "the writer finished before the race"
    _, racer_err = racer.communicate("go\n", timeout=120)
    assert 0 == child.wait(timeout=120)
    assert 2 == racer.returncode, racer_err
    assert "another streambatch epoch is writing it" in racer_err
    assert not second.exists()
    expected = sb.Epoch(read_jsonl(big), context_length=3, batch_size=1, seed=2)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert list(range(len(expected))) == [r["index"] for r in records]
    assert [b.inputs.tolist() for b in expected] == [r["inputs"] for r in records]
    assert b"\0" not in out.read_bytes()
    saved = json.loads(first.read_text())["output"]
    assert (out.stat().st_size, len(records)) == (saved["bytes"], saved["batches"])


@pytest.mark.parametrize("finished", [False, True])
def test_resume_after_the_output_was_overwritten_by_another_epoch(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, finished: bool
) -> None:
    """The output replaced by epoch 1 (as long or longer than what the state recorded): --resume exits 2, cuts nothing."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    if finished:
        assert 0 == _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)])[0]
    else:
        _interrupted(source, out, state, monkeypatch)
    assert 0 == _run(["epoch", str(source), *ARGS, "--epoch", "1", "-o", str(out)])[0]
    assert out.stat().st_size >= json.loads(state.read_text())["output"]["bytes"]
    message = r"state\.json: output .*out\.jsonl does not hold the \d+ batches the state recorded"
    _refused(["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state)], capsys, message, out, state)


def _edit(field: str, change: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
    section, key = field.split(".") if "." in field else ("", field)

    def edit(saved: dict[str, Any]) -> None:
        place = saved[section] if section else saved
        place[key] = change(place[key])

    return edit


def _cut_digest(saved: dict[str, Any], out: Path, length: int) -> None:
    """A forged state: bytes and digest consistent with a cut *length* bytes in, mid-record."""
    saved["output"]["bytes"] = length
    saved["output"]["digest"] = hashlib.blake2b(out.read_bytes()[:length], digest_size=32).hexdigest()


EDITS: dict[str, tuple[Callable[[dict[str, Any], Path], None], str]] = {
    "run.batch+3": (lambda s, o: _edit("run.batch", lambda v: v + 3)(s), "disagree for epoch 0"),
    "run.batch-3": (lambda s, o: _edit("run.batch", lambda v: v - 3)(s), "disagree for epoch 0"),
    "output.bytes-10": (lambda s, o: _edit("output.bytes", lambda v: v - 10)(s), "does not hold the 4 batches"),
    "output.batches=1e9": (lambda s, o: _edit("output.batches", lambda v: 10**9)(s), "disagree for epoch 0"),
    "output.batches+1": (lambda s, o: _edit("output.batches", lambda v: v + 1)(s), "disagree for epoch 0"),
    "output.first+1": (lambda s, o: _edit("output.first", lambda v: v + 1)(s), "disagree for epoch 0"),
    "output.digest": (lambda s, o: _edit("output.digest", lambda v: "0" * 64)(s), "does not hold the 4 batches"),
    "output.path": (lambda s, o: _edit("output.path", lambda v: v + ".other")(s), "the state belongs to output"),
    "epoch": (lambda s, o: _edit("epoch", lambda v: v + 1)(s), "disagree for epoch 1"),
    "run.seed": (lambda s, o: _edit("run.seed", lambda v: v + 1)(s), "state seed=12 but this run has seed=11"),
    "cut-mid-record": (lambda s, o: _cut_digest(s, o, s["output"]["bytes"] - 10), "does not hold the 4 batches"),
    "cut-and-count": (
        lambda s, o: (_cut_digest(s, o, s["output"]["bytes"] - 10), _edit("output.batches", lambda v: v - 1)(s)),
        "disagree for epoch 0",
    ),
    "epoch-and-run-epoch": (
        lambda s, o: (_edit("epoch", lambda v: v + 1)(s), _edit("run.epoch", lambda v: v + 1)(s)),
        r"does not hold batches 0\.\.3 of epoch 1 as the state says",
    ),
    "shifted-window": (
        lambda s, o: (
            _edit("output.first", lambda v: v + 1)(s),
            _edit("run.batch", lambda v: v + 1)(s),
        ),
        r"does not hold batches 1\.\.4 of epoch 0 as the state says",
    ),
}


@pytest.mark.parametrize("attack", list(EDITS))
def test_each_edited_state_field_is_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    """A run stopped after 4 batches; its state edited one way: --resume exits 2, the output and state unchanged."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    _interrupted(source, out, state, monkeypatch)  # saves: the start, then batches 0..3
    saved = json.loads(state.read_text())
    assert (4, 4) == (saved["output"]["batches"], saved["run"]["batch"])
    change, message = EDITS[attack]
    change(saved, out)
    state.write_text(json.dumps(saved))
    _refused(["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state)], capsys, message, out, state)


def test_an_unedited_resume_still_completes_exactly(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the attacks above: the same stopped run resumed with its own state gives the reference output."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    _interrupted(source, out, state, monkeypatch)
    assert (0, "") == _run(["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state)])
    assert _reference(source, tmp_path) == out.read_bytes()


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    write_store(path, [sb.Document(f"d{i}", "train", np.arange(10 + i) % 7) for i in range(4)])
    return path


@pytest.mark.parametrize("target", ["input", "hardlink", "symlink", "store-file", "store-new-file", "manifest-shard"])
@pytest.mark.parametrize("state", [False, True])
def test_an_output_that_is_the_input_or_a_file_of_a_source_is_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, state: bool
) -> None:
    """-o naming the input (by device and inode: also a hard or symbolic link) or a file of a store: exit 2, intact."""
    store = _store(tmp_path)
    given, output = source, source
    if target == "hardlink":
        output = tmp_path / "hard.jsonl"
        os.link(source, output)
    elif target == "symlink":
        output = tmp_path / "soft.jsonl"
        output.symlink_to(source)
    elif target in ("store-file", "store-new-file"):
        given, output = store, store / ("tokens.bin" if target == "store-file" else "out.jsonl")
    elif target == "manifest-shard":
        manifest = tmp_path / "corpus.json"
        manifest.write_text(json.dumps({"format": "streambatch.corpus", "version": 1, "shards": ["store"]}))
        given, output = manifest, store / "offsets.bin"
    files = [p for p in [source, *store.iterdir()] if p.is_file()]
    extra = ["--save-state", str(tmp_path / "state.json")] if state else []
    message = r"--output .*: is the input .* or a file inside it; writing there would destroy the source"
    _refused(["epoch", str(given), *ARGS, "-o", str(output), *extra], capsys, message, *files)
    assert not (store / "out.jsonl").exists()
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("devnull", r"--save-state/--resume /dev/null: not a regular file"),
        ("folder", r"state-dir: not a regular file"),
        ("fifo", r"fifo: not a regular file"),
        ("in-store", r"--save-state .*store/state\.json: is the source .* or a file inside it"),
        ("store-file", r"--save-state .*store/header\.json: is the source .* or a file inside it"),
        ("input", r"--save-state .*in\.jsonl: is the source .* or a file inside it"),
        ("hardlink-of-output", r"is the --output file; keep the state in a file of its own"),
        ("output-folder", r"output .*out-dir' is a directory"),
    ],
)
def test_state_files_that_are_not_files_of_their_own_are_refused(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, message: str
) -> None:
    """--save-state /dev/null, a folder, a FIFO, inside a store, the input, the output again; -o a folder: exit 2."""
    store = _store(tmp_path)
    given, out = source, tmp_path / "out.jsonl"
    out.write_text("kept\n")
    paths = {
        "devnull": Path(os.devnull),
        "folder": tmp_path / "state-dir",
        "fifo": tmp_path / "fifo",
        "in-store": store / "state.json",
        "store-file": store / "header.json",
        "input": source,
        "hardlink-of-output": tmp_path / "hard.json",
        "output-folder": tmp_path / "out-dir" / "state.json",
    }
    state = paths[where]
    if where == "folder":
        state.mkdir()
    elif where == "fifo":
        os.mkfifo(state)
    elif where == "hardlink-of-output":
        os.link(out, state)
    elif where == "output-folder":
        out = tmp_path / "out-dir"
        out.mkdir()
    if where in ("in-store", "store-file"):
        given = store
    files = [p for p in [source, *store.iterdir()] if p.is_file()] + ([out] if out.is_file() else [])
    _refused(["epoch", str(given), *ARGS, "-o", str(out), "--save-state", str(state)], capsys, message, *files)
    assert not (store / "state.json").exists()
    assert [] == list((tmp_path / "out-dir").iterdir()) if (tmp_path / "out-dir").exists() else True


def test_resume_and_save_state_must_name_one_file(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--resume A --save-state B would read one state and write another: refused."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert 0 == _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)])[0]
    argv = ["epoch", str(source), *ARGS, "-o", str(out), "--resume", str(state), "--save-state", str(tmp_path / "b.json")]
    _refused(argv, capsys, r"--resume STATE saves to STATE again; drop --save-state", out, state)


def test_an_output_replaced_during_the_run_is_an_error_not_a_success(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program renames a file over -o while the run writes: exit 2 naming it, never exit 0 with the batches lost."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    real, calls = cli_epoch.atomic_text, []

    def replaced(target: Any) -> Any:
        calls.append(target)
        if len(calls) == 3:  # after batch 1: a writer that ignores the lock replaces the output
            (tmp_path / "other").write_text("another program's file\n")
            os.replace(tmp_path / "other", out)
        return real(target)

    monkeypatch.setattr(cli_epoch, "atomic_text", replaced)
    capsys.readouterr()
    assert (2, "") == _run(["epoch", str(source), *ARGS, "-o", str(out), "--save-state", str(state)])
    err = capsys.readouterr().err
    assert 1 == len(err.splitlines())
    assert re.search(r"--output .*out\.jsonl: replaced by another process during the run", err), err
    assert "another program's file\n" == out.read_text()
