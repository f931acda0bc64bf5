"""No hangs: a killed worker, a Ctrl-C during ``prepare --workers``, FIFOs and devices where files are expected.

Everything that could hang runs in a child process under a timeout: a hang
fails the test instead of blocking the suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.errors import ConfigError, DataError, StoreError
from streambatch.io.manifest import open_corpus
from streambatch.prepare import prepare_store
from streambatch.read.workers import available_cpus

from .hostile import ENV, EPOCH, REPO, small_store

TIMEOUT = 60


def _child(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=TIMEOUT, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {args}")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return _child([sys.executable, "-m", "streambatch", *argv])


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return _child([sys.executable, "-c", code], cwd=REPO)


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line naming *words*, no traceback."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr


def _texts(folder: Path, count: int, kill: int | None = None) -> Path:
    folder.mkdir()
    for i in range(count):
        (folder / f"t{i}.txt").write_text("KILL" if i == kill else f"text {i} " * 50)
    return folder


# --- a worker killed, as the out-of-memory killer does -------------------------------------------


@pytest.mark.skipif(available_cpus() < 2, reason="workers=2 is capped at one CPU here: no worker to kill")
def test_a_killed_worker_fails_the_run_naming_the_inputs_api(tmp_path: Path) -> None:
    """The tokenizer kills its worker (SIGKILL) on one file: WorkerLostError naming it (and at most the file the
    other worker was reading), no store, no hang."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(6):  # over 1 MiB each: every file is a batch of its own
        (folder / f"t{i}.txt").write_text(("KILL " if i == 1 else "") + "x" * (1 << 20))
    out = tmp_path / "out"
    done = _python(
        "import streambatch as sb, tests.hostile as h\n"
        "from streambatch.errors import WorkerLostError\n"
        "try:\n"
        f"    sb.prepare_store([{str(folder)!r}], {str(out)!r}, tokenizer=h.killing_tokenizer, workers=2, quiet=True)\n"
        "except WorkerLostError as err:\n"
        "    print('LOST', err)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "LOST a worker process died" in done.stdout
    assert "t1.txt" in done.stdout
    assert sum(f"t{i}.txt" in done.stdout for i in range(6)) <= 2
    assert not out.exists()
    assert "Traceback" not in done.stderr


def _spawned_workers(parent: int) -> list[int]:
    """The spawned pool workers among *parent*'s children."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat_line.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in command:
            found.append(int(entry))
    return found


def _sigint_as_in_a_terminal() -> None:
    """SIGINT at its default in the child: an ignored SIGINT is inherited across exec (a test runner started in
    the background, or under some CI shells, ignores it), and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_prepare(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int], Path]:
    """``prepare --workers 2`` over 96 MiB of JSONL (seconds of work, even on a fast machine), started; returns it once
    its workers exist (over 8 MiB, a loaded machine could see the workers only as the run was ending)."""
    folder = tmp_path / "in"
    folder.mkdir()
    line = b'{"tokens": [' + b"7, " * 200 + b"1]}\n"
    for i in range(4):
        (folder / f"part{i}.jsonl").write_bytes(line * ((24 << 20) // len(line)))
    out = tmp_path / "out"
    cpus_needed = ["--workers", "2"]
    process = subprocess.Popen(
        [sys.executable, "-m", "streambatch", "prepare", str(folder), "-o", str(out), *cpus_needed],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    deadline = time.monotonic() + TIMEOUT
    workers: list[int] = []
    while not workers and process.poll() is None and time.monotonic() < deadline:
        workers = _spawned_workers(process.pid)
        time.sleep(0.005)
    return process, workers, out


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("prepare hung")
    return process.returncode, err


@pytest.mark.skipif(available_cpus() < 2, reason="--workers 2 is capped at one CPU here")
def test_a_killed_worker_fails_the_run_cli(tmp_path: Path) -> None:
    """SIGKILL to a worker of ``prepare --workers 2``: exit 1, one line naming the inputs not read, no store."""
    process, workers, out = _start_prepare(tmp_path)
    assert workers, "no worker process appeared"
    os.kill(workers[0], signal.SIGKILL)
    code, err = _finish(process)
    assert code == 1, err
    assert err.count("\n") == 1, err
    assert "a worker process died" in err
    assert re.search(r"while reading \S+/part\d\.jsonl", err)  # what the workers held (killed as it started: any)
    assert not out.exists()


def test_the_pool_spawns_every_worker_at_its_first_submit() -> None:
    """No worker is spawned after the first submit: a submit racing a killed worker's teardown once printed CPython's
    ``dictionary changed size during iteration`` and a new child's traceback instead of the CLI's one line."""
    import multiprocessing

    from streambatch.read.workers import _Pool

    pool = _Pool(3, mp_context=multiprocessing.get_context("spawn"))
    try:
        assert pool.submit(abs, -4).result(timeout=TIMEOUT) == 4
        spawned = dict(pool._processes)
        assert len(spawned) == 3
        for value in range(8):
            assert pool.submit(abs, -value).result(timeout=TIMEOUT) == value
        assert pool._processes == spawned
    finally:
        pool.shutdown(wait=True)


@pytest.mark.skipif(available_cpus() < 2, reason="--workers 2 is capped at one CPU here")
def test_ctrl_c_during_prepare_workers_is_one_line(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group): exit 130 and one line, no traceback from any worker."""
    process, workers, out = _start_prepare(tmp_path)
    assert workers, "no worker process appeared"
    os.killpg(process.pid, signal.SIGINT)
    code, err = _finish(process)
    assert (code, err) == (130, "streambatch: interrupted\n")
    assert not out.exists()
    time.sleep(0.2)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# --- workers: capped, and never started from an unguarded script --------------------------------


def test_workers_are_capped_at_the_cpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """More workers than CPUs: a note on stderr, and the store is the same."""
    folder = _texts(tmp_path / "in", 3)
    store = prepare_store([folder], tmp_path / "a", workers=available_cpus() + 7)
    assert f"capped at the {available_cpus()} CPUs available" in capsys.readouterr().err
    assert store.fingerprint == prepare_store([folder], tmp_path / "b", quiet=True).fingerprint
    done = _cli("prepare", str(folder), "-o", str(tmp_path / "c"), "--workers", "999")
    assert done.returncode == 0, done.stderr
    assert "capped at the" in done.stderr


SCRIPT = """\
import streambatch as sb
from tests.hostile import killing_tokenizer

def build():
    sb.prepare_store([{folder!r}], {out!r}, tokenizer=killing_tokenizer, workers=2, quiet=True)
{call}
"""


@pytest.mark.parametrize(
    ("call", "guarded"),
    [("build()\n", False), ('if __name__ == "__main__":\n    build()\n', True)],
    ids=["no-guard", "guard"],
)
def test_a_script_without_a_main_guard_is_refused(tmp_path: Path, call: str, guarded: bool) -> None:
    """workers=2 at a script's top level without the guard: a ConfigError saying what to add (it used to hang)."""
    folder = _texts(tmp_path / "in", 2)
    script = tmp_path / "build.py"
    script.write_text(SCRIPT.format(folder=str(folder), out=str(tmp_path / "out"), call=call))
    done = _child([sys.executable, str(script)], cwd=REPO)
    if guarded:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "out").is_dir()
    else:
        assert done.returncode == 1
        assert "ConfigError: workers=2 asked for at the top level of" in done.stderr
        assert 'if __name__ == "__main__":' in done.stderr
        assert not (tmp_path / "out").exists()


# --- FIFOs and devices where a regular file is expected ------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO with no writer; a test in this process that blocks on it fails after 30 s (SIGALRM) instead of hanging."""
    path = tmp_path / "pipe"
    os.mkfifo(path)

    def hung(number: int, frame: object) -> None:
        raise TimeoutError("blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        yield path
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_fifo_manifest(tmp_path: Path) -> None:
    """A manifest that is a FIFO is refused at once (API in a child, and CLI)."""
    manifest = tmp_path / "corpus.json"
    os.mkfifo(manifest)
    done = _python(
        f"from streambatch.io.manifest import open_corpus\ntry:\n    open_corpus({str(manifest)!r})\n"
        "except Exception as err:\n    print(type(err).__name__, err)"
    )
    assert "StoreError" in done.stdout
    assert "not a regular file" in done.stdout
    _refused(_cli("inspect", str(manifest)), "corpus.json", "not a regular file")
    _refused(_cli("epoch", str(manifest), *EPOCH), "corpus.json", "not a regular file")


def test_fifo_jsonl_source(tmp_path: Path) -> None:
    """A JSONL source that is a FIFO: refused, not waited on."""
    source = tmp_path / "docs.jsonl"
    os.mkfifo(source)
    _refused(_cli("epoch", str(source), *EPOCH), "docs.jsonl", "not a regular file")
    _refused(_cli("prepare", str(source), "-o", str(tmp_path / "s")), "docs.jsonl", "not a regular file")


def test_fifo_tokenizer(tmp_path: Path, fifo: Path) -> None:
    """--tokenizer naming a FIFO: refused (API in a child, and CLI)."""
    folder = _texts(tmp_path / "in", 1)
    done = _python(
        "import streambatch as sb\ntry:\n"
        f"    sb.prepare_store([{str(folder)!r}], {str(tmp_path / 'o')!r}, tokenizer={str(fifo)!r})\n"
        "except Exception as err:\n    print(type(err).__name__, err)"
    )
    assert "ConfigError" in done.stdout
    assert "not a regular file (a FIFO)" in done.stdout
    _refused(_cli("prepare", str(folder), "-o", str(tmp_path / "s"), "--tokenizer", str(fifo)), "pipe", "not a regular file")


def test_fifo_state_files(tmp_path: Path, fifo: Path) -> None:
    """--save-state and --resume naming a FIFO: refused."""
    store = tmp_path / "store"
    small_store(store)
    out = str(tmp_path / "out.jsonl")
    _refused(_cli("epoch", str(store), *EPOCH, "-o", out, "--save-state", str(fifo)), "pipe", "not a regular file")
    _refused(_cli("epoch", str(store), *EPOCH, "-o", out, "--resume", str(fifo)), "pipe", "not a regular file")


def test_fifo_plan_file(tmp_path: Path) -> None:
    """A plan file replaced by a FIFO: refused, not waited on."""
    store = tmp_path / "store"
    sb.write_store(store, [sb.Document("a", "train", range(40))])
    plans = tmp_path / "plans"
    assert _cli("epoch", str(store), *EPOCH, "--plan-dir", str(plans)).returncode == 0
    (plan,) = plans.glob("*.plan")
    plan.unlink()
    os.mkfifo(plan)
    done = _cli("epoch", str(store), *EPOCH, "--plan-dir", str(plans))
    _refused(done, plan.name, "not a regular file")


def test_store_file_fifo(tmp_path: Path) -> None:
    """A store's tokens.bin replaced by a FIFO: a StoreError, never a wait."""
    store = tmp_path / "store"
    small_store(store)
    (store / "tokens.bin").unlink()
    os.mkfifo(store / "tokens.bin")
    done = _python(
        f"from streambatch.io.store import open_store\ntry:\n    open_store({str(store)!r})\n"
        "except Exception as err:\n    print(type(err).__name__, err)"
    )
    assert "StoreError" in done.stdout
    assert "tokens.bin: not a regular file" in done.stdout


def test_folder_entry_linking_to_dev_zero(tmp_path: Path) -> None:
    """A folder entry that links to /dev/zero is refused (or skipped with --skip-bad), never read forever."""
    folder = _texts(tmp_path / "in", 2)
    (folder / "zero.txt").symlink_to("/dev/zero")
    done = _python(
        "import streambatch as sb\ntry:\n"
        f"    sb.prepare_store([{str(folder)!r}], {str(tmp_path / 'o')!r}, quiet=True)\n"
        "except Exception as err:\n    print(type(err).__name__, err)"
    )
    assert "DataError" in done.stdout
    assert "zero.txt: cannot read (not a regular file (a character device))" in done.stdout
    _refused(_cli("prepare", str(folder), "-o", str(tmp_path / "s")), "zero.txt", "not a regular file")
    done = _cli("prepare", str(folder), "-o", str(tmp_path / "s"), "--skip-bad")
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr
    assert "zero.txt" in done.stderr
    assert len(sb.open_store(tmp_path / "s")) == 2
    _refused(_cli("prepare", "/dev/zero", "-o", str(tmp_path / "z")), "/dev/zero", "not a regular file or a folder")


def test_in_process_fifo_refusals(tmp_path: Path, fifo: Path) -> None:
    """The same refusals in this process (each returns at once: open non-blocking, then fstat)."""
    with pytest.raises(StoreError, match="not a regular file"):
        open_corpus(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        list(sb.iter_jsonl(fifo))
    with pytest.raises(ConfigError, match="not a regular file"):
        prepare_store([_texts(tmp_path / "in", 1)], tmp_path / "o", tokenizer=str(fifo))


@pytest.mark.parametrize("name", ["a.npy", "b.bin", "c.parquet", "d.arrow", "e.jsonl", "f.txt", "g.jsonl.gz", "h.txt.zst"])
def test_a_fifo_in_a_folder_of_any_format(tmp_path: Path, name: str) -> None:
    """A FIFO among a folder's files, whatever its suffix: refused naming it, or skipped with --skip-bad (CLI, in a child)."""
    folder = _texts(tmp_path / "in", 1)
    os.mkfifo(folder / name)
    out = str(tmp_path / "s")
    _refused(_cli("prepare", str(folder), "-o", out, "--bin-separator", "0"), name, "not a regular file (a FIFO)")
    done = _cli("prepare", str(folder), "-o", out, "--bin-separator", "0", "--skip-bad")
    assert done.returncode == 0, done.stderr
    assert f"skipped {folder / name}: cannot read (not a regular file (a FIFO))" in done.stderr
    assert len(sb.open_store(out)) == 1


def test_direct_readers_refuse_a_fifo(fifo: Path) -> None:
    """iter_npy, iter_bin, iter_parquet, iter_arrow, iter_text given a FIFO: a DataError at once."""
    from streambatch.read.formats import iter_arrow, iter_bin, iter_npy, iter_parquet, iter_text

    for read in (iter_npy, lambda p: iter_bin(p, separator=0), iter_parquet, iter_arrow):
        with pytest.raises(DataError, match="not a regular file"):
            list(read(fifo))
    with pytest.raises(DataError, match="is not a regular file or a folder"):
        list(iter_text(fifo))


def test_an_offsets_file_that_is_a_fifo(tmp_path: Path) -> None:
    """``X.offsets.npy`` beside ``X.npy`` being a FIFO: refused naming it, never waited on."""
    import numpy as np

    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.uint16))
    os.mkfifo(tmp_path / "x.offsets.npy")
    _refused(_cli("prepare", str(tmp_path / "x.npy"), "-o", str(tmp_path / "s")), "x.offsets.npy", "not a regular file")


def test_a_tokenizer_workers_cannot_import_is_refused(tmp_path: Path) -> None:
    """A tokenizer defined under ``python -c``: a ConfigError before any worker starts (it used to fail in each)."""
    folder = _texts(tmp_path / "in", 2)
    done = _python(
        "import streambatch as sb\ndef tok(text):\n    return list(text.encode())\ntry:\n"
        f"    sb.prepare_store([{str(folder)!r}], {str(tmp_path / 'o')!r}, tokenizer=tok, workers=2)\n"
        "except sb.StreamBatchError as err:\n    print(type(err).__name__, err)\n"
    )
    assert "ConfigError workers=2: the tokenizer is defined in `python -c`" in done.stdout
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()
