"""Issue 18, items 2, 3, 5 and 6 for plan files: tampered plans, read-only folders, memory limits, waits, `created`.

A tampered plan (an entry copied over another, one pointing two tokens before a
document's end, one in a document of another partition) is refused through the
API and the CLI: every entry is checked where a batch uses it, and
``verify=True`` / ``--verify`` / ``audit --plan-dir`` read the plan once to check
its digest, every entry and that no window repeats.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given

import streambatch as sb
import streambatch.io.atomic as atomic
import streambatch.items.windows.windows as windowing
import streambatch.order.plan as planning
from streambatch.cli import main
from streambatch.errors import DataError, StoreError
from streambatch.io.files import short_path
from streambatch.io.store import StoreWriter, write_store
from streambatch.order.plan import build_plan, plan_path
from streambatch.order.splitmix import derive_seed
from tests import keyed
from tests.hostile import ENV
from tests.strategies import configs, documents

T, B, SEED = 2, 4, 7


def _docs() -> list[sb.Document]:
    """Train documents of 5..16 tokens with test documents between them (other partition)."""
    docs = []
    for i in range(12):
        docs.append(sb.Document(f"train-{i}", "train", (np.arange(i + 5) + i) % 97))
        if i % 3 == 0:
            docs.append(sb.Document(f"test-{i}", "test", np.arange(7) + 50))
    return docs


def _store(tmp_path: Path) -> Path:
    write_store(tmp_path / "store", _docs())
    return tmp_path / "store"


def _windows(path: Path) -> sb.Windows:
    return sb.windows(sb.open_store(path), context_length=T, keep_partition=True)


def _body(path: Path) -> np.memmap[Any, Any]:
    return keyed.body(path, "plan")


def _tamper(plan: Path, store: Path, how: str, redigest: bool = False) -> None:
    """Damage one entry of *plan* the way *how* says; with *redigest* the block digests match the new body."""
    opened = sb.open_store(store)
    body = _body(plan)
    if how == "duplicate":
        body[1] = body[0]
    elif how == "crossing":  # a start two tokens before a train document's end: T + 1 = 3 tokens cross into the next
        doc = opened.ids.index("train-4")
        body[0] = int(opened.starts[doc]) + int(opened.lengths[doc]) - 2
    elif how == "partition":
        body[0] = int(opened.starts[opened.ids.index("test-3")])
    elif how == "beyond":
        body[0] = 10**9
    body.flush()
    del body
    if redigest:
        keyed.redigest(plan)


def _planned(tmp_path: Path) -> tuple[Path, Path, Path]:
    store = _store(tmp_path)
    plans = tmp_path / "plans"
    plan = Path(str(sb.plan_file(_windows(store), SEED, plans).plan_path))
    return store, plans, plan


@given(documents(), documents("test"), configs)
def test_entry_windows_accepts_exactly_the_window_starts(train: list[sb.Document], test: list[sb.Document], config: Any) -> None:
    """Every position of the store: the window number where a train window starts there, -1 everywhere else."""
    docs = [d for pair in zip(train, test, strict=False) for d in pair] + train[len(test) :] + test[len(train) :]
    docs = [sb.Document(f"x{i}", d.partition, d.tokens) for i, d in enumerate(docs)]
    windows = sb.windows(docs, context_length=config["context_length"], stride=config["stride"], keep_partition=True)
    index = windows.window_index
    starts = index.all_positions()
    every = np.arange(-2, windows.store.flat_size + 3)
    expected = np.full(every.size, -1)
    expected[starts + 2] = np.arange(starts.size)
    assert expected.tolist() == index.entry_windows(every).tolist()
    numbers = np.arange(-2, index.window_count + 2)
    assert np.where(numbers < index.window_count, numbers, -1).clip(-1).tolist() == index.entry_windows(numbers, False).tolist()


ATTACKS = ["duplicate", "crossing", "partition", "beyond"]
USE_MESSAGE = r"entry \d+ \(\d+\) is not a window of partition 'train' at T=2, stride 1 of this source; the plan is damaged"


@pytest.mark.parametrize("how", ["crossing", "partition", "beyond"])
def test_a_tampered_entry_is_refused_where_it_is_used(tmp_path: Path, how: str) -> None:
    """API: the batch holding the damaged entry raises DataError naming the plan; no row crossing documents comes out.

    The digests are forged to match: the entry check where it is used is what refuses it.
    """
    store, plans, plan = _planned(tmp_path)
    _tamper(plan, store, how, redigest=True)
    epoch = sb.Epoch(sb.open_store(store), context_length=T, batch_size=B, seed=SEED, keep_partition=True, plan_dir=plans)
    with pytest.raises(DataError, match=re.escape(str(plan)) + ": " + USE_MESSAGE):
        epoch[0]
    with pytest.raises(DataError, match=USE_MESSAGE):
        list(epoch)
    assert epoch[1].width == B  # the batches without the entry are unaffected
    with pytest.raises(DataError, match=USE_MESSAGE):
        epoch.order.numbers()


@pytest.mark.parametrize("redigest", [False, True], ids=["digest-stale", "digest-forged"])
@pytest.mark.parametrize("how", ATTACKS)
def test_verify_refuses_every_tampered_plan(tmp_path: Path, how: str, redigest: bool) -> None:
    """API: verify=True reads the plan once and refuses the damage (the digest, or the entry/repeat check behind it)."""
    store, plans, plan = _planned(tmp_path)
    _tamper(plan, store, how, redigest)
    expected = {
        "duplicate": r"1 entries repeat other windows \(window \d+ never comes\)",
        "crossing": r"entry 0 \(\d+\) is not a window of this source and partition",
        "partition": r"entry 0 \(\d+\) is not a window of this source and partition",
        "beyond": r"entry 0 \(1000000000\) is not a window of this source and partition",
    }[how]
    if not redigest:  # the block's digest refuses it first
        expected = r"block 0 of its plan \(entries 0\.\.\d+\) does not match its digest"
    with pytest.raises(StoreError, match=re.escape(str(plan)) + ": .*(" + expected + ")"):
        sb.plan_file(_windows(store), SEED, plans, verify=True)
    with pytest.raises(StoreError, match=expected):
        list(
            sb.Epoch(
                sb.open_store(store),
                context_length=T,
                batch_size=B,
                seed=SEED,
                keep_partition=True,
                plan_dir=plans,
                verify_plan=True,
            )
        )
    with pytest.raises(StoreError, match=expected):
        next(
            iter(
                sb.Run(
                    sb.open_store(store),
                    context_length=T,
                    batch_size=B,
                    seed=SEED,
                    keep_partition=True,
                    plan_dir=plans,
                    verify_plan=True,
                )
            )
        )


def test_a_digest_mismatch_alone_is_refused(tmp_path: Path) -> None:
    """Two entries swapped: still a permutation of valid windows, so only the digest can tell; verify refuses it."""
    store, plans, plan = _planned(tmp_path)
    body = _body(plan)
    body[0], body[1] = int(body[1]), int(body[0])
    body.flush()
    del body
    with pytest.raises(StoreError, match=r"block 0 of its plan .* does not match its digest: the file is damaged or was edited"):
        sb.plan_file(_windows(store), SEED, plans, verify=True)


def test_an_intact_plan_verifies(tmp_path: Path) -> None:
    """The control: verify=True on the plan as written gives the shuffle's order; window-number plans verify too."""
    store, plans, _ = _planned(tmp_path)
    assert list(sb.shuffle(_windows(store), SEED)) == list(sb.plan_file(_windows(store), SEED, plans, verify=True))


