"""Atomic store replacement: a write killed at every step, readers and writers racing, stale temporaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
import streambatch.io.replace as replace_module
import streambatch.io.store_reader as reader_module
import streambatch.io.store_writer as writer_module
from streambatch.io.store import StoreWriter, open_store, write_store
from tests.hostile import ENV, dead_pid, small_store, temporaries

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
    import streambatch.io.replace as replace
    import streambatch.io.store_writer as store
    target, kill_at, kind, fallback = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    if fallback:
        replace._renameat2_function = None
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
    small_store(tmp_path / "count")
    with monkeypatch.context() as patch:
        patch.setattr(writer_module, "step_hook", names.append)
        if fallback:
            patch.setattr(replace_module, "_renameat2_function", None)
        _write_new(tmp_path / "count", kind)
    return names


@pytest.mark.slow
@pytest.mark.skipif(replace_module._renameat2_function is None, reason="renameat2 is not available here")
@pytest.mark.parametrize("kind", ["inline", "files"])
def test_replace_killed_at_every_step(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replacing write killed at each step: the target is the old store or the new one; a later writer cleans up."""
    steps = _steps(tmp_path, kind, False, monkeypatch)
    assert {"add", "finish", "fsync", "header", "replace", "exchanged", "removed"} <= set(steps)
    target = tmp_path / "s"
    new = _write_new(tmp_path / "reference", kind).fingerprint
    seen = []
    for kill_at in range(len(steps) + 1):
        old = small_store(target).fingerprint
        script = _KILL_AT + _CONTENT + "\nwrite_new(target, kind)\n"
        done = subprocess.run([sys.executable, "-c", script, str(target), str(kill_at), kind, "0"], env=ENV, capture_output=True)
        assert (9 if kill_at < len(steps) else 0) == done.returncode, done.stderr.decode()[-2000:]
        opened = open_store(target).fingerprint
        assert opened in {old, new}, f"killed before step {kill_at}"
        seen.append(opened == new)
        if kill_at < len(steps) and steps[kill_at] in {"exchanged"}:
            assert temporaries(tmp_path, "s"), "the exchanged-out old store should be left for the next writer"
        small_store(target)  # the next writer removes what the dead one left
        assert [] == temporaries(tmp_path, "s")
    swapped = steps.index("exchanged")  # the hook of this step runs right after the exchange
    assert [k >= swapped for k in range(len(steps) + 1)] == seen


@pytest.mark.slow
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
        old = small_store(target).fingerprint
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
            patch.setattr(replace_module, "_renameat2_function", None)
            small_store(target)
        assert [] == temporaries(tmp_path, "s")


def test_open_retries_when_its_version_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replace that removes the version being opened makes open_store start over on the new one."""
    target = tmp_path / "s"
    small_store(target)
    new = _write_new(tmp_path / "reference", "files").fingerprint
    real = reader_module.open_store_at
    calls: list[int] = []

    def racing(dfd: int, root: Path, verify: bool) -> sb.DocumentStore:
        calls.append(dfd)
        if len(calls) == 1:
            monkeypatch.setattr(reader_module, "open_store_at", real)
            _write_new(target, "files")  # exchanged out and deleted under the open directory fd
            monkeypatch.setattr(reader_module, "open_store_at", racing)
        return real(dfd, root, verify)

    monkeypatch.setattr(reader_module, "open_store_at", racing)
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


@pytest.mark.slow
def test_readers_see_old_or_new_while_a_writer_replaces(tmp_path: Path) -> None:
    """One process replaces a store in a loop; this one opens and iterates it meanwhile: zero errors."""
    target = tmp_path / "s"
    contents = _contents()
    expected = {}
    for name, docs in contents.items():
        fingerprint = write_store(tmp_path / name, docs).fingerprint
        expected[fingerprint] = list(sb.Epoch(docs, context_length=2, batch_size=3, seed=None))
    write_store(target, contents["a"])
    writer = subprocess.Popen(
        [sys.executable, "-c", _LOOP_WRITER, str(target), "2.5", "both"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    opened: dict[str, int] = {}
    try:
        while writer.poll() is None:
            store = open_store(target)
            assert store.fingerprint in expected
            assert expected[store.fingerprint] == list(sb.Epoch(store, context_length=2, batch_size=3, seed=None))
            opened[store.fingerprint] = opened.get(store.fingerprint, 0) + 1
    finally:
        out, err = writer.communicate(timeout=60)
    assert 0 == writer.returncode, err.decode()[-2000:]
    assert int(out) >= 4, "the writer should have replaced the store several times"
    assert 2 == len(opened), opened
    assert [] == temporaries(tmp_path, "s")


@pytest.mark.slow
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
    assert [] == temporaries(tmp_path, "s")


def test_writer_returns_its_own_store_even_when_replaced_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """commit's store is the one it wrote, even if another writer replaces it before commit returns."""
    target = tmp_path / "s"
    small_store(target)
    mine = _write_new(tmp_path / "reference", "inline")

    def replace_then(name: str) -> None:
        if name == "removed":
            monkeypatch.setattr(writer_module, "step_hook", None)
            write_store(target, [sb.Document("other", "train", [9])])

    monkeypatch.setattr(writer_module, "step_hook", replace_then)
    got = _write_new(target, "inline")
    assert mine.fingerprint == got.fingerprint
    assert list(mine) == list(got)
    assert ("other",) == open_store(target).ids


@pytest.mark.slow
def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """partial and old directories of a dead pid are removed by the next writer; a live pid's are kept."""
    dead, alive = dead_pid(), os.getpid()
    names = [f".s.partial-{dead}-aaaa", f".s.old-{dead}-bbbb", f".s.partial-{alive}-cccc", ".s.old-legacy", ".other.partial-1-x"]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokens.bin").write_bytes(b"\0" * 10)
    small_store(tmp_path / "s")
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
    small_store(real)
    (tmp_path / "link").symlink_to(real)
    write_store(tmp_path / "link", [sb.Document("new", "train", [1])])
    assert (tmp_path / "link").is_symlink()
    assert ("new",) == open_store(real).ids == open_store(tmp_path / "link").ids
