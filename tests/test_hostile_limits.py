"""Resource limits and messages: 10**4 shards under ``ulimit -n 1024``, write failures that name the path,
stale temporaries whose pid overflows ``os.kill``, NUL bytes in paths, and short paths in messages."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import ConfigError, StoreError
from streambatch.io.atomic import atomic_file, atomic_text
from streambatch.io.files import LONG_PATH, short_path
from streambatch.io.manifest import open_corpus, write_corpus

from .hostile import ENV, EPOCH, small_store

SHARDS = """
import json, os, resource, sys
import numpy as np
from pathlib import Path
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
import streambatch as sb
from streambatch.io.store_header import fingerprint_files
root, count = Path(sys.argv[1]), int(sys.argv[2])
template = root / "template"
sb.write_store(template, [sb.Document("t", "train", range(8))])
header = json.loads((template / "header.json").read_text())
codes = np.zeros(1, dtype=np.uint8)
names = []
for i in range(count):  # shards cloned from one written store (write_store each would take minutes)
    shard = root / "shards" / f"s{i:05d}"
    shard.mkdir(parents=True)
    for name in ("tokens.bin", "offsets.bin"):
        os.link(template / name, shard / name)
    ids = [f"doc-{i}"]
    tokens, offsets = os.open(shard / "tokens.bin", os.O_RDONLY), os.open(shard / "offsets.bin", os.O_RDONLY)
    fingerprint = fingerprint_files(tokens, offsets, ids, codes)
    os.close(tokens), os.close(offsets)
    (shard / "header.json").write_text(json.dumps({**header, "ids": ids, "fingerprint": fingerprint}))
    names.append(f"shards/{shard.name}")
manifest = {"format": "streambatch.corpus", "version": 1, "shards": names}  # written by hand: write_corpus opens each
(root / "corpus.json").write_text(json.dumps(manifest))
from streambatch.cli import main
sys.exit(main(["epoch", str(root / "corpus.json"), "-T", "4", "-B", "64", "--seed", "1", "-o", str(root / "out.jsonl")]))
"""


@pytest.mark.slow
def test_ten_thousand_shards_open_under_ulimit_1024(tmp_path: Path) -> None:
    """A store keeps no descriptor once mapped: an epoch over 10**4 shards (each opened, verified and read)
    runs under RLIMIT_NOFILE=1024."""
    done = subprocess.run(
        [sys.executable, "-c", SHARDS, str(tmp_path), "10000"], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 10000 * 4 // 64  # 4 windows of T=4 per 8-token document, in batches of 64
    assert {"epoch", "index", "rows"} <= set(json.loads(lines[0]))


def test_a_mapped_store_keeps_no_descriptor(tmp_path: Path) -> None:
    """Opening a store leaves no descriptor open, and its tokens stay readable (and pickle by name)."""
    import pickle

    small_store(tmp_path / "s")
    before = len(os.listdir("/proc/self/fd"))
    stores = [sb.open_store(tmp_path / "s") for _ in range(50)]
    assert len(os.listdir("/proc/self/fd")) == before
    assert stores[0].tokens.tolist() == list(range(10)) + list(range(5))
    again_view = stores[0].tokens[3:]  # a view keeps the mapping alive
    assert again_view.tolist()[:2] == [3, 4]
    assert not stores[0].tokens.flags.writeable
    copies = [pickle.loads(pickle.dumps(store)) for store in stores]  # as a spawned DataLoader worker gets them
    assert len(os.listdir("/proc/self/fd")) == before
    assert copies[-1].tokens.tolist() == stores[-1].tokens.tolist()
    assert copies[-1].tokens.filename == stores[-1].tokens.filename
    mapped = str(tmp_path / "s" / "tokens.bin")
    assert sum(mapped in line for line in Path("/proc/self/maps").read_text().splitlines()) >= 100
    del stores, copies
    gc.collect()
    assert again_view.tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]  # its mapping outlives the stores
    del again_view
    gc.collect()
    assert not any(mapped in line for line in Path("/proc/self/maps").read_text().splitlines())  # unmapped once unused


# --- write failures name the path ----------------------------------------------------------------

LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from streambatch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _limited(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LIMITED, *argv], capture_output=True, text=True, env=ENV, timeout=120, cwd=tmp_path
    )


@pytest.fixture
def big_store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    sb.write_store(path, [sb.Document(f"d{i}", "train", range(300)) for i in range(40)])
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["epoch", "store", "-T", "8", "-B", "4", "--seed", "1", "-o", "out.jsonl"],
        ["epoch", "store", "-T", "8", "-B", "4", "--seed", "1", "-o", "out.jsonl", "--save-state", "state.json"],
        ["prepare", "big.txt", "-o", "prepared"],
    ],
    ids=["epoch", "epoch-save-state", "prepare"],
)
def test_file_too_large_names_the_path(tmp_path: Path, big_store: Path, argv: list[str]) -> None:
    """RLIMIT_FSIZE: 'File too large' on one line naming the output, exit 2, nothing left behind."""
    (tmp_path / "big.txt").write_text("hello " * 5000)
    done = _limited(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "File too large" in done.stderr
    assert argv[argv.index("-o") + 1] in done.stderr
    assert not (tmp_path / "prepared").exists()
    assert not list(tmp_path.glob(".*partial*")) + list(tmp_path.glob(".streambatch-*"))


def test_no_space_names_the_path(big_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/full: 'No space left on device' naming it (API and CLI)."""
    with (
        pytest.raises(ConfigError, match=r"output '/dev/full': cannot write \(No space left on device\)"),
        atomic_text("/dev/full") as handle,
    ):
        handle.write("x" * 100_000)
    assert 2 == main(["epoch", str(big_store), "-T", "8", "-B", "4", "--seed", "1", "-o", "/dev/full"])
    assert "output '/dev/full': cannot write (No space left on device)" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="needs os.eventfd (Linux)")