def test_window_number_plans_are_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan of window numbers (sources of 2**32+ tokens): an entry past the last window is refused at use and on verify."""
    store = _store(tmp_path)
    monkeypatch.setattr(windowing, "POSITION_LIMIT", 10)
    order = sb.plan_file(_windows(store), SEED, tmp_path / "plans", verify=True)
    assert not order.space.plan_holds_positions
    assert list(sb.shuffle(_windows(store), SEED)) == list(order)
    plan = Path(str(order.plan_path))
    body = _body(plan)
    body[2] = len(order)
    body.flush()
    del body, order
    keyed.redigest(plan)  # forged digests: the entry check refuses it
    with pytest.raises(DataError, match=r"entry 2 \(\d+\) is not a window"):
        sb.Epoch(
            sb.open_store(store), context_length=T, batch_size=B, seed=SEED, keep_partition=True, plan_dir=tmp_path / "plans"
        )[0]
    with pytest.raises(StoreError, match=r"entry 2 \(\d+\) is not a window of this source"):
        sb.plan_file(_windows(store), SEED, tmp_path / "plans", verify=True)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize("how", ATTACKS)
def test_cli_refuses_a_tampered_plan(tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    """CLI: `epoch --plan-dir` refuses a bad entry; `epoch/plan --verify` and `audit --plan-dir` refuse any damage."""
    store, plans, plan = _planned(tmp_path)
    _tamper(plan, store, how, redigest=True)
    common = [str(store), "-T", str(T), "-B", str(B), "--seed", str(SEED), "--keep-partition"]
    out = tmp_path / "out.jsonl"
    verified = (
        ["epoch", *common, "--plan-dir", str(plans), "--verify", "-o", str(out)],
        ["plan", *common, "-o", str(plans), "--verify"],
        ["audit", *common, "--plan-dir", str(plans), "-q"],
    )
    assert plan == plan_path(_windows(store), derive_seed(SEED, 0), plans)  # epoch 0 of run 7: `plan` and `epoch` name it
    for argv in verified:
        status, text, err = _cli(argv, capsys)
        assert (2, "") == (status, text), (argv, err, text)
        assert 1 == len(err.splitlines()), err
        assert "not a window of this source" in err or "repeat other windows" in err
    assert not out.exists()
    if how != "duplicate":  # without --verify the entry is refused when its batch is written
        status, text, err = _cli(["epoch", *common, "--plan-dir", str(plans), "-o", str(out)], capsys)
        assert (2, "") == (status, text)
        assert re.search(USE_MESSAGE, err), err
        assert not out.exists()


def test_a_read_only_plan_dir_is_a_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan folder that cannot be written: StoreError (CLI exit 2, one line) naming it; an existing plan still maps."""
    store = _store(tmp_path)
    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.open

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(planning.os, "open", read_only)  # as a read-only folder behaves, even for root
    message = r"plan_dir='.*ro': cannot write the plan there \(Permission denied\); pass a writable folder"
    with pytest.raises(StoreError, match=message):
        sb.plan_file(_windows(store), SEED, folder)
    with pytest.raises(StoreError, match=message):
        list(sb.Epoch(sb.open_store(store), context_length=T, batch_size=B, seed=SEED, keep_partition=True, plan_dir=folder))
    status, text, err = _cli(
        ["epoch", str(store), "-T", "2", "-B", "4", "--seed", "7", "--keep-partition", "--plan-dir", str(folder)], capsys
    )
    assert (2, "", 1) == (status, text, len(err.splitlines()))
    assert re.search(message, err), err
    assert [] == list(folder.iterdir())
    monkeypatch.setattr(planning.os, "open", real)
    sb.plan_file(_windows(store), SEED, folder)  # planned where it can be written ...
    monkeypatch.setattr(planning.os, "open", read_only)
    assert list(sb.shuffle(_windows(store), SEED)) == list(sb.plan_file(_windows(store), SEED, folder))  # ... then mapped


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_really_read_only_plan_dir(tmp_path: Path) -> None:
    """The same with a folder of mode 0o500."""
    store = _store(tmp_path)
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="cannot write the plan there"):
            sb.plan_file(_windows(store), SEED, folder)
    finally:
        folder.chmod(0o700)


def test_a_plan_larger_than_memory_is_permuted_in_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No anonymous memory for the plan (MemoryError): it is filled and permuted in the file's pages, same order."""
    store = _store(tmp_path)

    def no_memory(count: int, dtype: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(planning, "_scratch", no_memory)
    order = sb.plan_file(_windows(store), SEED, tmp_path / "plans", verify=True)
    assert list(sb.shuffle(_windows(store), SEED)) == list(order)
    assert order.shuffle_state_after == sb.shuffle(_windows(store), SEED).shuffle_state_after


_LIMITED = """
import json, os, resource, sys
import numpy as np
import streambatch as sb
from streambatch.errors import StreamBatchError
from streambatch.model.store import DocumentStore
count = 48 << 20  # windows at T=1: a 192 MiB plan over 96 MiB of uint16 tokens
store = DocumentStore.from_arrays(np.zeros(count + 1, dtype=np.uint16), [0, count + 1])
windows = sb.windows(store, context_length=1)
with open("/proc/self/status") as handle:
    size = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (96 << 20), size + (96 << 20)))
try:
    sb.plan_file(windows, 7, sys.argv[1])
except StreamBatchError as err:
    print(json.dumps({"error": type(err).__name__, "message": str(err)}))
"""


@pytest.mark.slow
def test_a_plan_beyond_the_address_space_limit_is_refused_cleanly(tmp_path: Path) -> None:
    """Under `ulimit -v` too small for the plan: StoreError naming the plan and the limit, no MemoryError traceback."""
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED, str(tmp_path / "plans")], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert 0 == done.returncode, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert "StoreError" == result["error"]
    assert re.search(r"\.plan: a plan of 50331648 windows needs 201326592 bytes .* raise the memory limit", result["message"])
    assert [] == [p.name for p in (tmp_path / "plans").iterdir() if not p.name.endswith(".lock")]