def test_invalid_argument_names_the_path(tmp_path: Path, big_store: Path) -> None:
    """A write the target refuses with EINVAL (an eventfd takes only 8-byte writes): one line naming it."""
    fd = os.eventfd(0)
    argv = ["epoch", str(big_store), "-T", "8", "-B", "4", "--seed", "1", "-o", f"/dev/fd/{fd}"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "streambatch", *argv], capture_output=True, text=True, env=ENV, timeout=60, pass_fds=(fd,)
        )
    finally:
        os.close(fd)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert f"error: output '/dev/fd/{fd}': cannot write (Invalid argument)" in done.stderr


def test_store_write_failure_names_the_store(tmp_path: Path) -> None:
    """A store write failing (RLIMIT_FSIZE, API) is a StoreError naming the store, with the OS reason."""
    code = (
        "import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\nimport streambatch as sb\n"
        f"try:\n    sb.write_store({str(tmp_path / 'big')!r}, [sb.Document('a', 'train', range(5000))])\n"
        "except sb.StreamBatchError as err:\n    print(type(err).__name__, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert "StoreError" in done.stdout
    assert "big: cannot write the store (File too large)" in done.stdout
    assert not (tmp_path / "big").exists()


# --- stale temporaries, NUL bytes ----------------------------------------------------------------


@pytest.mark.parametrize("pid", [2**31 + 5, 2**64 + 1, 10**30, "²", "١٢٣"])
def test_a_stale_temporary_whose_pid_overflows(tmp_path: Path, pid: object, capsys: pytest.CaptureFixture[str]) -> None:
    """Temporaries named with a pid beyond pid_t, or with non-ASCII digits, are kept, with no traceback (API and CLI)."""
    strange = [tmp_path / f".streambatch-{pid}-0badcafe.tmp", tmp_path / f".out.json.partial-{pid}-0badcafe"]
    for path in strange:
        path.write_text("")
    with atomic_text(tmp_path / "a.txt") as handle:
        handle.write("a\n")
    with atomic_file(tmp_path / "out.json") as raw:
        raw.write(b"{}")
    sb.write_store(tmp_path / "s", [sb.Document("a", "train", range(20))])
    assert 0 == main(["epoch", str(tmp_path / "s"), *EPOCH, "-o", str(tmp_path / "b.txt")])
    assert "Traceback" not in capsys.readouterr().err
    assert all(path.exists() for path in strange)


def test_a_nul_byte_in_a_manifest_path(tmp_path: Path) -> None:
    """A shard path holding a NUL byte (or an absolute one): a StoreError naming the manifest (API and CLI)."""
    small_store(tmp_path / "s")
    write_corpus(tmp_path / "corpus.json", [tmp_path / "s"])
    manifest = json.loads((tmp_path / "corpus.json").read_text())
    for bad in ("s\u0000x", str(tmp_path / "s")):
        manifest["shards"][0]["path"] = bad
        (tmp_path / "corpus.json").write_text(json.dumps(manifest))
        with pytest.raises(StoreError, match=r"corpus\.json: shard 0=.* is not a store path relative to the manifest"):
            open_corpus(tmp_path / "corpus.json")
        done = subprocess.run(
            [sys.executable, "-m", "streambatch", "inspect", str(tmp_path / "corpus.json")],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1
        assert "is not a store path relative to the manifest" in done.stderr
    with pytest.raises(StoreError, match="NUL byte"):
        sb.open_store("a\0b")
    with pytest.raises(ConfigError, match="NUL byte"), atomic_text("out\0.txt"):
        pass


def test_manifest_version_true_is_refused(tmp_path: Path) -> None:
    """``"version": true`` (equal to 1 in Python) is not version 1."""
    small_store(tmp_path / "s")
    write_corpus(tmp_path / "corpus.json", [tmp_path / "s"])
    manifest = json.loads((tmp_path / "corpus.json").read_text())
    (tmp_path / "corpus.json").write_text(json.dumps({**manifest, "version": True}))
    with pytest.raises(StoreError, match="version=True is not supported"):
        open_corpus(tmp_path / "corpus.json")


# --- short paths ---------------------------------------------------------------------------------


def test_short_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative to the working folder when shorter; very long paths elided in the middle, both ends kept."""
    monkeypatch.chdir(tmp_path)
    assert short_path(tmp_path / "data" / "a.jsonl") == os.path.join("data", "a.jsonl")
    assert short_path("/etc/passwd") == "/etc/passwd"  # ../../.. would be longer
    long = "/" + "/".join(f"folder{i:03d}" for i in range(40)) + "/tail.jsonl"
    shown = short_path(long)
    assert len(shown) == LONG_PATH
    assert shown.startswith("/folder000/")
    assert shown.endswith("/tail.jsonl")
    assert "..." in shown
    assert short_path("a\0b") == "a\\0b"


def test_messages_show_short_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An input error names the file relative to the working folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "zero.txt").symlink_to("/dev/zero")
    with pytest.raises(sb.DataError, match=r"^data/zero\.txt: cannot read"):
        sb.prepare_store([tmp_path / "data"], tmp_path / "out", quiet=True)


def test_tokens_round_trip_through_map_readonly(tmp_path: Path) -> None:
    """uint32 stores map as uint32; an empty store has no mapping at all."""
    store = sb.write_store(tmp_path / "wide", [sb.Document("a", "train", [1, 70_000, 3])])
    again = sb.open_store(tmp_path / "wide")
    assert again.tokens.dtype == np.uint32
    assert again.tokens.tolist() == [1, 70_000, 3] == store.tokens.tolist()
    sb.write_store(tmp_path / "empty", [])
    assert sb.open_store(tmp_path / "empty").tokens.size == 0