def test_a_waiting_planner_says_so_and_names_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan's lock held by another: after WAIT_NOTE_SECONDS one stderr line names the lock and the holder's pid."""
    import fcntl

    store = _store(tmp_path)
    plans = tmp_path / "plans"
    plans.mkdir()
    lock = plan_path(_windows(store), SEED, plans).with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"424242\n")
    monkeypatch.setattr(atomic, "WAIT_NOTE_SECONDS", 0.1)
    threading.Timer(0.6, os.close, (fd,)).start()
    started = time.monotonic()
    order, created = build_plan(_windows(store), SEED, plans)
    assert time.monotonic() - started >= 0.5
    assert created
    err = capsys.readouterr().err
    assert 1 == len(err.splitlines())
    assert f"waiting for the plan lock {short_path(lock)}: pid 424242 is computing this plan" in err
    assert f"{os.getpid()}\n" == lock.read_text()  # the lock now names its last holder
    assert list(sb.shuffle(_windows(store), SEED)) == list(order)
    capsys.readouterr()
    build_plan(_windows(store), SEED, plans)  # no wait, no note
    assert "" == capsys.readouterr().err


@pytest.mark.slow
def test_only_the_planner_that_built_the_plan_says_created(tmp_path: Path) -> None:
    """Four `streambatch plan` processes at once: exactly one reports "created": true, all name the same plan."""
    store = _store(tmp_path)
    argv = [
        sys.executable,
        "-m",
        "streambatch",
        "plan",
        str(store),
        "-T",
        "2",
        "-B",
        "4",
        "--seed",
        "7",
        "--keep-partition",
        "-o",
        str(tmp_path / "p"),
    ]
    children = [subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [child.communicate(timeout=120) for child in children]
    assert [0] * 4 == [child.returncode for child in children], results
    summaries = [json.loads(out) for out, _ in results]
    assert 1 == sum(s["created"] for s in summaries)
    assert 1 == len({s["plan"] for s in summaries})


_FIFO_PLAN = """
import os, sys
import streambatch as sb
from streambatch.errors import StoreError
from streambatch.order.plan import plan_path
windows = sb.windows([sb.Document("a", "train", list(range(10)))], context_length=2)
os.mkfifo(plan_path(windows, 7, sys.argv[1]))
try:
    sb.plan_file(windows, 7, sys.argv[1])
except StoreError as err:
    print(err)
"""


def test_a_fifo_where_the_plan_file_belongs_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A named pipe at the plan's path: StoreError ("not a regular file") at once, under a timeout in a subprocess."""
    done = subprocess.run([sys.executable, "-c", _FIFO_PLAN, str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=60)
    assert 0 == done.returncode, done.stderr
    assert re.search(r"\.plan: not a regular file; remove .*\.plan and plan again", done.stdout), done.stdout


def test_a_corpus_plan_entry_across_a_shard_boundary_is_refused(tmp_path: Path) -> None:
    """A sharded corpus (global positions): an entry two tokens before a shard's end is refused, not read across shards."""
    write_store(tmp_path / "a", [sb.Document("a0", "train", np.arange(9)), sb.Document("a1", "train", np.arange(6))])
    write_store(tmp_path / "b", [sb.Document("b0", "train", np.arange(8) + 100)])
    corpus = sb.write_corpus(tmp_path / "corpus.json", [tmp_path / "a", tmp_path / "b"])
    epoch = sb.Epoch(corpus, context_length=T, batch_size=B, seed=SEED, plan_dir=tmp_path / "plans")
    assert list(sb.Epoch(corpus, context_length=T, batch_size=B, seed=SEED)) == list(epoch)
    plan = Path(str(epoch.order.plan_path))
    body = _body(plan)
    body[0] = int(corpus.bases[1]) - 2  # the last shard's first token is one of its targets
    body.flush()
    del body, epoch
    keyed.redigest(plan)  # forged digests: the entry check refuses it
    again = sb.Epoch(
        sb.open_corpus(tmp_path / "corpus.json"), context_length=T, batch_size=B, seed=SEED, plan_dir=tmp_path / "plans"
    )
    with pytest.raises(DataError, match=USE_MESSAGE):
        again[0]
    with pytest.raises(StoreError, match=r"entry 0 \(13\) is not a window of this source"):
        sb.plan_file(
            sb.windows(sb.open_corpus(tmp_path / "corpus.json"), context_length=T), SEED, tmp_path / "plans", verify=True
        )


# -- issue 25 item 3: what does not fit is a StoreError stating the bytes, never a MemoryError traceback --------------

_UNDER_LIMIT = """
import resource, sys
import numpy as np
import streambatch as sb
from streambatch.cli import main
from streambatch.errors import StreamBatchError
with open("/proc/self/status") as handle:
    size = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmSize:"))
extra = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))
if sys.argv[2] == "api":
    try:
        sb.Epoch(sb.open_source(sys.argv[3], verify=False), context_length=1, batch_size=4, seed=7)[0]
    except StreamBatchError as err:
        print(type(err).__name__ + ": " + str(err))
else:
    sys.exit(main(sys.argv[3:]))
"""


def _under_limit(extra_mb: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(extra_mb), *argv], env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One document of 48 Mi tokens: a 192 MiB plan at T=1, over 96 MiB of tokens (mapped, not counted as memory)."""
    path = tmp_path_factory.mktemp("big") / "store"
    with StoreWriter(path, dtype=np.uint16) as writer:
        writer.add("d0", "train", np.zeros(48 << 20, dtype=np.uint16))
        writer.commit()
    return path


@pytest.mark.slow
def test_a_plan_beyond_the_address_space_is_a_store_error_stating_the_bytes(big_store: Path) -> None:
    """API and CLI: the in-memory shuffle of a plan that cannot be allocated says how many bytes it needs."""
    done = _under_limit(150, "api", str(big_store))
    assert (0, "") == (done.returncode, done.stderr), done.stderr
    assert re.fullmatch(r"StoreError: shuffle: a plan of 50331647 windows needs 201326588 bytes of memory .*\n", done.stdout)
    out = big_store.parent / "out.jsonl"
    done = _under_limit(150, "cli", "epoch", str(big_store), "-T", "1", "-B", "4", "--seed", "7", "--no-verify", "-o", str(out))
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert "needs 201326588 bytes of memory" in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_an_audit_beyond_the_address_space_is_one_line_stating_the_bytes(big_store: Path) -> None:
    done = _under_limit(120, "cli", "audit", str(big_store), "-T", "1", "-B", "1024", "--seed", "7", "--no-verify", "-q")
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert "Traceback" not in done.stderr
    assert re.search(r"needs? (about )?\d+ bytes of memory", done.stderr), done.stderr


def test_a_manifest_of_100000_shards_is_refused_with_the_limit(tmp_path: Path) -> None:
    """Under an address-space limit: a StoreError naming the manifest and the limit, at once (no shard opened)."""
    write_store(tmp_path / "s", [sb.Document("a", "train", [1, 2, 3])])
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"format": "streambatch.corpus", "version": 1, "shards": ["s"] * 100_000}))
    started = time.monotonic()
    done = _under_limit(64, "cli", "inspect", str(manifest))
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert re.search(r"corpus\.json: 100000 shards, more than the \d+ one process can map at once", done.stderr)
    assert time.monotonic() - started < 60
    with pytest.raises(StoreError, match=r"100000 shards, more than the \d+ .* merge shards into fewer, larger stores"):
        sb.open_corpus(manifest)


def test_a_small_json_file_is_read_without_allocating_the_limit(tmp_path: Path) -> None:
    """The bounded reader allocates what the file holds: a manifest and its stores' headers (limit 64 MiB) in 32 MiB."""
    for k in range(3):
        write_store(tmp_path / f"s{k}", [sb.Document(f"d{k}", "train", [1, 2, 3])])
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"format": "streambatch.corpus", "version": 1, "shards": ["s0", "s1", "s2"]}))
    done = _under_limit(32, "cli", "inspect", str(manifest))
    assert (0, "") == (done.returncode, done.stderr), done.stderr
